"""tools/experiments: a preset becomes a grid of bundle runs; a grid already run is skipped."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from experiments.grid import build_grid  # noqa: E402
from experiments.runner import run_dir, run_grid  # noqa: E402
from experiments.vocabulary import ACDC_ROWS, ExperimentError  # noqa: E402


def test_the_paper_grid_has_every_row_cell_seed_and_lr_after_its_pre_trainings():
    grid = build_grid("acdc_paper", "/data", "/work")
    pre = [r for r in grid if r.kind == "pretrain"]
    seg = [r for r in grid if r.kind != "pretrain"]
    assert [r.name for r in pre] == ["pre_iic_dec", "pre_contrast_enc", "pre_ours_mi_cc", "pre_full"]
    assert grid[:4] == pre  # pre-trainings first
    assert len(seg) == len(ACDC_ROWS) * 3 * 3 * 3 * 3  # rows x tasks x counts x seeds x LRs
    mt = next(r for r in seg if r.name == "mt_pre_full_rv_n2_s1_lr5e-4")
    assert mt.kind == "meanteacher" and mt.depends == ("pre_full",)
    assert mt.meta == {"method": "MT + Ours", "init": "pre_full", "task": "rv", "labelled_scans": 2, "seed": 1,
                       "lr": 5e-4, "paper_lr": 2e-5, "preset": "acdc_paper"}
    train = mt.commands[0]
    assert train[1:5] == ("-m", "monai.bundle", "run", "--config_file")
    assert train[train.index("--pretrained") + 1] == str(Path("/work/runs/pre_full/model.pt").resolve())


def test_select_narrows_and_keeps_the_pre_trainings_the_runs_need():
    grid = build_grid("acdc_paper", "/data", "/work",
                      select={"methods": "Baseline,Contrast (Enc) + Ours (Dec)", "tasks": "lv", "seeds": 0,
                              "lrs": [1e-4], "counts": "1,4"})
    assert [r.name for r in grid] == ["pre_full", "ft_random_lv_n1_s0_lr1e-4", "ft_random_lv_n4_s0_lr1e-4",
                                      "ft_pre_full_lv_n1_s0_lr1e-4", "ft_pre_full_lv_n4_s0_lr1e-4"]
    only = build_grid("acdc_paper", "/data", "/work", select={"only": "ft_pre_full_myo_n2_s2_*"})
    assert [r.name for r in only] == ["pre_full"] + [f"ft_pre_full_myo_n2_s2_lr{x}" for x in ("2e-5", "1e-4", "5e-4")]


def test_a_tag_names_its_runs_and_rows_and_records_its_overrides():
    grid = build_grid("smoke", "/data", "/work", select={"methods": "Baseline"}, tag="adam",
                      overrides={"optimizer#_target_": "torch.optim.Adam", "compile_mode": "null"})
    (run,) = grid
    assert run.name == "ft_random_lv_n1_s0_lr1e-3_adam" and run.meta["method"] == "Baseline [adam]"
    assert json.loads(run.meta["overrides"]) == {"compile_mode": None, "optimizer#_target_": "torch.optim.Adam"}
    args = run.commands[0]
    assert args[args.index("--compile_mode") + 1] == "None"
    with pytest.raises(ExperimentError, match="--tag"):
        build_grid("smoke", "/data", "/work", overrides={"epochs": 2})


def test_the_ablation_grid_pre_trains_each_value_once_and_the_shared_point_once():
    grid = build_grid("acdc_ablation_fast", "/data", "/work")
    pre = [r.name for r in grid if r.kind == "pretrain"]
    assert len(pre) == 5 + 4 + 5 - 2  # alpha, lambda_CC and K values; the default point shared by the three
    assert "pre_full_alpha0.5" in pre and "pre_full_lambda_cc1" not in pre and "pre_full_num_clusters40" not in pre
    assert {r.meta["ablation"] for r in grid if r.kind == "finetune"} == {"alpha", "lambda_cc", "num_clusters"}


def test_the_paper_length_ablation_varies_the_papers_row_at_its_lengths_and_chosen_lr():
    """``acdc_ablation_paper``: the paper's ablation tables are of Ours (Dec) MI+CC; LV / RV / Myo at 1 scan, the
    paper's 50 x 200 iterations for both stages, LR 1e-4 only."""
    grid = build_grid("acdc_ablation_paper", "/data", "/work", select={"pretrain_per_seed": True,
                                                                       "only": "*lambda_cc*,*alpha0.5_*"})
    pre = [r for r in grid if r.kind == "pretrain"]
    assert sorted(r.name for r in pre) == sorted(f"pre_ours_mi_cc_{p}_ps{s}" for s in range(3)
                                                 for p in ("alpha0.5", "lambda_cc0", "lambda_cc0.1", "lambda_cc4"))
    args = pre[0].commands[0]
    assert "bundles/pretrain_bim/configs/variants/ours_mi_cc.json" in " ".join(args)
    assert args[args.index("--epochs") + 1] == "50" and args[args.index("--iters_per_epoch") + 1] == "200"
    ft = [r for r in grid if r.kind == "finetune"]
    assert len(ft) == 4 * 3 * 3  # values x tasks x seeds, one LR
    assert {(r.meta["task"], r.meta["labelled_scans"], r.meta["lr"]) for r in ft} == \
        {(t, 1, 1e-4) for t in ("lv", "rv", "myo")}
    assert build_grid("acdc_ablation_paper", "/data", "/work", select={"methods": "Contrast (Enc) + Ours (Dec)",
                                                                       "only": "pre_*"})[0].name == "pre_full_alpha0"


def test_the_leave_one_out_grid_sets_back_one_group_of_the_authors_options_per_pre_training(monkeypatch):
    """``acdc_authors_loo``: beside the defaults' own Ours (Dec) MI+CC, one pre-training per group of the authors'
    options, that group (and nothing else) at its value in configs/earlier_defaults.json; its fine-tunes are a row
    ``[without GROUP]`` of their own."""
    import experiments.grid as grid_module
    from experiments.vocabulary import AUTHORS_OPTION_GROUPS

    earlier = json.loads((ROOT / "bundles/pretrain_bim/configs/earlier_defaults.json").read_text())
    grid = build_grid("acdc_authors_loo", "/data", "/work", select={"pretrain_per_seed": True})
    pre = {r.name: r for r in grid if r.kind == "pretrain"}
    assert set(pre) == {f"pre_ours_mi_cc{g}_ps{s}" for s in range(3)
                        for g in [""] + [f"_without_{g}" for g in AUTHORS_OPTION_GROUPS]}
    reference_args = pre["pre_ours_mi_cc_ps1"].commands[0]
    for group, keys in AUTHORS_OPTION_GROUPS.items():
        run = pre[f"pre_ours_mi_cc_without_{group}_ps1"]
        args = run.commands[0]
        extra = [a for a in args if a.startswith("--") and a not in reference_args]
        assert sorted(extra) == sorted(f"--{k}" for k in keys)
        for k in keys:
            assert args[args.index(f"--{k}") + 1] == (earlier[k] if isinstance(earlier[k], str) else repr(earlier[k]))
        assert run.meta["tag"] == f"without {group}" and not run.meta["ablation"]
    ft = [r for r in grid if r.kind == "finetune"]
    assert len(ft) == (1 + len(AUTHORS_OPTION_GROUPS)) * 3 * 3  # rows x tasks x seeds, LR 1e-4 at 1 scan
    views = next(r for r in ft if r.name == "ft_pre_ours_mi_cc_without_views_ps2_myo_n1_s2_lr1e-4")
    assert views.meta["method"] == "Ours (Dec) MI+CC [without views]"
    assert views.depends == ("pre_ours_mi_cc_without_views_ps2",)
    tagged = build_grid("acdc_authors_loo", "/data", "/work", tag="k", overrides={"batch_size": 4})
    assert {r.meta["method"] for r in tagged if r.kind == "finetune"} == \
        {"Ours (Dec) MI+CC [k]"} | {f"Ours (Dec) MI+CC [k, without {g}]" for g in AUTHORS_OPTION_GROUPS}
    monkeypatch.setitem(grid_module.AUTHORS_OPTION_GROUPS, "views", ("view_rotation_deg", "view_scale"))
    with pytest.raises(ExperimentError, match=r"earlier_defaults\.json: no earlier value for \['view_scale'\]"):
        build_grid("acdc_authors_loo", "/data", "/work")


def test_pretrain_per_seed_gives_each_split_seed_its_own_pre_training_with_that_seed():
    """``pretrain_per_seed``: the runs of split seed s start from the pre-training of seed s (also each ablation
    value's), so a row's seeds spread over pre-trainings; random-init rows are unchanged."""
    grid = build_grid("acdc_ablation_fast", "/data", "/work",
                      select={"pretrain_per_seed": "true", "seeds": "0,1,2", "methods": "Ours (Dec) MI+CC"})
    pre = {r.name: r for r in grid if r.kind == "pretrain"}
    assert len(pre) == 3 * (5 + 4 + 5 - 2)
    run = pre["pre_ours_mi_cc_lambda_cc4_ps2"]
    args = run.commands[0]
    assert args[args.index("--seed") + 1] == "2" and args[args.index("--lambda_cc") + 1] == "4.0"
    assert run.meta["pretrain_seed"] == 2 and run.meta["ablation"] == "lambda_cc4"
    for r in grid:
        if r.kind == "finetune":
            assert r.depends == (f"pre_ours_mi_cc_{r.meta['ablation']}{r.meta['ablation_value']:g}_ps{r.meta['seed']}",)
    paper = build_grid("acdc_paper", "/data", "/work", select={"pretrain_per_seed": True, "tasks": "lv", "counts": 1,
                                                               "lrs": 1e-4, "methods": "Baseline,MT + Ours"})
    assert [r.name for r in paper] == ["pre_full_ps0", "pre_full_ps1", "pre_full_ps2"] + \
        [f"ft_random_lv_n1_s{s}_lr1e-4" for s in range(3)] + [f"mt_pre_full_ps{s}_lv_n1_s{s}_lr1e-4" for s in range(3)]
    assert build_grid("acdc_paper", "/data", "/work", select={"pretrain_per_seed": False, "seeds": "0,1",
                                                              "methods": "Ours (Dec) MI+CC"})[0].name == "pre_ours_mi_cc"
    with pytest.raises(ExperimentError, match="pretrain_per_seed must be true or false"):
        build_grid("smoke", "/data", "/work", select={"pretrain_per_seed": "yes"})
    with pytest.raises(ExperimentError, match="leave \"seed\" out"):
        build_grid("smoke", "/data", "/work", select={"pretrain_per_seed": True}, tag="t",
                   pretrain_overrides={"seed": 3})


def test_bad_input_is_refused_with_the_allowed_values():
    with pytest.raises(ExperimentError, match="acdc_paper"):
        build_grid("acdc", "/data", "/work")
    with pytest.raises(ExperimentError, match="Mean Teacher"):
        build_grid("acdc_paper", "/data", "/work", select={"methods": "Mean teacher"})
    with pytest.raises(ExperimentError, match="select"):
        build_grid("acdc_paper", "/data", "/work", select={"task": "lv"})


def _fake_finetune(grid, work: Path, dice: float):
    """The smoke grid's fine-tune with commands that write what a finished finetune_seg run leaves."""
    from dataclasses import replace

    run = next(r for r in grid if r.kind == "finetune")
    out = run_dir(work, run)
    script = (f"import json, pathlib; o = pathlib.Path({str(out)!r}); (o / 'eval').mkdir(parents=True, exist_ok=True); "
              f"(o / 'eval' / 'test_summary.json').write_text(json.dumps({{'mean': {dice}, 'std': 0.1, 'n': 4}})); "
              f"(o / 'best_metric.json').write_text(json.dumps({{'value': 0.5, 'epoch': 3}}))")
    return replace(run, commands=((sys.executable, "-c", script),), depends=())


def test_a_run_is_executed_once_and_skipped_when_its_result_exists(tmp_path):
    grid = build_grid("smoke", "/data", tmp_path, select={"methods": "Baseline"})
    run = _fake_finetune(grid, tmp_path, 0.75)
    first = run_grid([run], tmp_path, log=lambda *_: None)
    assert first["done"] == 1 and first["skipped_existing"] == 0
    result = json.loads((run_dir(tmp_path, run) / "result.json").read_text())
    assert result["test_dice"] == 0.75 and result["val_dice"] == 0.5 and result["method"] == "Baseline"
    again = run_grid([run], tmp_path, log=lambda *_: None)
    assert again["done"] == 0 and again["skipped_existing"] == 1


def test_a_pre_trainings_row_carries_its_cluster_scores_and_none_becomes_a_structure(tmp_path):
    """A finished pre-training's row: the scores of its ``cluster_quality.json`` as ``cq_*`` columns (the spill's
    nearest and farthest bands among them), and the cluster table reads every structure once."""
    import torch

    from bim.pretrain import cluster_quality as CQ
    from experiments.runner import result_of
    from experiments.sections import cluster_quality_table

    pre = build_grid("smoke", "/data", tmp_path, select={"methods": "Contrast (Enc) + Ours (Dec)"})[0]
    out = run_dir(tmp_path, pre)
    out.mkdir(parents=True)
    (out / "model.pt").write_bytes(b"")
    label = torch.zeros(12, 12, 1, dtype=torch.long)
    label[4:8, 4:8] = 2
    clusters = (label > 0).long()
    clusters[4:8, 3] = 1  # the structure's cluster reaches one column past its border
    counts, spill = CQ.contingency(clusters, label, 2, 3), CQ.spill_counts(clusters, label, 2, 3)
    q = {"split": "validation", **CQ.cluster_quality([counts], {2: "Myo"}, [spill])}
    (out / "cluster_quality.json").write_text(json.dumps(q))
    row = result_of(pre, out)
    assert row["cq_Myo"] == q["classes"]["Myo"]["pooled_dice"] and row["cq_Myo_precision"] == pytest.approx(16 / 20)
    assert (row["cq_Myo_spill_border"], row["cq_Myo_spill_far"]) == pytest.approx((4 / 20, 0.0))
    table = "\n".join(cluster_quality_table([row]))
    assert "`pre_full` | 88.9 (88.9) / 88.9 |" in table and "spill" not in table  # one structure column: Myo


def test_a_failed_pre_training_skips_the_runs_that_start_from_it(tmp_path):
    from dataclasses import replace

    grid = build_grid("smoke", "/data", tmp_path, select={"methods": "Contrast (Enc) + Ours (Dec)"})
    pre, ft = grid
    failing = replace(pre, commands=((sys.executable, "-c", "raise SystemExit(3)"),))
    counts = run_grid([failing, ft], tmp_path, log=lambda *_: None)
    assert counts["failed"] == 1 and counts["skipped_dependency"] == 1 and counts["done"] == 0
    assert json.loads((run_dir(tmp_path, pre) / "run.json").read_text())["returncode"] == 3


def test_probe_re_runs_only_a_recorded_pretrain_command_of_plain_options(tmp_path):
    """``experiments.py probe RUN_DIR`` re-runs the pre-training command recorded in ``RUN_DIR/run.json``: a record
    from elsewhere naming other config files or a ``$`` expression is refused, not executed."""
    from experiments.collection import probe_command

    (tmp_path / "checkpoint_final.pt").write_bytes(b"")
    cfg = "['bundles/pretrain_bim/configs/train.json','bundles/pretrain_bim/configs/variants/full.json']"

    def record(command):
        (tmp_path / "run.json").write_text(json.dumps({"kind": "pretrain", "commands": [command]}))
        return probe_command(tmp_path)

    plain = f'python -m monai.bundle run --config_file "{cfg}" --output_dir X --dataset_dir D --epochs 2'
    cmd = record(plain)
    assert cmd[0] == sys.executable and cmd[cmd.index("--output_dir") + 1] == str(tmp_path)
    assert "path_dependence.json" in cmd[cmd.index("--config_file") + 1]
    for bad, why in [(plain + " --seed '$__import__(\"os\").system(\"true\")'", "not a plain --key value pair"),
                     (plain.replace("variants/full.json", "../../../evil.json"), "not one of pretrain_bim's configs"),
                     ("python -c 'print(1)' --config_file x --output_dir y", "not `python -m monai.bundle run")]:
        with pytest.raises(ExperimentError, match=why):
            record(bad)


def test_recorded_early_stops_are_scored_beside_the_full_run(tmp_path, demo_dataset):
    """``--overrides '{"record_early_stop": [1, 2]}'``: the smoke fine-tune trains all its epochs, and its row adds,
    for each patience, the test Dice of the model early stopping would have kept and where it would have stopped;
    the run's own test Dice stays that of its best-validation model."""
    grid = build_grid("smoke", str(demo_dataset), tmp_path, select={"methods": "Baseline"}, tag="rec",
                      overrides={"record_early_stop": [2, 1]})
    (run,) = grid
    assert len(run.commands) == 4 and ["model_patience1.pt" in " ".join(c) for c in run.commands] == [0, 0, 1, 0]
    counts = run_grid(grid, tmp_path, log=lambda *_: None)
    assert counts["done"] == 1, counts
    out = run_dir(tmp_path, run)
    result = json.loads((out / "result.json").read_text())
    main = json.loads(next(p for p in (out / "eval").glob("*_summary.json")
                           if not p.name.startswith("early_stop")).read_text())
    assert result["test_dice"] == main["mean"]
    for n in (1, 2):
        early = json.loads((out / "eval" / f"early_stop_p{n}_summary.json").read_text())
        es = {k[len(f"es{n}_"):]: v for k, v in result.items() if k.startswith(f"es{n}_")}
        assert es["test_dice"] == early["mean"] and 0 < es["epoch_share"] <= 1 and 0 < es["time_share"] <= 1
        if not es["stopped"]:  # the whole run without a pause in its gains: the same model
            assert es["test_dice"] == result["test_dice"]
    assert result["es1_epoch"] <= result["es2_epoch"]
    with pytest.raises(ExperimentError, match="record_early_stop must be"):
        build_grid("smoke", str(demo_dataset), tmp_path, select={"methods": "Baseline"}, tag="rec",
                   overrides={"record_early_stop": [0]})
