"""The experiment runner and the report: grids, resumability, failures, LR selection, tables and plots."""

import csv
import json
import re
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import experiments as ex  # noqa: E402
import results_report as rr  # noqa: E402


# ------------------------------------------------------------------------------------------------------ grids


def test_acdc_fast_grid_has_every_table1_cell_and_one_pretraining_per_variant(tmp_path):
    grid = ex.build_grid("acdc_fast", "/data/acdc", tmp_path)
    pre = [r for r in grid if r.kind == "pretrain"]
    seg = [r for r in grid if r.kind != "pretrain"]
    # IIC, Contrast (Enc), Ours MI+CC, full (shared by "Contrast (Enc) + Ours (Dec)" and "MT + Ours")
    assert sorted(r.meta["variant"] for r in pre) == ["contrast_enc", "full", "iic_dec", "ours_mi_cc"]
    assert len(seg) == 7 * 3 * 3 * 3 * len(ex.FAST.lrs)  # methods x tasks x counts x seeds x LRs
    assert len({r.name for r in grid}) == len(grid)
    assert grid.index(pre[-1]) < grid.index(seg[0])  # pre-trainings come first
    mt_ours = [r for r in seg if r.meta["method"] == "MT + Ours"]
    assert all(r.kind == "meanteacher" and r.depends == ("pre_full",) for r in mt_ours)
    assert all(r.depends == () for r in seg if r.meta["method"] in ("Baseline", "Mean Teacher"))


def test_grid_commands_carry_the_cell_and_start_from_the_pretraining(tmp_path):
    grid = ex.build_grid("acdc_fast", "/data/acdc", tmp_path, tasks="rv", counts=2, seeds=1, lrs=5e-4,
                         methods=["Ours (Dec) MI+CC"])
    assert [r.name for r in grid] == ["pre_ours_mi_cc", "ft_pre_ours_mi_cc_rv_n2_s1_lr5e-4"]
    train, evaluate = grid[1].commands
    args = dict(zip(train[4::2], train[5::2]))
    assert args["--config_file"] == ex.FINETUNE_TRAIN
    assert args["--task"] == "rv" and args["--labelled_scans"] == "2" and args["--split_seed"] == "1"
    assert args["--pretrained"] == str(tmp_path.resolve() / "runs" / "pre_ours_mi_cc" / "model.pt")
    assert args["--learning_rate"] == "0.0005"
    assert "evaluate.json" in evaluate[5]
    pre_args = grid[0].commands[0]
    assert "variants/ours_mi_cc.json" in pre_args[5]


def test_acdc_fast_keeps_the_light_augmentation_its_rows_were_measured_with(tmp_path):
    def args(preset, **kw):
        run = next(r for r in ex.build_grid(preset, "/d", tmp_path, counts=None, seeds=0, lrs=None, **kw) if r.kind != "pretrain")
        return dict(zip(run.commands[0][4::2], run.commands[0][5::2]))
    light = {"--max_rotation_deg": "15.0", "--scale_range": "[0.9, 1.1]", "--gamma_range": "None"}
    fast = args("acdc_fast", tasks="lv", methods=["Baseline"])
    assert {k: fast[k] for k in light} == light
    assert {k: args("acdc_fast", tasks="lv", methods=["Mean Teacher"])[k] for k in light} == light
    # the paper preset and PROMISE12 take the task's own augmentation (bim.tasks)
    assert not set(light) & set(args("acdc_paper", tasks="lv", methods=["Baseline"]))
    assert not set(light) & set(args("promise12_fast", methods=["Baseline"]))
    # a tag's overrides replace the pinned values, each key once
    aug = ex.build_grid("acdc_fast", "/d", tmp_path, tasks="lv", counts=1, seeds=0, lrs=1e-4, methods=["Baseline"],
                        tag="aug", overrides={"max_rotation_deg": 45.0, "gamma_range": [0.5, 2.0]})[0].commands[0]
    assert aug.count("--max_rotation_deg") == 1 and aug[aug.index("--max_rotation_deg") + 1] == "45.0"
    assert aug[aug.index("--gamma_range") + 1] == "[0.5, 2.0]" and aug[aug.index("--scale_range") + 1] == "[0.9, 1.1]"


def test_a_plan_runs_several_grids_as_one_and_shares_their_pretrainings(tmp_path, monkeypatch):
    cell = {"preset": "acdc_fast", "tasks": "lv", "counts": 1, "seeds": 0, "lrs": 1e-4,
            "methods": ["Contrast (Enc) + Ours (Dec)"]}
    plan = [cell, {**cell, "methods": ["Baseline", "Contrast (Enc) + Ours (Dec)"], "tag": "aug",
                   "overrides": {"max_rotation_deg": 45.0}}]
    grid = ex.build_plan(plan, "/d", tmp_path)
    assert [r.name for r in grid] == ["pre_full", "ft_pre_full_lv_n1_s0_lr1e-4", "ft_random_lv_n1_s0_lr1e-4_aug",
                                      "ft_pre_full_lv_n1_s0_lr1e-4_aug"]
    assert all(r.depends == ("pre_full",) for r in grid if "pre_full_lv" in r.name)
    # one tag with two meanings would mix two protocols under one name
    clash = [{**plan[1], "methods": ["Baseline"]}, {**plan[1], "methods": ["Baseline"], "overrides": {"flip_prob": 0.0}}]
    with pytest.raises(ex.ExperimentError, match="plan entry 1: run ft_random_lv_n1_s0_lr1e-4_aug is in an earlier grid"):
        ex.build_plan(clash, "/d", tmp_path)
    # from a JSON file through the command line's code path: one runner gets every run
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    seen = {}
    monkeypatch.setattr(ex, "run_grid", lambda g, w, jobs, log, gpus, finish_by: seen.update(
        names=[r.name for r in g], jobs=jobs, gpus=gpus, finish_by=finish_by) or {"skipped_existing": 0, "done": 0, "failed": 0, "skipped_dependency": 0})
    ex.CLI().run_plan(str(path), "/d", str(tmp_path / "w"), jobs=3, gpus=1)
    assert seen == {"names": [r.name for r in grid], "jobs": 3, "gpus": 1, "finish_by": None}
    ex.CLI().run_plan(str(path), "/d", str(tmp_path / "w"), jobs=3, gpus=1, finish_by=540)
    assert seen["finish_by"] == 540
    # --only narrows the whole plan: two runners on other GPUs split it, each keeping what its runs need
    ex.CLI().run_plan(str(path), "/d", str(tmp_path / "w"), jobs=3, gpus=1, only=["pre_full"])  # as fire parses '["pre_full"]'
    assert seen["names"] == ["pre_full"]
    assert [r.name for r in ex.build_plan(plan, "/d", tmp_path, only=["*_aug"])] == [
        "pre_full", "ft_random_lv_n1_s0_lr1e-4_aug", "ft_pre_full_lv_n1_s0_lr1e-4_aug"]


def test_a_plan_includes_the_runs_of_other_plans_that_its_only_names(tmp_path):
    # one lease can run the remainders of two plans: an include takes the named runs of another plan file, relative
    # to the including file, with the pre-trainings they need and their expected_s, without copying its grids
    cell = {"preset": "acdc_fast", "tasks": "lv", "counts": 1, "seeds": [0, 1], "lrs": 1e-4}
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.json").write_text(json.dumps([{**cell, "methods": ["Baseline", "Contrast (Enc) + Ours (Dec)"],
                                                          "expected_s": 300}]))
    (tmp_path / "sub" / "b.json").write_text(json.dumps([{**cell, "methods": ["IIC (Dec)"]}]))
    both = tmp_path / "sub" / "both.json"
    both.write_text(json.dumps([{"plan": "a.json", "only": ["ft_pre_full_*_s1_*"]}, {"plan": "b.json"},
                                {**cell, "seeds": 2, "methods": ["Baseline"]}]))
    grid = ex.build_plan(both, "/d", tmp_path)
    assert [r.name for r in grid] == ["pre_full", "pre_iic_dec", "ft_pre_full_lv_n1_s1_lr1e-4", "ft_pre_iic_dec_lv_n1_s0_lr1e-4",
                                      "ft_pre_iic_dec_lv_n1_s1_lr1e-4", "ft_random_lv_n1_s2_lr1e-4"]
    assert [r.expected_s for r in grid[2:4]] == [300.0, None]
    # from the command line, narrowed again by --only
    assert [r.name for r in ex.build_plan(str(both), "/d", tmp_path, only=["ft_pre_iic_*_s1_*"])] == [
        "pre_iic_dec", "ft_pre_iic_dec_lv_n1_s1_lr1e-4"]


@pytest.mark.parametrize("entries, match", [
    ([{"plan": "a.json", "expected_s": 10}], r"plan entry 0: an include takes only \['plan', 'only'\]"),
    ([{"plan": "a"}], "plan entry 0: an include takes only"),
    ([{"plan": "a.json", "only": "ft_*"}], "plan entry 0: an include's 'only' must be a non-empty list"),
    ([{"plan": "missing.json"}], r"plan entry 0 of .*p\.json: includes missing\.json, but .*missing\.json is no file"),
    ([{"plan": "loop.json"}], r"plan entry 0 of .*loop\.json: including loop\.json makes a cycle: p\.json -> loop\.json -> loop\.json"),
    ([{"tasks": "lv"}], "plan entry 0: expected an object with a 'preset' \\(a grid\\) or a 'plan'"),
])
def test_bad_includes_are_named(tmp_path, entries, match):
    (tmp_path / "a.json").write_text(json.dumps([{"preset": "acdc_fast", "tasks": "lv", "counts": 1, "seeds": 0}]))
    (tmp_path / "loop.json").write_text(json.dumps([{"plan": "loop.json"}]))
    (tmp_path / "p.json").write_text(json.dumps(entries))
    with pytest.raises(ex.ExperimentError, match=match):
        ex.build_plan(tmp_path / "p.json", "/d", tmp_path)


def test_the_repository_stays_small_enough_to_carry_beside_the_acdc_pack():
    # a GPU call carries the working tree (tracked files) with .device (the ACDC pack: 64,106,853 bytes after
    # prepare.sh acdc) under the device's 64 MiB (67,108,864 bytes): 3.0 MB for the tracked files, of which the
    # workplace allows 2.5 MB (its check before a stop warns above that). Results commit CSVs and small PNGs, never
    # data or weights
    import subprocess

    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    files = [ROOT / f for f in listed.stdout.decode().split("\0") if f]
    sizes = sorted(((f.stat().st_size, f.relative_to(ROOT).as_posix()) for f in files if f.is_file()), reverse=True)
    assert sum(s for s, _ in sizes) < 2_500_000, f"tracked files total {sum(s for s, _ in sizes)} bytes; largest: {sizes[:5]}"


def test_results_csvs_keep_six_significant_digits(tmp_path):
    # collect (through write_csv) writes floats to 6 significant digits, and every committed results CSV holds them
    # so (the twenty-fifth session rewrote them, 27 kB less); names, hashes, LRs and short decimals pass unchanged
    import subprocess

    assert ex.short_float(0.8574790954589844) == 0.857479 and ex.short_float("0.8574790954589844") == 0.857479
    assert ex.short_float("1.23456789e-05") == 1.23457e-05 and ex.short_float(1146.6) == 1146.6
    for kept in ("0.796842", "41875a36a678863767618d8011315c5018d7f65b", "1_000", "2e-05", "nan", "x", 3, None):
        assert ex.short_float(kept) == kept
    path = ex.write_csv([{"name": "a", "test_dice": 0.8574790954589844, "lr": 2e-05}], ["name", "test_dice", "lr"],
                        tmp_path / "r.csv")
    assert path.read_text().splitlines() == ["name,test_dice,lr", "a,0.857479,2e-05"]
    listed = subprocess.run(["git", "ls-files", "-z", "*.csv", "*.csv.gz"], cwd=ROOT, capture_output=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    for f in filter(None, listed.stdout.decode().split("\0")):
        with rr.open_csv(ROOT / f) as text:
            values = (v.strip() for v in text.read().replace("\n", ",").split(","))
        long = [v for v in values if ex.LONG_DECIMAL.fullmatch(v) and ex.short_float(v) != float(v)]
        assert not long, f"{f}: {len(long)} floats with more than 6 significant digits, e.g. {long[0]}"

def test_a_later_lease_skips_the_runs_its_earlier_leases_collected(tmp_path, monkeypatch):
    # a plan's second lease starts on a fresh machine: what the first collected (its committed CSV) must not run again,
    # and a pre-training runs again only while a run that needs it is left
    plan = ROOT / "docs" / "results" / "gpu_calls" / "plans" / "mt3.json"
    grid = ex.build_plan(plan, "/d", tmp_path)
    first = [r.name for r in grid[1:7]]  # the six random-init [tsep] runs at seed 0

    def csv_of(names, path):
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["name", "kind", "init", "test_dice"])
            w.writeheader()
            w.writerows({"name": n, "kind": "meanteacher", "init": "random", "test_dice": "0.5"} for n in names)
        return str(path)

    lease1 = csv_of(first, tmp_path / "lease1.csv")
    left = ex.drop_collected(grid, [lease1])
    assert [r.name for r in left] == [r.name for r in grid if r.name not in first] and left[0].name == "pre_full"
    # every run that needs the pre-training collected too (in a second CSV): the pre-training goes as well
    needs_pre = [r.name for r in grid if r.depends]
    lease2 = csv_of(needs_pre, tmp_path / "lease2.csv")
    left = ex.drop_collected(grid, f"{lease1},{lease2}")
    assert left and all(r.kind == "meanteacher" and not r.depends for r in left)
    assert not set(first) & {r.name for r in left}
    assert ex.drop_collected(grid, None) == grid
    # through run_plan: collected runs are left out before --only narrows, so a first call's pre-training runner
    # (--only pre_full) gets nothing once every run that needs the pre-training is collected
    seen = {}
    monkeypatch.setattr(ex, "run_grid", lambda g, w, jobs, log, gpus, finish_by: seen.update(names=[r.name for r in g])
                        or {"skipped_existing": 0, "done": 0, "failed": 0, "skipped_dependency": 0})
    ex.CLI().run_plan(str(plan), "/d", str(tmp_path / "w"), skip_collected=[lease1])
    assert seen["names"] == [r.name for r in grid if r.name not in first]
    ex.CLI().run_plan(str(plan), "/d", str(tmp_path / "w"), only=["pre_full"], skip_collected=[lease1, lease2])
    assert seen["names"] == []
    # bad input: one clear error naming the file
    with pytest.raises(ex.ExperimentError, match="nope.csv: no such results CSV"):
        ex.drop_collected(grid, [str(tmp_path / "nope.csv")])
    (tmp_path / "bad.csv").write_text("run,test_dice\nx,0.5\n")
    with pytest.raises(ex.ExperimentError, match="bad.csv: expected a results CSV with a name column"):
        ex.drop_collected(grid, [str(tmp_path / "bad.csv")])
    assert ex.drop_collected(grid, f"[{lease1}, {lease2}]") == left  # fire's string form of an unquoted list
    # on the command line: one line that names the file, exit status 2, no traceback
    import subprocess

    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "experiments.py"), "run_plan", str(plan),
                           "--dataset_dir", "/d", "--work_dir", str(tmp_path / "w"), "--dry_run", "True",
                           "--skip_collected", str(tmp_path / "nope.csv")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [f"experiments.py: {tmp_path / 'nope.csv'}: no such results CSV "
                                                "(skip_collected expects CSVs written by collect)"]


def test_n_sh_cgsmoke_runs_every_semi_supervised_method_once_and_reports_each(tmp_path):
    # meanteacher_seg's CUDA-graph default was measured at full length for mean_teacher only: the phase runs each of
    # its methods (configs/variants) briefly on one GPU and reports its exit status and validation Dice
    bin_dir, calls = _stand_in_bin(tmp_path, 1, prints="Epoch[1] Metrics -- val_mean_dice: 0.5000")
    (tmp_path / "w" / "acdc").mkdir(parents=True)
    (tmp_path / "w" / "acdc" / "datalist.json").write_text("{}")
    done = _run_n_sh(tmp_path, bin_dir, 100, "cgsmoke")
    assert done.returncode == 0, done.stderr
    variants = sorted(p.stem for p in (ROOT / "bundles" / "meanteacher_seg" / "configs" / "variants").glob("*.json"))
    assert len(variants) == 7 and "mean_teacher" in variants
    bundle_calls = [line for line in calls.read_text().splitlines() if "monai.bundle run" in line]
    assert sorted(re.search(r"variants/(\w+)\.json", c).group(1) for c in bundle_calls) == variants
    assert all("--epochs 1 --iters_per_epoch 40" in c and "--compile_mode" not in c for c in bundle_calls)  # the default
    report = (tmp_path / "out" / "cgsmoke.log").read_text()
    assert sorted(re.findall(r"cgsmoke (\w+): rc 0 at \d+ s; val_mean_dice: 0.5000", report)) == variants


def test_n_sh_passes_skip_collected_to_its_plan_runner(tmp_path):
    bin_dir, calls = _stand_in_bin(tmp_path, 4)
    (tmp_path / "w" / "acdc").mkdir(parents=True)
    (tmp_path / "w" / "acdc" / "datalist.json").write_text("{}")
    csv_path = "docs/results/acdc_paper_length/results_calls_mt2.csv.gz"
    done = _run_n_sh(tmp_path, bin_dir, 100, "mt3", SKIP_COLLECTED=f'["{csv_path}"]')
    assert done.returncode == 0 and "phase mt3 ended" in done.stdout
    runner = [line for line in calls.read_text().splitlines() if " run_plan " in f" {line} "]
    assert len(runner) == 1 and runner[0].endswith(f'--skip_collected ["{csv_path}"]')


def test_n_sh_runs_the_base1e3_plan_on_all_gpus(tmp_path):
    # the baseline at 1e-3 is a phase of its own (no pre-training): one runner over the machine's GPUs
    bin_dir, calls = _stand_in_bin(tmp_path, 4)
    (tmp_path / "w" / "acdc").mkdir(parents=True)
    (tmp_path / "w" / "acdc" / "datalist.json").write_text("{}")
    done = _run_n_sh(tmp_path, bin_dir, 100, "base1e3", GPUS="0,1,2,3", JOBS="24")
    assert done.returncode == 0 and "phase base1e3 ended" in done.stdout
    runner = [line for line in calls.read_text().splitlines() if " run_plan " in f" {line} "]
    assert len(runner) == 1 and "plans/base1e3.json" in runner[0] and "--gpus 4 --jobs 24" in runner[0]


def test_n_sh_runs_the_abl3_plan_on_a_two_gpu_machine(tmp_path):
    # abl3's 2 x H200 shape (docs/results/README.md, Next steps 3): its seven pre-trainings at once on both GPUs; a
    # call without GPUS takes every GPU the machine has, and one naming a GPU it lacks stops before it starts anything
    bin_dir, calls = _stand_in_bin(tmp_path, 2)
    (tmp_path / "w" / "acdc").mkdir(parents=True)
    (tmp_path / "w" / "acdc" / "datalist.json").write_text("{}")
    for env, jobs in (({"GPUS": "0,1", "JOBS": "7"}, 7), ({}, 14)):
        calls.write_text("")
        done = _run_n_sh(tmp_path, bin_dir, 100, "abl3", **env)
        assert done.returncode == 0 and "phase abl3 ended" in done.stdout, done.stdout + done.stderr
        runner = [line for line in calls.read_text().splitlines() if " run_plan " in f" {line} "]
        assert len(runner) == 1 and "plans/abl3.json" in runner[0] and f"--gpus 2 --jobs {jobs}" in runner[0]
    calls.write_text("")
    refused = _run_n_sh(tmp_path, bin_dir, 100, "abl3", GPUS="0,1,2,3", JOBS="20")
    assert refused.returncode == 2 and "GPUS=0,1,2,3: this machine has 2 GPU(s)" in refused.stdout
    assert " run_plan " not in f" {calls.read_text()} "


def _acdc_results_csvs() -> list[str]:
    """Every committed ACDC paper-length results CSV (not the per-scan ones): what the plans' later leases skip."""
    folder = ROOT / "docs" / "results" / "acdc_paper_length"
    return [str(p) for p in sorted(folder.glob("results_calls_*.csv.gz")) if not p.name.endswith("_per_scan.csv.gz")]


@pytest.mark.parametrize("plan", sorted((ROOT / "docs" / "results" / "gpu_calls" / "plans").glob("*.json")), ids=lambda p: p.name)
def test_the_committed_gpu_plans_build(plan, tmp_path):
    # a plan that fails to build would cost a GPU call to find out; u.json: one pre-training for all 54 [onepre] runs
    grid = ex.build_plan(plan, "/d", tmp_path)
    kinds = [r.kind for r in grid]
    assert grid and kinds[:kinds.count("pretrain")] == ["pretrain"] * kinds.count("pretrain")  # pre-trainings first
    if plan.name == "u.json":
        onepre = [r for r in grid if r.name.endswith("_onepre")]
        assert len(onepre) == 54 and {r.depends for r in onepre} == {("pre_full",)}
        assert len([r for r in grid if r.name.startswith("ft_random_myo_")]) == 11
    if plan.name == "x.json":  # Mean Teacher's weight search, seed 0 first, and the BatchNorm diagnosis
        assert len(grid) == 31 and set(kinds) == {"meanteacher"} and grid[0].name == "mt_random_lv_n1_s0_lr1e-4_cw0"
        labbn = [r for r in grid if r.name.endswith("_labbn")]
        assert len(labbn) == 4 and all(r.commands[0][r.commands[0].index("--unlabelled_bn_stats") + 1] == "False"
                                       for r in labbn)
    if plan.name == "p12.json":  # PROMISE12 at the paper's lengths: one pre-training, the paper's LR first
        assert len(grid) == 73 and grid[0].name == "pre_full" and grid[0].commands[0].count("--iters_per_epoch")
        args = dict(zip(grid[0].commands[0][4::2], grid[0].commands[0][5::2]))
        assert (args["--epochs"], args["--iters_per_epoch"]) == ("50", "400")  # 20,000 pre-training iterations
        assert {r.meta["lr"] for r in grid[1:19]} == {2e-4} and {r.meta["task"] for r in grid[1:]} == {"prostate"}
        ft = dict(zip(grid[1].commands[0][4::2], grid[1].commands[0][5::2]))  # the paper's PROMISE12 epoch, both stages
        assert (ft["--epochs"], ft["--iters_per_epoch"], ft["--warmup_epochs"]) == ("50", "400", "10")
        # the rows the p12 calls left (they ran the pre-training and all 27 baselines): the full method's other LRs,
        # then Mean Teacher and MT + Ours, seed 0 first
        assert {r.meta["lr"] for r in grid[37:55]} == {2e-5, 5e-4} and {r.expected_s for r in grid[37:55]} == {450}
        assert [r.name for r in grid[55:61]] == [f"mt_{i}_prostate_n{n}_s0_lr2e-4" for i in ("random", "pre_full")
                                                 for n in (4, 6, 8)] and {r.expected_s for r in grid[55:]} == {2000}
        assert {r.meta["seed"] for r in grid[61:]} == {1, 2} and {r.kind for r in grid[55:]} == {"meanteacher"}
        # the p12 to p12d calls left Mean Teacher and MT + Ours at seed 2 (and the pre-training MT + Ours needs,
        # which .carry/p12 restores); the p12e calls ran them: nothing is left, not even the pre-training
        results = plan.parent.parent.parent / "promise12_paper_length"
        csvs = [str(results / f"results_calls_{c}.csv.gz") for c in ("p12", "p12b", "p12c", "p12d")]
        assert [r.name for r in ex.drop_collected(grid, csvs)] == ["pre_full"] + [
            f"mt_{i}_prostate_n{n}_s2_lr2e-4" for i in ("random", "pre_full") for n in (4, 6, 8)]
        assert ex.drop_collected(grid, csvs + [str(results / "results_calls_p12e.csv.gz")]) == []
    if plan.name == "abl2.json":  # a second pre-training per alpha value: pre-training seed 1, its own names
        pre = [r for r in grid if r.kind == "pretrain"]
        assert len(grid) == 20 and [r.name for r in pre] == [f"pre_full_alpha{a}_pre5kb" for a in ("0", "0.25", "0.5",
                                                                                                  "0.75", "1")]
        assert all(dict(zip(r.commands[0][4::2], r.commands[0][5::2]))["--seed"] == "1" for r in pre)
        first = ex.build_plan(plan.parent / "r.json", "/d", tmp_path)  # calls R's pre-trainings (seed 0)
        assert not {r.name for r in first} & {r.name for r in grid}
        assert all(dict(zip(r.commands[0][4::2], r.commands[0][5::2])).get("--seed") is None
                   for r in first if r.kind == "pretrain")
    if plan.name == "abl3.json":  # the same for lambda_CC and K: their non-default values only, pre-training seed 1
        pre = [r for r in grid if r.kind == "pretrain"]
        assert len(grid) == 28 and len(pre) == 7 and all(r.name.endswith("_pre5kb") for r in grid)
        assert not any(r.name.startswith(("pre_full_lambda_cc1_", "pre_full_num_clusters40_")) for r in pre)
        assert all(dict(zip(r.commands[0][4::2], r.commands[0][5::2]))["--seed"] == "1" for r in pre)
        # the abl3 calls (forty-first session, 2 x H200) ran all 28: nothing is left against their CSV
        ablation = plan.parent.parent.parent / "acdc_ablation"
        assert ex.drop_collected(grid, [str(ablation / "results_calls_abl3_lambda_cc_k.csv.gz")]) == []
    if plan.name == "abl4.json":  # a third pre-training (seed 2) of the shared default point, lambda_CC = 0 and K = 20
        assert [r.name for r in grid if r.kind == "pretrain"] == [f"pre_full_{v}_pre5kc" for v in (
            "alpha0.5", "lambda_cc0", "num_clusters20")] and len(grid) == 12
        assert all(dict(zip(r.commands[0][4::2], r.commands[0][5::2]))["--seed"] == "2" for r in grid[:3])
        ablation = plan.parent.parent.parent / "acdc_ablation"  # the abl4 call (forty-first session) ran all 12
        assert ex.drop_collected(grid, [str(ablation / "results_calls_abl4_third.csv.gz")]) == []
    if plan.name == "mtlr24.json":  # Mean Teacher's and MT + Ours's LR choice at 2 / 4 scans, seeds 0-1: Mean Teacher
        # [tsep] at the two other LRs (its 1e-4 runs are Table 1's), MT + Ours [onepre] at all three from one pre_full
        mt = [r for r in grid if r.name.startswith("mt_random_")]
        onepre = [r for r in grid if r.name.startswith("mt_pre_full_")]
        assert grid[0].name == "pre_full" and (len(mt), len(onepre), len(grid)) == (24, 36, 61)
        assert {r.meta["lr"] for r in mt} == {2e-5, 5e-4} and {r.meta["lr"] for r in onepre} == {2e-5, 1e-4, 5e-4}
        assert {r.meta["labelled_scans"] for r in grid[1:]} == {2, 4} and {r.meta["seed"] for r in grid[1:]} == {0, 1}
        assert all(r.name.endswith("_cw1_tsep") for r in mt) and all(r.name.endswith("_cw1_onepre") for r in onepre)
        assert {r.depends for r in onepre} == {("pre_full",)}
        # the mtlr24a call (thirty-third session) ran Mean Teacher's six random-init runs of count 2, seed 0; the
        # mtlr24b calls (thirty-fourth) those of count 2, seed 1, and RV's two of count 4, seed 0 (its LV / Myo four
        # were cut a few epochs before their end and lost with the machine); the mtlr24c calls (thirty-fifth) the
        # other ten of count 4. The mtlr24d lease (thirty-seventh session, 4 x H200) pre-trained pre_full (renamed
        # pre_full_mtlr24d) and ran MT + Ours [onepre]'s 18 runs of count 2; the mtlr24e lease (thirty-ninth, 2 x H200)
        # pre-trained pre_full again (renamed pre_full_mtlr24e) and ran the nine of count 4, seed 0; the mtlr24f lease
        # (fortieth, 2 x H200) a third pre_full (pre_full_mtlr24f) and the nine of count 4, seed 1: nothing is left,
        # not even pre_full, which no run left needs
        assert ex.drop_collected(grid, _acdc_results_csvs()) == []
        folder = plan.parent.parent.parent / "acdc_paper_length"
        for lease, seed in (("mtlr24e", 0), ("mtlr24f", 1)):
            with rr.open_csv(folder / f"results_calls_{lease}.csv.gz") as f:
                ran_4 = {row["name"]: (row["init"], row["gpu"]) for row in csv.DictReader(f)}
            assert ran_4.pop(f"pre_full_{lease}") == ("", "2 x NVIDIA H200")
            assert ran_4 == {r.name: (f"pre_full_{lease}", "2 x NVIDIA H200") for r in onepre
                             if r.meta["labelled_scans"] == 4 and r.meta["seed"] == seed}
        with rr.open_csv(folder / "results_calls_mtlr24d.csv.gz") as f:
            ran_d = {row["name"]: (row["init"], row["gpu"]) for row in csv.DictReader(f)}
        assert ran_d.pop("pre_full_mtlr24d") == ("", "4 x NVIDIA H200")
        assert ran_d == {r.name: ("pre_full_mtlr24d", "4 x NVIDIA H200") for r in onepre if r.meta["labelled_scans"] == 2}
        before_d = ex.drop_collected(grid, [c for c in _acdc_results_csvs()
                                            if not any(f"mtlr24{x}" in c for x in "def")])
        assert {r.name for r in grid} - {r.name for r in before_d} == {r.name for r in mt}
        without_c = {r.name for r in ex.drop_collected(grid, [c for c in _acdc_results_csvs() if "mtlr24c" not in c])}
        assert {r.name for r in mt if r.name in without_c} == {
            f"mt_random_{t}_n4_s{s}_lr{lr}_cw1_tsep" for t, s in (("lv", 0), ("myo", 0), ("lv", 1), ("rv", 1), ("myo", 1))
            for lr in ("2e-5", "5e-4")}
    if plan.name == "lr12.json":  # IIC (Dec)'s and Contrast (Enc)'s LR choice at 1 / 2 scans (their 4-scan one ran in
        # rows2), Ours (Dec) MI+CC's at 1 / 2 / 4, seeds 0-1: all three LRs from one new pre-training each ([onepre];
        # the 1e-4 runs of Table 1 came from pre-trainings now gone)
        pre = [r.name for r in grid if r.kind == "pretrain"]
        assert pre == ["pre_iic_dec", "pre_contrast_enc", "pre_ours_mi_cc"] and len(grid) == 3 + 36 + 36 + 54
        for p, counts in (("pre_iic_dec", (1, 2)), ("pre_contrast_enc", (1, 2)), ("pre_ours_mi_cc", (1, 2, 4))):
            runs = [r for r in grid if r.depends == (p,)]
            assert all(r.name.endswith("_onepre") for r in runs) and len(runs) == 18 * len(counts)
            assert {(r.meta["labelled_scans"], r.meta["seed"], r.meta["lr"]) for r in runs} == {
                (n, s, lr) for n in counts for s in (0, 1) for lr in (2e-5, 1e-4, 5e-4)}
        # the rows2c lease ran the three pre-trainings beside its own (results_calls_lr12a names them pre_*_lr12) and
        # none of the fine-tunes; their weights, carried in the ignored .carry/lr12, did not survive into the next
        # session. The lr12b lease pre-trained pre_ours_mi_cc again (renamed pre_ours_mi_cc_lr12b) and ran 48 of its 54
        # fine-tunes: left are Myo at 4 scans, which need pre_ours_mi_cc once more, and IIC (Dec). The lr12c lease
        # (thirty-fourth session) pre-trained pre_contrast_enc (renamed pre_contrast_enc_lr12c) and ran all its 36
        # fine-tunes.
        folder = plan.parent.parent.parent / "acdc_paper_length"
        with rr.open_csv(folder / "results_calls_lr12a.csv.gz") as f:
            ran = {row["name"]: row["kind"] for row in csv.DictReader(f)}
        assert ran == {f"{p}_lr12": "pretrain" for p in pre}
        with rr.open_csv(folder / "results_calls_lr12b.csv.gz") as f:
            ran_b = {row["name"]: row["init"] for row in csv.DictReader(f)}
        assert len(ran_b) == 49 and set(ran_b.values()) == {"", "pre_ours_mi_cc_lr12b"}
        with rr.open_csv(folder / "results_calls_lr12c.csv.gz") as f:
            ran_c = {row["name"]: row["init"] for row in csv.DictReader(f)}
        assert len(ran_c) == 37 and set(ran_c.values()) == {"", "pre_contrast_enc_lr12c"}
        # The lr12d lease (thirty-fifth session) pre-trained pre_iic_dec and pre_ours_mi_cc once more
        # (renamed pre_*_lr12d) and ran IIC (Dec)'s 36 fine-tunes and Ours (Dec) MI+CC's Myo 4 unit: nothing is left
        with rr.open_csv(folder / "results_calls_lr12d.csv.gz") as f:
            ran_d = {row["name"]: row["init"] for row in csv.DictReader(f)}
        assert len(ran_d) == 44 and set(ran_d.values()) == {"", "pre_iic_dec_lr12d", "pre_ours_mi_cc_lr12d"}
        assert {n for n, init in ran_d.items() if init == "pre_ours_mi_cc_lr12d"} == {
            f"ft_pre_ours_mi_cc_myo_n4_s{s}_lr{lr}_onepre" for s in (0, 1) for lr in ("2e-5", "1e-4", "5e-4")}
        # a pre-training goes when nothing left needs it
        left = ex.drop_collected(grid, _acdc_results_csvs())
        assert left == []
        assert [r.name for r in ex.drop_collected(grid, [c for c in _acdc_results_csvs() if "lr12d" not in c])
                if r.kind == "pretrain"] == ["pre_iic_dec", "pre_ours_mi_cc"]
    if plan.name == "base1e3.json":  # the baseline above the LR grid it picks the top of: 1e-3, every cell, 3 seeds
        assert len(grid) == 27 and set(kinds) == {"finetune"} and {r.meta["lr"] for r in grid} == {1e-3}
        assert {r.meta["init"] for r in grid} == {"random"} and all(r.name.endswith("_lr1e-3") for r in grid)
        assert {(r.meta["task"], r.meta["labelled_scans"], r.meta["seed"]) for r in grid} == {
            (t, n, s) for t in ("lv", "rv", "myo") for n in (1, 2, 4) for s in (0, 1, 2)}
        # the base1e3 lease (thirty-sixth session, 2 x H200) ran all 27: nothing is left
        folder = plan.parent.parent.parent / "acdc_paper_length"
        with rr.open_csv(folder / "results_calls_base1e3.csv.gz") as f:
            ran = {row["name"]: (row["lr"], row["gpu"]) for row in csv.DictReader(f)}
        assert set(ran) == {r.name for r in grid} and set(ran.values()) == {("0.001", "2 x NVIDIA H200")}
        assert ex.drop_collected(grid, _acdc_results_csvs()) == []
    if plan.name == "rerun.json":  # six of base1e3's runs again, same settings and seed, in rows of their own: how far
        # two runs of one configuration land apart (GPU runs are not bit-reproducible)
        assert len(grid) == 6 and all(r.name.endswith("_lr1e-3_rerun") for r in grid)
        folder = plan.parent.parent.parent / "acdc_paper_length"
        with rr.open_csv(folder / "results_calls_base1e3.csv.gz") as f:
            first = {row["name"]: row["command"] for row in csv.DictReader(f)}
        with rr.open_csv(folder / "results_calls_rerun.csv.gz") as f:
            again = {row["name"]: row["command"] for row in csv.DictReader(f)}
        # the rerun lease (thirty-ninth session, 2 x H200) ran all six; each command is its first run's, word for word
        assert set(again) == {r.name for r in grid} and ex.drop_collected(grid, _acdc_results_csvs()) == []
        assert all(again[n] == first[n.removesuffix("_rerun")] for n in again)
    if plan.name == "base2e3.json":  # the baseline picked 1e-3, the top again, in 17 of 27 units: one step further
        assert len(grid) == 27 and set(kinds) == {"finetune"} and {r.meta["lr"] for r in grid} == {2e-3}
        assert {r.meta["init"] for r in grid} == {"random"} and all(r.name.endswith("_lr2e-3") for r in grid)
        assert {(r.meta["task"], r.meta["labelled_scans"], r.meta["seed"]) for r in grid} == {
            (t, n, s) for t in ("lv", "rv", "myo") for n in (1, 2, 4) for s in (0, 1, 2)}
        # the base2e3a call (one H200, thirty-sixth session) ran the 1-scan seed-0 runs, a probe below 1e-3: 24 are left
        left = ex.drop_collected(grid, _acdc_results_csvs())
        assert {r.name for r in grid} - {r.name for r in left} == {f"ft_random_{t}_n1_s0_lr2e-3" for t in ("lv", "rv", "myo")}
    if plan.name == "mt1e3.json":  # Mean Teacher picks 5e-4, its grid's top, in 18 of 21 units: 1e-3 in each of them
        # (1 scan seeds 0-2, 2 / 4 scans seeds 0-1), random init, so beside its other LRs' runs as the baseline's 1e-3
        assert len(grid) == 21 and set(kinds) == {"meanteacher"} and {r.meta["lr"] for r in grid} == {1e-3}
        assert all(r.name.startswith("mt_random_") and r.name.endswith("_lr1e-3_cw1_tsep") for r in grid)
        assert {(r.meta["labelled_scans"], r.meta["seed"]) for r in grid} == {
            (1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (4, 0), (4, 1)}
        # the mtlr24d lease (thirty-seventh session, 4 x H200) ran eight of them beside MT + Ours; the mt1e3b lease
        # (thirty-eighth, one H200) the other seven at 1 and 2 scans; the mtlr24e lease (thirty-ninth, 2 x H200) the
        # three at 4 scans, seed 0; the mtlr24f lease (fortieth, 2 x H200) the three at 4 scans, seed 1: none is left
        assert ex.drop_collected(grid, _acdc_results_csvs()) == []
        folder = plan.parent.parent.parent / "acdc_paper_length"
        with rr.open_csv(folder / "results_calls_mt1e3b.csv.gz") as f:
            ran = {row["name"]: row["gpu"] for row in csv.DictReader(f)}
        assert set(ran) == {f"mt_random_{t}_n{n}_s{s}_lr1e-3_cw1_tsep" for t, n, s in (
            ("lv", 1, 2), ("rv", 1, 2), ("rv", 2, 0), ("myo", 2, 0), ("lv", 2, 1), ("rv", 2, 1), ("myo", 2, 1))}
        assert set(ran.values()) == {"NVIDIA H200"}
        for lease, seed in (("mt1e3c", 0), ("mt1e3d", 1)):
            with rr.open_csv(folder / f"results_calls_{lease}.csv.gz") as f:
                ran_4 = {row["name"]: row["gpu"] for row in csv.DictReader(f)}
            assert ran_4 == {f"mt_random_{t}_n4_s{seed}_lr1e-3_cw1_tsep": "2 x NVIDIA H200" for t in ("lv", "rv", "myo")}
    if plan.name == "y.json":  # Mean Teacher with gamma (meanteacher_seg 0.5.0), LV seed 0 first, then [unlab]
        assert len(grid) == 31 and set(kinds) == {"meanteacher"} and grid[0].name == "mt_random_lv_n1_s0_lr1e-4_cw0_gamma"
        assert all(r.name.endswith(("_gamma", "_unlab")) for r in grid)  # never the names of calls X's runs
        unlab = [r for r in grid if r.name.endswith("_unlab")]
        assert len(unlab) == 4 and all(dict(zip(r.commands[0][4::2], r.commands[0][5::2]))["--consistency_on_labelled"]
                                       == "False" for r in unlab)
    if plan.name == "decdiag.json":  # Ours (Dec) at lambda_CC 0 / 1 and on upcat_3, the full method as control
        pre = {r.name: dict(zip(r.commands[0][4::2], r.commands[0][5::2])) for r in grid[:4]}
        assert list(pre) == ["pre_full_ctl", "pre_ours_mi_cc_cc0", "pre_ours_mi_cc_dl3", "pre_ours_mi_cc_rep"]
        assert [a.get("--lambda_cc") for a in pre.values()] == ["1.0", "0.0", None, "1.0"]
        assert pre["pre_ours_mi_cc_dl3"]["--dense_level"] == "3"  # the clusters on upcat_3, at 1/4 resolution
        assert "variants/full.json" in str(grid[0].commands[0]) and "variants/ours_mi_cc.json" in str(grid[1].commands[0])
        assert len(grid) == 40 and [r.meta["task"] for r in grid[4:16]] == ["lv"] * 12  # the control is not fine-tuned
        assert [r.meta["lr"] for r in grid if r.meta.get("lr") == 2e-5] == [2e-5] * 9  # [rep] also at the paper's LR
        assert {r.name.rsplit("_", 1)[1] for r in grid[13:22]} == {"rep"}
        assert {r.depends for r in grid[4:]} == {(n,) for n in list(pre)[1:]} and all(r.expected_s == 340 for r in grid[4:])
    if plan.name == "decdiag2.json":  # what would make Ours (Dec)'s clusters anatomical: four pre-trainings first
        pre = {r.name: dict(zip(r.commands[0][4::2], r.commands[0][5::2])) for r in grid[:4]}
        assert list(pre) == ["pre_ours_mi_cc_nogam", "pre_ours_mi_cc_k10", "pre_ours_mi_cc_edgeg", "pre_full_con01"]
        assert pre["pre_ours_mi_cc_nogam"]["--train#pair_transform#gamma_range"] == "[1.0, 1.0]"  # gamma off in T
        assert pre["pre_ours_mi_cc_k10"]["--num_clusters"] == "10" and pre["pre_ours_mi_cc_edgeg"]["--edge"] == "gradient_power"
        assert pre["pre_full_con01"]["--loss_weights#con"] == "0.1" and "variants/full.json" in str(grid[3].commands[0])
        assert len(grid) == 40 and [r.meta["task"] for r in grid[4:16]] == ["lv"] * 12 and all(r.expected_s == 340 for r in grid[4:])
        assert {r.depends for r in grid[4:]} == {(n,) for n in pre} and {r.meta["lr"] for r in grid[4:]} == {1e-4}
        # the decdiag2 calls ran all but RV: what is left is RV's 12 fine-tunes, and the pre-trainings they need again
        left = ex.drop_collected(grid, [str(plan.parent.parent.parent / "acdc_paper_length" / "results_calls_decdiag2.csv.gz")])
        assert [r.name for r in left[:4]] == list(pre) and [r.meta["task"] for r in left[4:]] == ["rv"] * 12
    if plan.name == "rows2.json":  # the rest of rows: nothing the rows calls ran (their CSV), nothing rows lacks
        with rr.open_csv(plan.parent.parent.parent / "acdc_paper_length" / "results_calls_rows.csv.gz") as f:
            ran = {row["name"] for row in csv.DictReader(f)} - {"pre_iic_dec", "pre_contrast_enc", "pre_ours_mi_cc"}
        rows = {r.name for r in ex.build_plan(plan.parent / "rows.json", "/d", tmp_path)}
        own, included, samepre0 = [r for r in grid[:-27] if r.name != "pre_full"], grid[-27:-18], grid[-18:]
        names = [r.name for r in own]
        assert len(names) == 76
        lrs = {f"ft_pre_{m}_{t}_n4_s{s}_lr{lr}" for m in ("iic_dec", "contrast_enc") for t in ("lv", "rv", "myo")
               for s in (0, 1) for lr in ("2e-5", "5e-4")}  # IIC (Dec)'s and Contrast (Enc)'s LR choice, last
        assert not set(names) & ran and set(names) - rows == {
            f"ft_random_{t}_n1_s{s}_lr1e-4_dicece" for t in ("lv", "myo") for s in range(3)} | lrs
        assert rows - ran - set(names) == set() and all(r.expected_s == 340 for r in own[3:-24])
        assert set(names[-24:]) == lrs and all(r.expected_s == 460 for r in own[-24:])
        # then, included, what mtlr12 left: MT + Ours [onepre] at seed 2 from a pre_full of its own, runs for runs
        before_rows2c = [c for c in _acdc_results_csvs() if not c.endswith("_rows2c.csv.gz")]
        mtlr12_left = ex.drop_collected(ex.build_plan(plan.parent / "mtlr12.json", "/d", tmp_path), before_rows2c)
        assert grid[3].name == "pre_full" and [r.commands for r in [grid[3], *included]] == [r.commands for r in mtlr12_left]
        # last, the full method's LR choice at 2 / 4 scans for seed 0, all three LRs from that same pre_full: tagged
        # samepre0, since mt3's [samepre] LV runs at 1e-4, seed 0, came from another pre-training (pre_full_mt3)
        assert [r.name for r in samepre0] == [f"ft_pre_full_{t}_n{n}_s0_lr{lr}_samepre0" for t in ("lv", "rv", "myo")
                                              for n in (2, 4) for lr in ("2e-5", "1e-4", "5e-4")]
        assert {r.depends for r in samepre0} == {("pre_full",)} and {r.expected_s for r in samepre0} == {400}
        # the rows2a and rows2b calls ran all but Contrast (Enc)'s RV 4 seed 1 at 2e-5 / 5e-4 (their pre-training is
        # pre_contrast_enc_rows2 in the CSV; .carry/rows2 restored it as pre_contrast_enc): that, mtlr12's rest and
        # [samepre0] were left, and the rows2c calls ran them all: nothing is left
        left = [r.name for r in ex.drop_collected(grid, before_rows2c)]
        assert left == ["pre_contrast_enc", "pre_full", "ft_pre_contrast_enc_rv_n4_s1_lr2e-5",
                        "ft_pre_contrast_enc_rv_n4_s1_lr5e-4"] + [r.name for r in included + samepre0]
        assert ex.drop_collected(grid, _acdc_results_csvs()) == []
    if plan.name == "rows.json":  # the other Table 1 rows: 3 pre-trainings, 1 scan first, then [dicece], then 2 and 4
        assert [r.name for r in grid[:3]] == ["pre_iic_dec", "pre_contrast_enc", "pre_ours_mi_cc"] and len(grid) == 93
        counts = [r.meta["labelled_scans"] for r in grid[3:] if not r.name.endswith("_dicece")]
        assert counts == sorted(counts) and len(counts) == 81 and grid[3 + 27].name == "ft_random_rv_n1_s0_lr1e-4_dicece"
        assert {r.meta["lr"] for r in grid[3:]} == {1e-4}
    if plan.name == "mt2.json":  # Table 1's Mean Teacher with 0.7.0's teacher where the z calls left it, MT + Ours, and a
        # control of the joint forward on the same machine (LV seed 0: 57.8 on H100s against [tsep]'s 88.2 on H200s);
        # ordered for two GPUs: each Table 1 cell's first seed before the other seeds, the control last
        tsep = [f"mt_random_{t}_n1_s{s}_lr1e-4_cw1_tsep" for t, s in (("rv", 0), ("rv", 1), ("rv", 2), ("myo", 1),
                                                                       ("myo", 2))]
        first = [f"mt_pre_full_{t}_n1_s0_lr1e-4_cw1" for t in ("lv", "rv", "myo")]
        rest = [f"mt_pre_full_{t}_n1_s{s}_lr1e-4_cw1" for t in ("lv", "rv", "myo") for s in (1, 2)]
        mt_ours = first + rest
        assert [r.name for r in grid] == (["pre_full"] + tsep[:2] + first + tsep[2:] + rest +
                                          ["mt_random_lv_n1_s0_lr1e-4_cw1_joint"])
        with rr.open_csv(plan.parent.parent.parent / "acdc_paper_length" / "results_calls_Z.csv.gz") as f:
            assert not {row["name"] for row in csv.DictReader(f)} & {r.name for r in grid}  # nothing run twice
        assert {r.depends for r in grid if r.name in mt_ours} == {("pre_full",)} and {r.kind for r in grid[1:]} == {"meanteacher"}
        assert all(r.expected_s == 720 for r in grid[1:])
        args = {r.name: dict(zip(r.commands[0][4::2], r.commands[0][5::2])) for r in grid[1:]}
        assert all(a["--consistency_weight"] == "1.0" and a["--learning_rate"] == "0.0001" for a in args.values())
        assert {n: a.get("--joint_teacher_batch") for n, a in args.items()} == {
            **{n: "False" for n in tsep}, **{n: None for n in mt_ours},  # MT + Ours: the default (separate forwards)
            "mt_random_lv_n1_s0_lr1e-4_cw1_joint": "True"}
    if plan.name == "mt3.json":  # Mean Teacher and MT + Ours at 2 and 4 scans, the full method from MT + Ours's own
        # pre-training ([samepre]), seed 0 first; the random-init runs first among the runs that need no pre-training,
        # then two of them again under CUDA graphs ([cg]), the full-length A/B of compile_mode, before MT + Ours
        names = [r.name for r in grid]
        assert len(grid) == 36 and names[0] == "pre_full" and names[17] == "mt_pre_full_myo_n1_s2_lr1e-4_cw1"
        assert [r.meta["seed"] for r in grid[1:17]] == [0] * 16 and {r.meta["seed"] for r in grid[18:]} == {1}
        # no run that needs no pre-training after those that need it: in a later call it would take the slots that
        # MT + Ours and [samepre] wait for while pre_full ends, and they must end in the lease that pre-trains
        assert all(r.depends for r in grid[24:])
        assert names[1:9] == [f"mt_random_{t}_n{n}_s0_lr1e-4_cw1_tsep" for t in ("lv", "rv", "myo") for n in (2, 4)] + [
            f"mt_random_{t}_n2_s0_lr1e-4_cw1_cg" for t in ("lv", "rv")]
        args = {r.name: dict(zip(r.commands[0][4::2], r.commands[0][5::2])) for r in grid[1:9]}
        assert [a.get("--compile_mode") for a in args.values()] == [None] * 6 + ["reduce-overhead"] * 2
        assert {a["--joint_teacher_batch"] for a in args.values()} == {"False"}  # [cg] differs from [tsep] in the mode only
        samepre = [r for r in grid if r.name.endswith("_samepre")]
        # seed 0's RV / Myo [samepre] runs are left out: the pre-training they pair with did not leave its machine
        assert len(samepre) == 8 and {r.depends for r in samepre} == {("pre_full",)}
        assert [r.expected_s for r in samepre] == [340] * 2 + [260] * 6  # seed 1's, from the mt3 calls' 221 s
        assert {r.expected_s for r in grid[17:] if r.kind == "meanteacher"} == {560}  # CUDA graphs since 0.7.2
        assert {r.depends for r in grid[9:]} == {("pre_full",), ()}
        assert {r.meta["labelled_scans"] for r in grid[1:] if r.name != names[17]} == {2, 4}
        # the next lease: what the mt3 calls collected is skipped; the pre-training runs again for seed 1
        collected = plan.parent.parent.parent / "acdc_paper_length" / "results_calls_mt3.csv.gz"
        left = ex.drop_collected(grid, [str(collected)])
        assert [r.name for r in left] == ["pre_full"] + names[17:]
        # after the mt3b calls nothing is left, the pre-training included
        assert ex.drop_collected(grid, [str(collected), str(collected.with_name("results_calls_mt3b.csv.gz"))]) == []
    if plan.name == "mt4.json":  # seed 2 at 2 and 4 scans: Mean Teacher for the first call's GPUs 1-3, then what
        # waits for pre_full (MT + Ours and [samepre] from one pre-training, which must end in the lease)
        # then [samepre]'s other two LRs, the LR choice from one pre-training (the mt3b calls ran seed 1's)
        assert len(grid) == 31 and grid[0].name == "pre_full" and {r.meta["seed"] for r in grid[1:]} == {2}
        assert [bool(r.depends) for r in grid[1:]] == [False] * 6 + [True] * 24
        assert [r.meta["method"] for r in grid[1:]] == ["Mean Teacher [tsep]"] * 6 + ["MT + Ours"] * 6 + [
            "Contrast (Enc) + Ours (Dec) [samepre]"] * 18
        assert [r.expected_s for r in grid[1:]] == [560] * 12 + [260] * 6 + [300] * 12
        assert [r.meta["lr"] for r in grid[13:19]] == [1e-4] * 6 and {r.meta["lr"] for r in grid[19:]} == {2e-5, 5e-4}
        assert {r.meta["labelled_scans"] for r in grid[1:]} == {2, 4}
        mt3 = {r.name for r in ex.build_plan(plan.parent / "mt3.json", "/d", tmp_path)}
        assert not {r.name for r in grid[1:]} & mt3
        # the mt4 calls ran it all in one lease: nothing is left, the pre-training included
        mt4_csv = plan.parent.parent.parent / "acdc_paper_length" / "results_calls_mt4.csv.gz"
        assert ex.drop_collected(grid, [str(mt4_csv)]) == []
    if plan.name == "mtlr.json":  # fairness for Mean Teacher: its other two LRs at 1 scan (1e-4 ran in z and mt2),
        # and MT + Ours at all three from one pre-training ([onepre], as the full method's), so that the LR chosen on
        # validation does not mix pre-trainings
        # and [ct]: the compiled teacher under CUDA graphs at full length (bench6: 1.28x an epoch), the mt3 calls'
        # [cg] runs (LV / RV 2 scans, seed 0) with compile_teacher true, which made it the default (0.7.3)
        assert len(grid) == 18 and grid[0].name == "pre_full" and {r.meta["seed"] for r in grid[1:]} == {0}
        assert [bool(r.depends) for r in grid[1:]] == [False] * 8 + [True] * 9
        assert {r.meta["lr"] for r in grid[1:7]} == {2e-5, 5e-4} and {r.meta["lr"] for r in grid[9:]} == {2e-5, 1e-4, 5e-4}
        assert {r.meta["method"] for r in grid[9:]} == {"MT + Ours [onepre]"} and {r.meta["labelled_scans"] for r in grid[1:7]} == {1}
        assert [r.name for r in grid[7:9]] == ["mt_random_lv_n2_s0_lr1e-4_cw1_ct", "mt_random_rv_n2_s0_lr1e-4_cw1_ct"]
        assert all(dict(zip(r.commands[0][4::2], r.commands[0][5::2]))["--compile_teacher"] == "True" for r in grid[7:9])
        with rr.open_csv(plan.parent.parent.parent / "acdc_paper_length" / "results_calls_mt2.csv.gz") as f:
            assert not {row["name"] for row in csv.DictReader(f)} & {r.name for r in grid[1:]}  # new names only
        # the mtlr calls ran it all in one lease (pre_full renamed pre_full_mtlr): nothing is left
        mtlr_csv = plan.parent.parent.parent / "acdc_paper_length" / "results_calls_mtlr.csv.gz"
        assert ex.drop_collected(grid, [str(mtlr_csv)]) == []
    if plan.name == "mtlr12.json":  # mtlr for seeds 1 and 2 (no [ct]): one seed a lease, each with its own pre-training
        assert len(grid) == 31 and grid[0].name == "pre_full" and {r.meta["seed"] for r in grid[1:]} == {1, 2}
        assert [bool(r.depends) for r in grid[1:]] == [False] * 12 + [True] * 18
        assert {r.meta["lr"] for r in grid[1:13]} == {2e-5, 5e-4} and {r.meta["method"] for r in grid[13:]} == {"MT + Ours [onepre]"}
        first = ex.narrow_runs(grid, ["pre_full", "*_s1_*"])  # the first lease's ONLY: its seed and the pre-training
        assert len(first) == 16 and {r.meta["seed"] for r in first[1:]} == {1}
        # the mtlr12 calls ran seed 1 (pre_full renamed pre_full_mtlr1) and seed 2's random-init runs; what they left,
        # seed 2's MT + Ours [onepre] at three LRs and its pre-training, rows2 included and the rows2c calls ran
        # (pre_full_mtlr2): nothing is left
        csvs = _acdc_results_csvs()
        left = ex.drop_collected(grid, [c for c in csvs if not c.endswith("_rows2c.csv.gz")])
        assert left[0].name == "pre_full" and len(left) == 10 and {r.meta["seed"] for r in left[1:]} == {2}
        assert {r.meta["method"] for r in left[1:]} == {"MT + Ours [onepre]"} and all(r.depends == ("pre_full",) for r in left[1:])
        assert ex.narrow_runs(grid, ["pre_full", "mt_pre_full_*_s2_*"]) == left  # the rows2c lease's ONLY
        assert ex.drop_collected(grid, csvs) == []
    if plan.name == "z.json":  # [unlab] and [tsep] against [gamma] first, then the rest of y
        assert len(grid) == 29 and {r.kind for r in grid} == {"meanteacher"}
        assert {r.name.rsplit("_", 1)[1] for r in grid[:16]} == {"unlab", "tsep"} and "_cw1_" in grid[7].name
        assert all(r.expected_s == 720 for r in grid)
        tsep = [dict(zip(r.commands[0][4::2], r.commands[0][5::2])) for r in grid if r.name.endswith("_tsep")]
        assert len(tsep) == 8 and all(a["--joint_teacher_batch"] == "False" for a in tsep)
        plans = plan.parent
        y = {r.name for r in ex.build_plan(plans / "y.json", "/d", tmp_path)}
        with rr.open_csv(plans.parent.parent / "acdc_paper_length" / "results_calls_Y.csv.gz") as f:
            ran = {row["name"] for row in csv.DictReader(f)}
        # the rest of y, nothing run twice; [unlab] at weight 0 is [gamma]'s weight 0 but for the labelled view: dropped
        assert {r.name for r in grid[16:29]} == y - ran - {r.name for r in grid[:16]} - {"mt_random_myo_n1_s0_lr1e-4_cw0_unlab"}
        assert not {r.name for r in grid} & ran

@pytest.mark.parametrize("plan, match", [
    ([{"tasks": "lv"}], "plan entry 0: expected an object with a 'preset'"),
    ([{"preset": "acdc_fast", "task": "lv"}], r"plan entry 0: unknown keys \['task'\]"),
    ([], "expected a non-empty list of grids"),
    ("missing.json", "no such JSON file"),
    ([{"preset": "acdc_fst"}], "unknown preset 'acdc_fst'"),
])
def test_bad_plans_are_named(tmp_path, plan, match):
    with pytest.raises(ex.ExperimentError, match=match):
        ex.build_plan(str(tmp_path / plan) if isinstance(plan, str) else plan, "/d", tmp_path)


def test_override_values_reach_the_bundle_as_fire_reads_them(tmp_path):
    # Fire reads JSON's false / null back as the strings 'false' / 'null': the runner writes Python literals
    grid = ex.build_grid("acdc_fast", "/d", tmp_path, tasks="lv", counts=1, seeds=0, lrs=1e-4, methods=["Baseline"],
                         tag="eager", overrides={"compile_mode": None, "amp": False, "gamma_range": [0.5, 2.0]})
    train, evaluate = (dict(zip(cmd[4::2], cmd[5::2])) for cmd in grid[0].commands)
    for args in (train, evaluate):
        assert (args["--compile_mode"], args["--amp"], args["--gamma_range"]) == ("None", "False", "[0.5, 2.0]")
    assert train["--progress_bar"] == "False"
    # the command line: Fire hands JSON's bare null / false over as the strings 'null' / 'false'
    cli = ex.build_grid("acdc_fast", "/d", tmp_path, tasks="lv", counts=1, seeds=0, lrs=1e-4, methods=["Baseline"],
                        tag="eager", overrides={"compile_mode": "null", "amp": "false", "gamma_range": ["true"]})
    args = dict(zip(cli[0].commands[0][4::2], cli[0].commands[0][5::2]))
    assert (args["--compile_mode"], args["--amp"], args["--gamma_range"]) == ("None", "False", "[True]")
    assert json.loads(cli[0].meta["overrides"])["compile_mode"] is None


def test_only_keeps_the_pretrainings_the_selected_runs_need(tmp_path):
    grid = ex.build_grid("acdc_fast", "/d", tmp_path, only="mt_pre_full_lv_n1_s0_*")
    assert [r.kind for r in grid] == ["pretrain"] + ["meanteacher"] * len(ex.FAST.lrs)


def test_ablation_grid_sweeps_alpha_lambda_and_k_from_the_full_method(tmp_path):
    grid = ex.build_grid("acdc_ablation_fast", "/d", tmp_path, lrs=5e-4)
    pre = {r.name: r for r in grid if r.kind == "pretrain"}
    # the default point (alpha 0.5, lambda_CC 1, K 40) is one pre-training, run as alpha's, not three
    assert ex.ablation_defaults("full") == {"alpha": 0.5, "lambda_cc": 1.0, "num_clusters": 40.0}
    assert len(pre) == sum(len(v) for v in ex.ABLATIONS.values()) - 2
    assert "pre_full_alpha0.5" in pre and "pre_full_lambda_cc1" not in pre and "pre_full_num_clusters40" not in pre
    alpha0 = pre["pre_full_alpha0"]
    cmd = alpha0.commands[0]
    assert cmd[cmd.index("--alpha") + 1] == "0.0" and "variants/full.json" in cmd[5]
    k5 = pre["pre_full_num_clusters5"].commands[0]
    assert k5[k5.index("--num_clusters") + 1] == "5"
    ft = [r for r in grid if r.kind != "pretrain"]
    assert {r.meta["method"] for r in ft} == {"Contrast (Enc) + Ours (Dec)"} and len(ft) == len(pre)


def test_ablation_grid_varies_the_pretraining_of_the_methods_named(tmp_path):
    # the paper's ablation tables vary Ours (Dec) MI+CC: its variant is pre-trained once per value, nothing else runs
    grid = ex.build_grid("acdc_ablation_fast", "/d", tmp_path, lrs=1e-4, methods="Ours (Dec) MI+CC")
    pre = [r for r in grid if r.kind == "pretrain"]
    assert len(pre) == sum(len(v) for v in ex.ABLATIONS.values()) - 2
    assert all(r.name.startswith("pre_ours_mi_cc_") and "variants/ours_mi_cc.json" in r.commands[0][5] for r in pre)
    lam = next(r for r in pre if r.name == "pre_ours_mi_cc_lambda_cc0.1").commands[0]
    assert lam[lam.index("--lambda_cc") + 1] == "0.1"
    ft = [r for r in grid if r.kind != "pretrain"]
    assert {r.meta["method"] for r in ft} == {"Ours (Dec) MI+CC"} and {r.depends[0] for r in ft} == {r.name for r in pre}
    with pytest.raises(ex.ExperimentError, match="method 'Baseline' has none to vary"):
        ex.build_grid("acdc_ablation_fast", "/d", tmp_path, methods="Baseline")


@pytest.mark.parametrize("kwargs, match", [
    ({"preset": "acdc_tiny"}, "unknown preset 'acdc_tiny'"),
    ({"preset": "acdc_fast", "methods": ["Ours"]}, "unknown method 'Ours'"),
])
def test_bad_grid_requests_are_named(tmp_path, kwargs, match):
    with pytest.raises(ex.ExperimentError, match=match):
        ex.build_grid(dataset_dir="/d", work_dir=tmp_path, **kwargs)


# ----------------------------------------------------------------------------------------------------- runner


def _fake_pretrain(name, code):
    return ex.Run(name, "pretrain", ((sys.executable, "-c", code),), {"variant": name})


def test_tagged_overrides_reach_every_command_and_keep_runs_apart(tmp_path):
    plain = {r.name for r in ex.build_grid("acdc_fast", "D", tmp_path, tasks="lv", counts=1, seeds=0, lrs=1e-4,
                                           methods="Baseline,Contrast (Enc) + Ours (Dec)")}
    grid = ex.build_grid("acdc_fast", "D", tmp_path, tasks="lv", counts=1, seeds=0, lrs=1e-4,
                         methods="Baseline,Contrast (Enc) + Ours (Dec)", tag="adam",
                         overrides={"optimizer#_target_": "torch.optim.Adam", "epochs": 50})
    names = {r.name for r in grid}
    assert "pre_full" in names and "ft_random_lv_n1_s0_lr1e-4_adam" in names  # the pre-training is shared
    assert not (names - {"pre_full"}) & plain
    for r in grid:
        if r.kind == "pretrain":
            assert "torch.optim.Adam" not in r.commands[0]
            continue
        assert r.meta["method"].endswith(" [adam]") and r.meta["tag"] == "adam"
        for cmd in r.commands:
            i = cmd.index("--optimizer#_target_")
            # an override of a key the preset sets replaces its value: every key appears once in the command
            assert cmd[i + 1] == "torch.optim.Adam" and cmd.count("--optimizer#_target_") == 1
        assert r.commands[0].count("--epochs") == 1 and r.commands[0][r.commands[0].index("--epochs") + 1] == "50"
    pre = ex.build_grid("acdc_fast", "D", tmp_path, tasks="lv", counts=1, seeds=0, lrs=1e-4,
                        methods="Contrast (Enc) + Ours (Dec)", tag="adam",
                        pretrain_overrides={"optimizer#_target_": "torch.optim.Adam"})
    assert {r.name for r in pre} == {"pre_full_adam", "ft_pre_full_adam_lv_n1_s0_lr1e-4_adam"}
    assert pre[1].depends == ("pre_full_adam",) and pre[0].meta["tag"] == "adam"
    assert json.loads(pre[1].meta["pretrain_overrides"]) == {"optimizer#_target_": "torch.optim.Adam"}
    assert json.loads(grid[-1].meta["overrides"]) == {"optimizer#_target_": "torch.optim.Adam", "epochs": 50}
    tagged = [dict(r.meta, tag="adam") for r in grid if r.kind != "pretrain"]
    assert "- `[adam]`: fine-tuning `{\"epochs\": 50, \"optimizer#_target_\": \"torch.optim.Adam\"}`" in rr.tag_lines(tagged)
    # a tag alone (no overrides) only gives the runs a row of their own, and the report says so
    plain = [dict(r.meta) for r in ex.build_grid("acdc_fast", "D", tmp_path, tasks="lv", counts=1, seeds=0, lrs=1e-4,
                                                  methods="Baseline", tag="onepre")]
    assert plain[0]["overrides"] == "{}" and "pretrain_overrides" not in plain[0]
    assert rr.tag_lines(plain)[2] == "- `[onepre]`: no overrides: the preset's settings, in a row of their own"
    assert "not recorded" in rr.tag_lines([{"tag": "old"}])[2]
    with pytest.raises(ex.ExperimentError, match="--tag"):
        ex.build_grid("acdc_fast", "D", tmp_path, overrides={"epochs": 1})
    with pytest.raises(ex.ExperimentError, match="dict of bundle overrides"):
        ex.build_grid("acdc_fast", "D", tmp_path, tag="x", overrides="epochs=1")
    with pytest.raises(ex.ExperimentError, match="tag must be"):
        ex.build_grid("acdc_fast", "D", tmp_path, tag="a b", overrides={"epochs": 1})
    # the report keeps tagged rows apart and still compares them with the paper
    rows = [_row("Baseline", "lv", 1, 0, 1e-4, 0.5, 0.5), _row("Baseline [adam]", "lv", 1, 0, 1e-4, 0.5, 0.7)]
    methods, columns, cells = rr.table(rows)
    assert methods == ["Baseline", "Baseline [adam]"]
    assert "| Baseline [adam] | +2.9 |" in rr.gap_table(methods, columns, cells)  # 70.00 - 67.13


def test_runner_records_skips_finished_runs_and_skips_dependants_of_failures(tmp_path):
    ok = _fake_pretrain("pre_ok", f"open({str(tmp_path / 'runs' / 'pre_ok' / 'model.pt')!r}, 'w').write('x')")
    bad = _fake_pretrain("pre_bad", "import sys; sys.exit(3)")
    child = ex.Run("ft_child", "finetune", ((sys.executable, "-c", "pass"),), {}, ("pre_bad",))
    counts = ex.run_grid([ok, bad, child], tmp_path, jobs=2, log=lambda s: None)
    assert (counts["done"], counts["failed"], counts["skipped_dependency"]) == (1, 1, 1)
    record = json.loads((tmp_path / "runs" / "pre_ok" / "run.json").read_text())
    assert record["status"] == "done" and record["commit"] and record["gpu"] and record["wall_s"] >= 0
    assert record["commands"][0].startswith(sys.executable)
    # the bundle's version, so that a CSV tells runs apart across a change of a bundle's defaults
    pretrain_meta = json.loads((ROOT / "bundles" / "pretrain_bim" / "configs" / "metadata.json").read_text())
    assert record["bundle_version"] == pretrain_meta["version"]
    assert ex.bundle_version("no such kind") is None
    failed = json.loads((tmp_path / "runs" / "pre_bad" / "run.json").read_text())
    assert failed["status"] == "failed" and failed["returncode"] == 3
    assert not (tmp_path / "runs" / "pre_bad" / "result.json").exists()
    # second call: the finished run is not executed again, the failed one is retried
    counts = ex.run_grid([ok, bad], tmp_path, jobs=1, log=lambda s: None)
    assert counts["skipped_existing"] == 1 and counts["failed"] == 1


def test_finish_by_starts_only_the_runs_expected_to_end_in_time_and_resumes_interrupted_ones(tmp_path):
    # the last call of a GPU lease: a run cut at its end is lost with the machine, so a fresh run that cannot end
    # before finish_by is held for a later lease, and a shorter run further down the grid takes its slot
    def fake(name, expected_s, depends=()):
        model = tmp_path / "runs" / name / "model.pt"
        return ex.Run(name, "pretrain", ((sys.executable, "-c", f"open({str(model)!r}, 'w').write('x')"),), {},
                      depends, expected_s=expected_s)

    long, short, after_long, unknown = fake("pre_long", 600), fake("pre_short", 1), fake("pre_after", 1, ("pre_long",)), fake("pre_unknown", None)
    lines = []
    counts = ex.run_grid([long, after_long, short, unknown], tmp_path, jobs=1, log=lines.append, finish_by=60)
    assert (counts["done"], counts["held"], counts["failed"]) == (2, 2, 0)  # pre_short and pre_unknown (no estimate)
    assert not (tmp_path / "runs" / "pre_long").exists() and not (tmp_path / "runs" / "pre_after").exists()
    assert any(line.startswith("hold pre_long: expected 600 s") for line in lines)
    # a run with an earlier attempt resumes whatever its estimate: its checkpoint makes it shorter
    (tmp_path / "runs" / "pre_long").mkdir()
    (tmp_path / "runs" / "pre_long" / "run.json").write_text(json.dumps({"attempt": 1, "status": "failed"}))
    counts = ex.run_grid([long, after_long, short], tmp_path, jobs=1, log=lambda s: None, finish_by=60)
    assert (counts["done"], counts["held"], counts["skipped_existing"]) == (2, 0, 1)
    assert not ex.fits_before(fake("pre_new", 600), tmp_path, 0.0, 60) and ex.fits_before(fake("pre_new", 600), tmp_path, 0.0, None)
    # a run waiting on a pre-training outside the grid is still an error, held runs or not
    orphan = ex.Run("ft_orphan", "finetune", ((sys.executable, "-c", "pass"),), {}, ("pre_elsewhere",))
    with pytest.raises(ex.ExperimentError, match="outside the grid"):
        ex.run_grid([fake("pre_big", 600), orphan], tmp_path, log=lambda s: None, finish_by=60)
    for bad in (0, -5, True, "60"):
        with pytest.raises(ex.ExperimentError, match="finish_by must be a positive number"):
            ex.run_grid([short], tmp_path, log=lambda s: None, finish_by=bad)
    # a plan grid's expected_s reaches its runs; a bad one is named
    plan = [{"preset": "acdc_paper", "tasks": "lv", "counts": 1, "seeds": 0, "lrs": 1e-4, "methods": "Baseline",
             "expected_s": 250}, {"preset": "acdc_paper", "tasks": "rv", "counts": 1, "seeds": 0, "lrs": 1e-4,
                                  "methods": "Baseline"}]
    runs = {r.name: r.expected_s for r in ex.build_plan(plan, "D", tmp_path)}
    assert runs == {"ft_random_lv_n1_s0_lr1e-4": 250.0, "ft_random_rv_n1_s0_lr1e-4": None}
    with pytest.raises(ex.ExperimentError, match="plan entry 1: expected_s must be a positive number"):
        ex.build_plan([plan[0], dict(plan[1], expected_s="long")], "D", tmp_path)


def test_runner_refuses_a_work_dir_whose_finished_runs_were_made_with_other_settings(tmp_path):
    import shlex

    def finish(run, commands=None):  # what execute leaves behind a finished run
        out = ex.run_dir(tmp_path, run)
        out.mkdir(parents=True, exist_ok=True)
        (out / "run.json").write_text(json.dumps({"commands": commands or [shlex.join(c) for c in run.commands]}))
        (out / "result.json").write_text("{}")

    fast = ex.build_grid("acdc_fast", "/data/acdc", tmp_path, tasks="lv", counts=1, seeds=0, lrs=1e-4,
                         methods=["Contrast (Enc) + Ours (Dec)"])
    finish(fast[0])  # acdc_fast's pre_full: 2,000 iterations
    paper = ex.build_grid("acdc_paper", "/data/acdc", tmp_path, tasks="lv", counts=1, seeds=0, lrs=1e-4,
                          methods=["Contrast (Enc) + Ours (Dec)"])
    assert paper[0].name == fast[0].name == "pre_full"
    started = []
    with pytest.raises(ex.ExperimentError, match=r"1 finished run\(s\).*pre_full \(recorded: --epochs 10, .*; this grid: --epochs 50, "):
        ex.run_grid(paper, tmp_path, log=started.append)
    assert started == []  # refused before anything ran
    # the same grid on data and a work dir at other paths is the same run: skipped, not refused
    moved = ex.build_grid("acdc_fast", "/elsewhere/acdc", tmp_path, tasks="lv", counts=1, seeds=0, lrs=1e-4,
                          methods=["Contrast (Enc) + Ours (Dec)"])
    ex.check_finished_runs(moved, tmp_path)
    assert ex.settings_of(shlex.join(moved[1].commands[0])) == ex.settings_of(fast[1].commands[0])
    assert "--pretrained" not in ex.settings_of(fast[1].commands[0]) and "--epochs" in ex.settings_of(fast[1].commands[0])
    finish(fast[0], commands=None)
    (ex.run_dir(tmp_path, fast[0]) / "run.json").write_text("{}")  # a record without commands: not checked
    ex.check_finished_runs(paper, tmp_path)


def test_a_terminated_runner_stops_its_bundle_processes_and_records_the_run_as_failed(tmp_path):
    # `timeout` sends SIGTERM to the runner: its bundle processes must stop with it (an orphan would keep
    # training and race the next attempt, which resumes in the same folder)
    import os
    import signal
    import subprocess
    import time

    pid_file = tmp_path / "child.pid"
    script = tmp_path / "grid.py"
    child_code = f"import os, pathlib, time; pathlib.Path({str(pid_file)!r}).write_text(str(os.getpid())); time.sleep(120)"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(ROOT / 'tools')!r})\n"
        "import experiments as ex\n"
        f"code = {child_code!r}\n"
        "run = ex.Run('pre_sleepy', 'pretrain', ((sys.executable, '-c', code), (sys.executable, '-c', 'pass')), {})\n"
        f"ex.run_grid([run], {str(tmp_path)!r}, jobs=1, log=print)\n")
    runner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while not pid_file.is_file() or not pid_file.read_text():
        assert runner.poll() is None and time.monotonic() < deadline, runner.stdout.read() if runner.poll() else ""
        time.sleep(0.1)
    child = int(pid_file.read_text())
    runner.send_signal(signal.SIGTERM)
    runner.send_signal(signal.SIGTERM)  # as GNU timeout does (the runner, then its process group): handled once
    out, _ = runner.communicate(timeout=60)
    assert runner.returncode == 128 + signal.SIGTERM, out
    assert out.count("stopping 1 running run(s)") == 1, out
    with pytest.raises(ProcessLookupError):  # the child is gone (reaped by the runner), not orphaned
        os.kill(child, 0)
    record = json.loads((tmp_path / "runs" / "pre_sleepy" / "run.json").read_text())
    assert record["status"] == "failed" and record["returncode"] == -signal.SIGTERM
    log_lines = (tmp_path / "runs" / "pre_sleepy" / "log.txt").read_text().splitlines()
    assert sum(line.startswith("+ ") for line in log_lines) == 1  # the run's second command never started


def test_runs_are_spread_over_gpus_by_load_and_each_sees_only_its_gpu(tmp_path):
    # pre-trainings weigh 3, fine-tunes 1: with 2 GPUs the two pre-trainings go to different GPUs, and the
    # fine-tunes started next to them fill the GPU with the lighter load first
    assert ex.pick_gpu(["0", "1"], []) == "0"
    assert ex.pick_gpu(["0", "1"], [("0", "pretrain")]) == "1"
    assert ex.pick_gpu(["0", "1"], [("0", "pretrain"), ("1", "finetune"), ("1", "finetune")]) == "1"
    assert ex.pick_gpu(["0", "1"], [("0", "pretrain"), ("1", "meanteacher"), ("1", "finetune")]) == "0"
    assert ex.parse_gpus(2) == ["0", "1"] and ex.parse_gpus("1,3") == ["1", "3"] and ex.parse_gpus((0, 2)) == ["0", "2"]
    assert ex.parse_gpus(None) == []
    for bad in (0, "a,b", "0,0"):
        with pytest.raises(ex.ExperimentError, match="gpus"):
            ex.parse_gpus(bad)
    code = ("import os, pathlib, time; time.sleep(0.5); "
            "pathlib.Path(os.environ['OUT']).write_text(os.environ.get('CUDA_VISIBLE_DEVICES', ''))")
    runs = [ex.Run(f"pre_{i}", "pretrain", ((sys.executable, "-c", code.replace("os.environ['OUT']", repr(str(
        tmp_path / f"seen_{i}")))),), {}) for i in range(2)]
    counts = ex.run_grid(runs, tmp_path, jobs=2, log=lambda s: None, gpus="0,1")
    assert counts["failed"] == 2  # the fake runs write no model.pt; what matters is where they ran
    assert sorted((tmp_path / f"seen_{i}").read_text() for i in range(2)) == ["0", "1"]
    recorded = sorted(json.loads((tmp_path / "runs" / f"pre_{i}" / "run.json").read_text())["cuda_visible_devices"]
                      for i in range(2))
    assert recorded == ["0", "1"]


def test_gpu_ids_count_within_the_parents_visible_devices():
    # a count of 1 under CUDA_VISIBLE_DEVICES=1 must stay on physical GPU 1, not fall back to GPU 0
    assert [ex.visible_device(g, {"CUDA_VISIBLE_DEVICES": "1"}) for g in ex.parse_gpus(1)] == ["1"]
    assert [ex.visible_device(g, {"CUDA_VISIBLE_DEVICES": "2,3"}) for g in ex.parse_gpus(2)] == ["2", "3"]
    assert ex.visible_device("1", {}) == "1" and ex.visible_device("1", {"CUDA_VISIBLE_DEVICES": ""}) == "1"
    with pytest.raises(ex.ExperimentError, match="CUDA_VISIBLE_DEVICES='1'"):
        ex.visible_device("1", {"CUDA_VISIBLE_DEVICES": "1"})


def test_a_rerun_after_an_interruption_counts_its_attempts(tmp_path):
    # first attempt fails (as a run killed by a call's timeout would leave it), the second finishes: the record says
    # it is attempt 2, keeps when attempt 1 started and how long it ran: wall_s covers attempt 2 only,
    # wall_s_all_attempts both
    model = tmp_path / "runs" / "pre_x" / "model.pt"
    code = (f"import pathlib, sys; m = pathlib.Path({str(model)!r}); flag = m.with_name('tried'); "
            "sys.exit(1) if not flag.exists() and not flag.touch() else m.write_text('w')")
    run = ex.Run("pre_x", "pretrain", ((sys.executable, "-c", code),), {})
    with pytest.raises(ex.ExperimentError, match="pre_x failed"):
        ex.execute(run, tmp_path)
    first = json.loads((model.parent / "run.json").read_text())
    assert first["attempt"] == 1 and first["status"] == "failed"
    result = ex.execute(run, tmp_path)
    record = json.loads((model.parent / "run.json").read_text())
    assert result["attempt"] == 2 and record["status"] == "done"
    assert record["earlier_attempts_started"] == [first["started"]]
    assert record["earlier_attempts_wall_s"] == [first["wall_s"]]
    assert result["wall_s_all_attempts"] == pytest.approx(first["wall_s"] + result["wall_s"], abs=0.11)
    # an attempt killed before it recorded its time leaves the total unknown, not undercounted
    record.update(status="running", started="2026-01-01T00:00:00")
    del record["wall_s"]
    (model.parent / "run.json").write_text(json.dumps(record))
    third = ex.execute(run, tmp_path)
    assert third["attempt"] == 3 and third["wall_s_all_attempts"] is None


def test_a_run_that_writes_no_results_fails_with_its_folder_named(tmp_path):
    run = ex.Run("ft_x", "finetune", ((sys.executable, "-c", "pass"),), {})
    with pytest.raises(ex.ExperimentError, match="ft_x.*best_metric.json"):
        ex.execute(run, tmp_path)
    assert not (tmp_path / "runs" / "ft_x" / "result.json").exists()


# ----------------------------------------------------------------------------------------------------- report


def _row(method, task, n, seed, lr, val, test, paper_lr=1e-4, **kw):
    return {"name": f"{method}-{task}-{n}-{seed}-{lr}", "kind": "finetune", "method": method, "task": task,
            "labelled_scans": n, "seed": seed, "lr": lr, "paper_lr": paper_lr, "val_dice": val, "test_dice": test, **kw}


def test_chosen_lr_lines_show_the_validation_choice_per_seed_and_each_lrs_test_dice():
    rows = [_row("Baseline", "lv", 1, 0, 1e-4, 0.5, 0.60), _row("Baseline", "lv", 1, 0, 5e-4, 0.7, 0.40),
            _row("Baseline", "lv", 1, 1, 1e-4, 0.6, 0.50), _row("Baseline", "lv", 1, 1, 5e-4, 0.4, 0.70),
            _row("Baseline", "rv", 1, 0, 1e-4, 0.5, 0.30),  # one LR only: no line
            _row("Contrast (Enc) + Ours (Dec)", "lv", 1, 0, 1e-4, 0.8, 0.80)]
    chosen = rr.select(rows, "tuned")
    md = rr.chosen_lr_lines(chosen, rows)
    # seed 0 chose 5e-4 on validation (test 40, its worse LR), seed 1 chose 1e-4 (test 50, also its worse)
    assert [line for line in md if line.startswith("| Baseline")] == [
        "| Baseline | LV 1 | s0: 5e-4, s1: 1e-4 | 1e-4: 55.0, 5e-4: 55.0 |"]
    assert rr.chosen_lr_lines(rr.select(rows, "paper"), [r for r in rows if r["lr"] == 1e-4]) == []
    assert not any("more than one pre-training" in line for line in md)  # random init: no pre-training to mix
    # a pre-trained row whose LRs ran from different pre-trainings says so, each LR with its own
    full = "Contrast (Enc) + Ours (Dec)"
    mixed = [_row(full, "rv", 1, s, lr, 0.5, 0.6, init=init) for s, lr, init in (
        (0, 1e-4, "pre_a"), (1, 1e-4, "pre_b"), (0, 2e-5, "pre_c"), (1, 2e-5, "pre_c"), (0, 5e-4, "pre_c"))]
    md = rr.chosen_lr_lines(rr.select(mixed, "tuned"), mixed)
    assert md[-2] == f"- {full}, RV 1: 2e-5, 5e-4 from `pre_c`; 1e-4 from `pre_a`, `pre_b`"
    same = [dict(r, init="pre_c") for r in mixed]
    assert not any("more than one pre-training" in line for line in rr.chosen_lr_lines(rr.select(same, "tuned"), same))


def test_a_fourth_lr_above_the_grid_joins_the_choice():
    # plan base1e3 adds 1e-3 to the baseline's 2e-5 / 1e-4 / 5e-4: the choice, its lines and its summary take all four
    rows = [_row("Baseline", "lv", 1, 0, lr, val, test) for lr, val, test in (
        (2e-5, 0.4, 0.40), (1e-4, 0.5, 0.50), (5e-4, 0.6, 0.60), (1e-3, 0.7, 0.65))]
    chosen = rr.select(rows, "tuned")
    assert [r["lr"] for r in chosen] == [1e-3]
    assert [line for line in rr.chosen_lr_lines(chosen, rows) if line.startswith("| Baseline")] == [
        "| Baseline | LV 1 | s0: 1e-3 | 2e-5: 40.0, 1e-4: 50.0, 5e-4: 60.0, 1e-3: 65.0 |"]
    assert "| Baseline | 1 | 2e-5: 40.0, 1e-4: 50.0, 5e-4: 60.0, 1e-3: 65.0 | 65.0 (1e-3 x1) | 1 of 1 |" in rr.lr_choice_lines(rows)


def test_an_lr_run_in_some_units_only_is_set_against_the_lr_below_it_on_those_units():
    # plan base2e3's probe: 2e-3 in one of the baseline's two units; its mean over that unit is not comparable with
    # 1e-3's over both, so the line also gives 1e-3 on the unit 2e-3 ran in
    rows = [_row("Baseline", "lv", 1, 0, 1e-3, 0.6, 0.70), _row("Baseline", "lv", 1, 0, 2e-3, 0.7, 0.65),
            _row("Baseline", "rv", 1, 0, 1e-3, 0.5, 0.30), _row("Baseline", "rv", 1, 0, 5e-4, 0.4, 0.20)]
    assert "| Baseline | 2 | 5e-4: 20.0 (n=1), 1e-3: 50.0, 2e-3: 65.0 (n=1; 1e-3 on those: 70.0) | 47.5 (1e-3 x1, 2e-3 x1) | 1 of 2 |" \
        in rr.lr_choice_lines(rows)


def test_lr_choice_lines_pool_only_units_whose_lrs_share_their_start():
    # the fairness question for one row: over the seeds whose LRs differ in nothing else, what does each LR score, and
    # what does the LR that validation picks score? A seed whose LRs started from two pre-trainings measures those too
    full, a, b = "Contrast (Enc) + Ours (Dec)", "Contrast (Enc) + Ours (Dec) [a]", "Contrast (Enc) + Ours (Dec) [b]"
    rows = [_row("Baseline", "lv", 1, 0, 1e-4, 0.5, 0.60), _row("Baseline", "lv", 1, 0, 5e-4, 0.7, 0.40),
            _row("Baseline", "lv", 1, 1, 1e-4, 0.6, 0.50), _row("Baseline", "lv", 1, 1, 5e-4, 0.4, 0.70),
            _row("Baseline", "rv", 1, 0, 1e-4, 0.5, 0.30),  # one LR: no choice to measure
            _row(full, "lv", 1, 0, 1e-4, 0.8, 0.80, init="pre_x"), _row(full, "lv", 1, 0, 5e-4, 0.9, 0.70, init="pre_y"),
            _row(a, "lv", 2, 1, 1e-4, 0.8, 0.80, init="pre_1"), _row(a, "lv", 2, 1, 5e-4, 0.9, 0.90, init="pre_1"),
            _row(b, "lv", 2, 0, 1e-4, 0.9, 0.70, init="pre_0"), _row(b, "lv", 2, 0, 5e-4, 0.8, 0.50, init="pre_0"),
            _row(b, "rv", 2, 0, 1e-4, 0.5, 0.60, init="pre_0"),
            {"name": "pre_x", "kind": "pretrain", "method": full}]
    md = rr.lr_choice_lines(rows, {"both tags": [a, b]})
    table = [line for line in md if line.startswith("| ") and not line.startswith("| row")]
    assert table == [
        # seed 0 chose 5e-4 (test 40), seed 1 chose 1e-4 (test 50): 45, and neither was the seed's best test LR
        "| Baseline | 2 | 1e-4: 55.0, 5e-4: 55.0 | 45.0 (1e-4 x1, 5e-4 x1) | 0 of 2 |",
        "| Contrast (Enc) + Ours (Dec) [a] | 1 | 1e-4: 80.0, 5e-4: 90.0 | 90.0 (5e-4 x1) | 1 of 1 |",
        "| Contrast (Enc) + Ours (Dec) [b] | 1 | 1e-4: 70.0, 5e-4: 50.0 | 70.0 (1e-4 x1) | 1 of 1 |",
        "| both tags | 2 | 1e-4: 75.0, 5e-4: 70.0 | 80.0 (1e-4 x1, 5e-4 x1) | 2 of 2 |"]  # the full method: two starts
    assert rr.lr_choice_lines([r for r in rows if r.get("lr") == 1e-4]) == []
    with pytest.raises(rr.ReportError, match="lr_pools 'x'.*Mean Teacher"):
        rr.lr_choice_lines(rows, {"x": ["Mean Teacher"]})


def test_cluster_quality_table_names_each_pretraining_with_its_tag_and_pools_before_per_scan():
    pre = {"kind": "pretrain", "cq_LV": 0.751, "cq_LV_per_scan": 0.701, "cq_nmi": 0.186}
    rows = [dict(pre, name="pre_full", variant="full"), dict(pre, name="pre_full_pre10k", variant="full", tag="pre10k"),
            {"kind": "pretrain", "name": "pre_old", "variant": "full", "cq_nmi": ""}]  # unscored: left out
    md = rr.cluster_quality_table(rows)
    lines = [line for line in md if line.startswith("| Contrast")]
    assert lines == ["| Contrast (Enc) + Ours (Dec) (full) `pre_full` | 75.1 (70.1) | 0.186 |",
                     "| Contrast (Enc) + Ours (Dec) (full) [pre10k] `pre_full_pre10k` | 75.1 (70.1) | 0.186 |"]
    assert rr.cluster_quality_table([rows[2]]) == []
    with_m2o = dict(rows[0], cq_LV_many_to_one=0.802, cq_LV_precision=0.9, cq_LV_recall=0.6)
    assert "| Contrast (Enc) + Ours (Dec) (full) `pre_full` | 75.1 (70.1) / 80.2 | 0.186 |" in rr.cluster_quality_table([with_m2o])


def test_spearman_ranks_with_ties_and_refuses_a_constant():
    assert rr.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert rr.spearman([1, 2, 3, 4], [9, 1, 0, -5]) == pytest.approx(-1.0)
    assert rr.spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)  # one swap: 1 - 6 * 2 / (4 * 15)
    assert rr.spearman([1, 1, 2, 3], [5, 6, 7, 8]) == pytest.approx(0.9486833, abs=1e-6)  # tied first two: ranks 0.5, 0.5
    rho = rr.spearman([1, 2, 3], [4, 4, 4])
    assert rho != rho  # nan: a constant has no order


def test_cluster_quality_table_sets_each_pre_training_beside_its_fine_tunes_and_correlates_them():
    # four pre-trainings that train a cluster head, whose LV cluster order is their LV fine-tunes' order, and one
    # (Contrast (Enc)) that does not: its untrained head's score is shown but kept out of the correlation
    pre = [{"kind": "pretrain", "name": f"pre_{i}", "variant": "full", "cq_LV": cq, "cq_LV_per_scan": cq, "cq_nmi": 0.1}
           for i, cq in enumerate((0.2, 0.4, 0.6, 0.7))]
    pre.append({"kind": "pretrain", "name": "pre_enc", "variant": "contrast_enc", "cq_LV": 0.05, "cq_LV_per_scan": 0.05,
                "cq_nmi": 0.01})
    full = "Contrast (Enc) + Ours (Dec)"
    tunes = [_row(full, "lv", 1, s, 1e-4, 0.5, 0.5 + 0.1 * i + 0.01 * s, init=f"pre_{i}") for i in range(4) for s in (0, 1)]
    tunes += [_row(full, "lv", 2, 0, 1e-4, 0.5, 0.99, init="pre_0"),  # more scans than the fewest: not averaged
              _row("Contrast (Enc)", "lv", 1, 0, 1e-4, 0.5, 0.95, init="pre_enc"),
              _row("Baseline", "lv", 1, 0, 1e-4, 0.5, 0.3, init="random")]
    md = rr.cluster_quality_table(pre, tunes)
    assert md[4] == "| pre-training | LV | NMI | fine-tuned LV |"
    assert "| Contrast (Enc) + Ours (Dec) (full) `pre_0` | 20.0 (20.0) | 0.100 | 50.5 (2) |" in md
    assert "| Contrast (Enc) (contrast_enc) `pre_enc` | 5.0 (5.0) | 0.010 | 95.0 (1) |" in md
    assert "1 labelled scan, this table's paper-protocol runs" in md[2]
    assert md[-2].endswith("(left out: Contrast (Enc) (contrast_enc)): LV +1.00 (4 pre-trainings).")
    # with Contrast (Enc) counted the order would break: the line must not include it
    assert "(5 pre-trainings)" not in md[-2]
    # fewer than 4 pre-trainings with both: no correlation line; no fine-tunes: the table as before
    assert not any(line.startswith("Does a better") for line in rr.cluster_quality_table(pre[:3], tunes))
    assert rr.cluster_quality_table(pre) == rr.cluster_quality_table(pre, [])
    assert not any("fine-tuned" in line for line in rr.cluster_quality_table(pre))


def test_lr_selection_keeps_the_best_validation_lr_and_the_paper_protocol_keeps_paper_lr():
    rows = [_row("Baseline", "lv", 1, 0, 1e-4, 0.5, 0.40), _row("Baseline", "lv", 1, 0, 5e-4, 0.7, 0.60),
            _row("Baseline", "lv", 1, 1, 1e-4, 0.6, 0.50), _row("Baseline", "lv", 1, 1, 5e-4, 0.6, 0.90)]
    tuned = rr.select(rows, "tuned")
    assert sorted(r["test_dice"] for r in tuned) == [0.50, 0.60]  # seed 1 tie: the smaller LR
    assert sorted(r["test_dice"] for r in rr.select(rows, "paper")) == [0.40, 0.50]


def test_mean_teacher_weight_search_runs_each_weight_and_the_report_chooses_it_on_validation(tmp_path):
    grid = ex.build_grid("acdc_paper", "D", tmp_path, tasks="lv", counts=1, seeds="0,1", lrs=1e-4,
                         methods="Baseline,Mean Teacher", mt_weights="0.1,10")
    mt = [r for r in grid if r.kind == "meanteacher"]
    assert sorted(r.name for r in mt) == ["mt_random_lv_n1_s0_lr1e-4_cw0.1", "mt_random_lv_n1_s0_lr1e-4_cw10",
                                          "mt_random_lv_n1_s1_lr1e-4_cw0.1", "mt_random_lv_n1_s1_lr1e-4_cw10"]
    for r in mt:  # the weight reaches the bundle's training command only, and the CSV through the meta
        train, evaluate = r.commands
        assert float(train[train.index("--consistency_weight") + 1]) == r.meta["consistency_weight"]
        assert "--consistency_weight" not in evaluate
    baseline = [r for r in grid if r.kind == "finetune"]
    assert len(baseline) == 2 and all("consistency_weight" not in r.meta and "_cw" not in r.name for r in baseline)
    # without mt_weights nothing changes: the bundle's default weight, the earlier names
    assert {r.name for r in ex.build_grid("acdc_paper", "D", tmp_path, tasks="lv", counts=1, seeds=0, lrs=1e-4,
                                          methods="Mean Teacher")} == {"mt_random_lv_n1_s0_lr1e-4"}
    with pytest.raises(ex.ExperimentError, match="mt_weights"):
        ex.build_grid("acdc_paper", "D", tmp_path, methods="Mean Teacher", mt_weights="-1")
    # the paper's protocol picks the weight on validation at the paper's LR (the paper grid-searches it)
    rows = [_row("Mean Teacher", "lv", 1, 0, 1e-4, 0.5, 0.40, consistency_weight=0.1),
            _row("Mean Teacher", "lv", 1, 0, 1e-4, 0.7, 0.60, consistency_weight=10.0),
            _row("Mean Teacher", "lv", 1, 1, 1e-4, 0.8, 0.70, consistency_weight=0.1),
            _row("Mean Teacher", "lv", 1, 1, 1e-4, 0.6, 0.90, consistency_weight=10.0),
            _row("Mean Teacher", "lv", 1, 0, 5e-4, 0.9, 0.20, consistency_weight=0.1)]
    for r in rows:
        r["name"] += f"-{r['consistency_weight']}"
    paper = rr.select(rows, "paper")
    assert sorted(r["test_dice"] for r in paper) == [0.60, 0.70]
    md = rr.chosen_weight_lines(paper, rr.candidates(rows, "paper"))
    assert md[4] == "| Mean Teacher | LV 1 | s0: 10, s1: 0.1 | 0.1: 55.0, 10: 75.0 |"
    tuned = rr.select(rows, "tuned")  # LR and weight together: seed 0 takes 5e-4's best validation Dice
    assert sorted(r["test_dice"] for r in tuned) == [0.20, 0.70]
    assert rr.chosen_weight_lines(tuned, rows)[4] == "| Mean Teacher | LV 1 | s0: 0.1, s1: 0.1 | 0.1: 43.3 (n=3), 10: 75.0 |"
    assert rr.chosen_weight_lines(rr.select(rows[:1], "paper"), rows[:1]) == []  # one weight: no choice to show


def test_table_is_mean_and_std_over_seeds_with_the_best_in_bold():
    rows = [_row("Baseline", "lv", 1, s, 1e-4, 0.5, d) for s, d in enumerate((0.5, 0.6, 0.7))]
    rows += [_row("MT + Ours", "lv", 1, s, 1e-4, 0.5, d) for s, d in enumerate((0.8, 0.9, 1.0))]
    methods, columns, cells = rr.table(rows)
    assert methods == ["Baseline", "MT + Ours"] and columns == [("lv", 1)]
    assert cells[("Baseline", "lv", 1)][0] == pytest.approx(60.0)
    assert cells[("Baseline", "lv", 1)][1] == pytest.approx(8.1650, abs=1e-3)  # population std over seeds
    md = rr.markdown_table(methods, columns, cells)
    assert "| MT + Ours | **90.00 (8.16)** |" in md and "| Baseline | 60.00 (8.16) |" in md
    gap = rr.gap_table(methods, columns, cells)
    assert "| Baseline | -7.1 |" in gap  # 60.00 - 67.13


def test_paper_table_holds_the_published_numbers():
    assert rr.PAPER_TABLE1["Baseline"]["lv"][1] == 67.13
    assert rr.PAPER_TABLE1["MT + Ours"]["prostate"][8] == 88.45
    assert rr.PAPER_TABLE1["Ours (Dec) MI+CC"]["rv"][4] == 75.92


def test_hardest_scans_lists_the_lowest_scans_first_with_each_methods_mean_over_its_runs(tmp_path):
    rows = [_row("Baseline", "rv", n, 0, 1e-4, 0.5, 0.5) for n in (2, 4)] + [_row("MT + Ours", "rv", 2, 0, 1e-4, 0.5, 0.8)]
    dice = {"a": (0.10, 0.30, 0.90), "b": (0.80, 0.60, 0.50), "c": (0.90, 0.70, 0.95)}  # Baseline n2, n4, MT + Ours
    per_scan = {r["name"]: [(scan, d[i]) for scan, d in dice.items()] for i, r in enumerate(rows)}
    md = rr.hardest_scans(rows, per_scan, worst=2)
    assert md[0] == "**RV** (runs: Baseline 2, MT + Ours 1)"
    body = [line for line in md if line.startswith("| ") and not line.startswith("| scan")]
    # means: a Baseline 20, MT 90 -> 55; b 70, 50 -> 60; c 80, 95 -> 87.5
    assert body == ["| a | 20.0 | 90.0 |", "| b | 70.0 | 50.0 |", "| the other 1 scans | 80.0–80.0 | 95.0–95.0 |"]
    assert rr.hardest_scans([_row("Baseline", "lv", 1, 0, 1e-4, 0.5, 0.5)], per_scan) == []  # no per-scan Dice
    path = tmp_path / "scans.csv"
    path.write_text("name,scan,dice\nft_a,p1,0.5\nft_a,p2,x\n")  # the long layout of earlier CSVs
    with pytest.raises(rr.ReportError, match="scans.csv: run ft_a, scan p2: dice 'x' is not a number"):
        rr.read_per_scan([path])
    path.write_text("name,scan,dice\nft_a,p1,0.5\nft_a,p2,0.25\n")
    long = rr.read_per_scan([path])
    keys, table = ex.per_scan_table({"ft_a": [("p2", "0.25"), ("p1", "0.5")], "ft_b": [("p3", "0.75")]})
    assert keys == ["name", "p1", "p2", "p3"] and table[1] == {"name": "ft_b", "p3": "0.75"}
    wide = ex.write_csv(table, keys, tmp_path / "wide.csv")
    assert wide.read_text().splitlines() == ["name,p1,p2,p3", "ft_a,0.5,0.25,", "ft_b,,,0.75"]
    assert rr.read_per_scan([wide]) == {"ft_a": [("p1", 0.5), ("p2", 0.25)], "ft_b": [("p3", 0.75)]}
    assert sorted(long["ft_a"]) == rr.read_per_scan([wide])["ft_a"]
    (tmp_path / "bad.csv").write_text("run,p1\nft_a,0.5\n")
    with pytest.raises(rr.ReportError, match="bad.csv: expected a 'name' column"):
        rr.read_per_scan([tmp_path / "bad.csv"])
    with pytest.raises(rr.ReportError, match="no such per-scan CSV"):
        rr.read_per_scan([tmp_path / "missing.csv"])


def test_per_scan_methods_narrows_the_hardest_scans_to_the_rows_named(tmp_path):
    # a report with many diagnostic rows keeps its per-scan and patient-group tables to the rows that matter
    cols = ["name", "kind", "method", "task", "labelled_scans", "seed", "lr", "paper_lr", "val_dice", "test_dice"]
    results = tmp_path / "r.csv"
    results.write_text(",".join(cols) + "\nft_a,finetune,Baseline,rv,1,0,1e-4,1e-4,0.3,0.2\n"
                       "ft_b,finetune,Baseline [dicece],rv,1,0,1e-4,1e-4,0.3,0.3\n")
    scans = tmp_path / "r_per_scan.csv"
    scans.write_text("name,p1,p2\nft_a,0.1,0.3\nft_b,0.2,0.4\n")
    rr.write_report([results], tmp_path / "all", per_scan=[scans])
    assert "**RV** (runs: Baseline 1, Baseline [dicece] 1)" in (tmp_path / "all" / "README.md").read_text()
    rr.write_report([results], tmp_path / "one", per_scan=[scans], per_scan_methods=["Baseline"])
    md = (tmp_path / "one" / "README.md").read_text()
    assert "**RV** (runs: Baseline 1)" in md and "| p1 | 10.0 |" in md
    assert "| Baseline [dicece] | **30.00** |" in md  # the protocol tables keep every row
    with pytest.raises(rr.ReportError, match=r"per_scan_methods \['Mean Teacher'\] are not rows of this report"):
        rr.write_report([results], tmp_path / "bad", per_scan=[scans], per_scan_methods=["Baseline", "Mean Teacher"])
    assert not (tmp_path / "bad").exists()  # refused before anything is written


def test_report_rejects_a_csv_without_results_columns(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("name,kind\nx,finetune\n")
    with pytest.raises(rr.ReportError, match="bad.csv: missing columns"):
        rr.write_report([bad], tmp_path / "out")


def test_a_run_in_several_csvs_is_taken_from_the_last_one(tmp_path):
    cols = ["name", "kind", "method", "task", "labelled_scans", "seed", "lr", "paper_lr", "val_dice", "test_dice"]
    old, new = tmp_path / "old.csv", tmp_path / "new.csv"
    old.write_text(",".join(cols) + "\nft_a,finetune,Baseline,lv,1,0,1e-4,1e-4,0.3,0.10\n"
                   "ft_b,finetune,Baseline,lv,1,1,1e-4,1e-4,0.3,0.20\n")
    new.write_text(",".join(cols) + "\nft_a,finetune,Baseline,lv,1,0,1e-4,1e-4,0.4,0.30\n")
    rows = rr.read_rows([old, new])
    assert sorted((r["name"], r["test_dice"]) for r in rows) == [("ft_a", 0.30), ("ft_b", 0.20)]
    assert rr.table(rr.select(rows, "paper"))[2][("Baseline", "lv", 1)][:1] == pytest.approx((25.0,))
    assert {r["name"]: r["test_dice"] for r in rr.read_rows([new, old])}["ft_a"] == 0.10
    # the same name from two presets is two runs, not a rerun: refused (CSVs written before the preset column: taken)
    fast, paper = tmp_path / "fast.csv", tmp_path / "paper.csv"
    fast.write_text(",".join(cols + ["preset"]) + "\nft_a,finetune,Baseline,lv,1,0,1e-4,1e-4,0.3,0.10,acdc_fast\n")
    paper.write_text(",".join(cols + ["preset"]) + "\nft_a,finetune,Baseline,lv,1,0,1e-4,2e-5,0.4,0.30,acdc_paper\n")
    with pytest.raises(rr.ReportError, match="paper.csv: run ft_a is from preset acdc_paper, but .*fast.csv holds"):
        rr.read_rows([fast, paper])
    assert len(rr.read_rows([old, paper])) == 2


def test_a_method_has_the_same_colour_in_every_panel_of_dice_vs_scans():
    import matplotlib.pyplot as plt

    def row(method, task, seed, dice):
        return {"kind": "finetune", "method": method, "task": task, "labelled_scans": 1, "seed": seed, "lr": 1e-4,
                "paper_lr": 1e-4, "val_dice": 0.5, "test_dice": dice}
    # "A" has no RV result, so RV's panel draws "B" first: its colour must still be B's
    rows = [row("A", "lv", 0, 0.3), row("B", "lv", 0, 0.6), row("B", "rv", 0, 0.5)]
    fig = rr.dice_vs_scans_figure(rows, "t")
    colours = {}
    for ax in fig.axes:
        for bars in ax.containers:  # one ErrorbarContainer per method and panel
            colours.setdefault(bars.get_label(), set()).add(bars.lines[0].get_color())
    plt.close(fig)
    assert set(colours) == {"A", "B"} and all(len(c) == 1 for c in colours.values())
    assert colours["A"] != colours["B"]
    styles = rr.method_styles([f"m{i}" for i in range(14)])
    assert len({tuple(v.values()) for v in styles.values()}) == 14  # more methods than colours: still distinct


def test_report_of_chosen_methods_keeps_only_their_rows_and_pretrainings(tmp_path):
    cols = ["name", "kind", "method", "init", "variant", "tag", "task", "labelled_scans", "seed", "lr", "paper_lr",
            "val_dice", "test_dice", "cq_nmi", "cq_LV", "cq_LV_per_scan"]
    csv_path = tmp_path / "r.csv"
    csv_path.write_text(",".join(cols) + "\n"
                        "pre_full,pretrain,,,full,,,,,,,,,0.1,0.5,0.4\n"
                        "pre_full_long,pretrain,,,full,long,,,,,,,,0.2,0.7,0.6\n"
                        "ft_r,finetune,Baseline,random,,,lv,1,0,1e-4,1e-4,0.3,0.25,,,\n"
                        "ft_rl,finetune,Baseline [long],random,,long,lv,1,0,1e-4,1e-4,0.4,0.33,,,\n"
                        "ft_f,finetune,Contrast (Enc) + Ours (Dec),pre_full,,,lv,1,0,1e-4,1e-4,0.5,0.45,,,\n"
                        "ft_fl,finetune,Contrast (Enc) + Ours (Dec) [long],pre_full_long,,long,lv,1,0,1e-4,1e-4,0.6,0.78,,,\n")
    rr.write_report([csv_path], tmp_path / "out", methods=["Baseline [long]", "Contrast (Enc) + Ours (Dec) [long]"])
    md = (tmp_path / "out" / "README.md").read_text()
    assert "| Baseline [long] | 33.00 |" in md and "| Contrast (Enc) + Ours (Dec) [long] | **78.00** |" in md
    ours = md.split("## The paper's Table 1")[0]
    assert "| Baseline |" not in ours and "| Contrast (Enc) + Ours (Dec) |" not in ours
    quality = md.split("## Cluster quality of the pre-trainings")[1]
    assert "[long]" in quality and "| 0.100 |" not in quality and "| 0.200 |" in quality
    with pytest.raises(rr.ReportError, match=r"methods \['Basline'\] are in none of"):
        rr.write_report([csv_path], tmp_path / "out2", methods=["Basline"])


def test_report_relabels_rows_of_the_same_settings_and_takes_one_lr_for_the_paper_table(tmp_path):
    cols = ["name", "kind", "method", "task", "labelled_scans", "seed", "lr", "paper_lr", "val_dice", "test_dice"]
    csv_path = tmp_path / "r.csv"
    csv_path.write_text(",".join(cols) + "\n"
                        "ft_aug,finetune,Baseline [longaug],lv,1,0,1e-4,1e-4,0.5,0.55\n"     # acdc_fast + a tag
                        "ft_paper,finetune,Baseline,lv,2,0,1e-4,2e-5,0.6,0.70\n"             # acdc_paper at 1e-4
                        "ft_paper_low,finetune,Baseline,lv,2,0,2e-5,2e-5,0.4,0.60\n")
    rr.write_report([csv_path], tmp_path / "out", relabel={"Baseline [longaug]": "Baseline"}, paper_lr=1e-4)
    md = (tmp_path / "out" / "README.md").read_text()
    paper = md.split("## Paper protocol")[1].split("## Each method")[0]
    assert "(0.0001 for every row, set for this report)" in paper
    assert "| Baseline | **55.00** | **70.00** |" in paper and "[longaug]" not in paper
    assert "rows `Baseline [longaug]` are reported as `Baseline`" in md
    # without the report's paper_lr each row keeps its preset's: the 2-scan cell is then the 2e-5 run
    rows = rr.read_rows([csv_path])
    rr.relabel_rows(rows, {"Baseline [longaug]": "Baseline"})
    assert sorted(r["test_dice"] for r in rr.select(rows, "paper")) == [0.55, 0.60]
    assert sorted(r["test_dice"] for r in rr.select(rows, "paper", 1e-4)) == [0.55, 0.70]
    with pytest.raises(rr.ReportError, match=r"relabel: methods \['Baseline \[lngaug\]'\] are in no row"):
        rr.relabel_rows(rr.read_rows([csv_path]), {"Baseline [lngaug]": "Baseline"})
    clash = tmp_path / "clash.csv"
    clash.write_text(csv_path.read_text() + "ft_aug2,finetune,Baseline [longaug],lv,2,0,1e-4,1e-4,0.5,0.50\n")
    with pytest.raises(rr.ReportError, match="runs ft_paper and ft_aug2 both give Baseline's cell lv, 2 scan"):
        rr.write_report([clash], tmp_path / "out2", relabel={"Baseline [longaug]": "Baseline"})
    # the runs of a consistency-weight search share every other key of a cell, and do not clash
    search = [_row("Mean Teacher", "lv", 1, 0, 1e-4, 0.5, 0.5, consistency_weight=w) for w in (0.0, 1.0)]
    search[1]["name"] += "_cw1"
    assert rr.relabel_rows(search + [_row("MT [x]", "lv", 1, 0, 1e-4, 0.5, 0.5)], {"MT [x]": "MT"})


# ------------------------------------------------------------------------------- end to end: bundles on demo data


@pytest.fixture(scope="module")
def smoke_work(tmp_path_factory):
    work = tmp_path_factory.mktemp("smoke")
    grid = ex.build_grid("smoke", None, work)
    counts = ex.run_grid(grid, work, jobs=2, log=print)
    assert counts["done"] == len(grid), counts
    return work, grid


def test_smoke_grid_runs_every_bundle_and_collects_one_row_per_run(smoke_work, tmp_path):
    work, grid = smoke_work
    path = ex.collect(work)
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert sorted(r["name"] for r in rows) == sorted(r.name for r in grid)
    seg = [r for r in rows if r["kind"] != "pretrain"]
    assert {r["method"] for r in seg} == {"Baseline", "Contrast (Enc) + Ours (Dec)", "Mean Teacher"}
    pre = [r for r in rows if r["kind"] == "pretrain"]  # each pre-training's clusters scored on the labelled val scans
    assert pre and all(0.0 <= float(r[f"cq_{n}{k}"]) <= 1.0 for r in pre for n in ("RV", "Myo", "LV")
                       for k in ("", "_per_scan", "_many_to_one", "_precision", "_recall"))
    for r in seg:
        assert 0.0 <= float(r["test_dice"]) <= 1.0 and int(r["test_scans"]) > 0
        assert r["command"].startswith("python -m monai.bundle run") and r["commit"] and r["preset"] == "smoke"
        bundle = {"finetune": "finetune_seg", "meanteacher": "meanteacher_seg"}[r["kind"]]
        version = json.loads((ROOT / "bundles" / bundle / "configs" / "metadata.json").read_text())["version"]
        assert r["bundle_version"] == version  # meanteacher_seg 0.7.2: CUDA graphs by default
        recorded = json.loads((work / "runs" / r["name"] / "run.json").read_text())["commands"][0]
        assert r["command"] == ex.portable_command(recorded) and "--output_dir RUN" in r["command"]
    # beside it, the Dice of every test scan of every segmentation run, whose mean is the run's test Dice
    # (one row per run, a column per scan; the rest of a run is its row of the results CSV)
    with open(path.with_name("results_per_scan.csv"), newline="") as f:
        scans = list(csv.DictReader(f))
    assert sorted(x["name"] for x in scans) == sorted(r["name"] for r in seg)
    for r in seg:
        mine = [float(v) for x in scans if x["name"] == r["name"] for k, v in x.items() if k != "name" and v]
        assert len(mine) == int(r["test_scans"]) and sum(mine) / len(mine) == pytest.approx(float(r["test_dice"]), abs=1e-5)
    read = rr.read_per_scan([path.with_name("results_per_scan.csv")])
    assert {name: len(d) for name, d in read.items()} == {r["name"]: int(r["test_scans"]) for r in seg}
    # the committed form: gzipped, both files, without a name or time stamp (the same rows, the same bytes), read as
    # the plain ones are; a name that is not a CSV's is refused before anything is written
    gz = ex.collect(work, str(work / "results_calls_X.csv.gz"))
    first = gz.read_bytes()
    assert ex.collect(work, str(gz)).read_bytes() == first and first[:2] == b"\x1f\x8b"
    assert rr.read_rows([gz]) == rr.read_rows([path])
    assert rr.read_per_scan([work / "results_calls_X_per_scan.csv.gz"]) == read
    with pytest.raises(ex.ExperimentError, match=r"results\.txt: a results CSV's name must end in \.csv or \.csv\.gz"):
        ex.collect(work, str(tmp_path / "results.txt"))
    assert not (tmp_path / "results.txt").exists()
    # resumable: a second call runs nothing
    assert ex.run_grid(grid, work, jobs=2, log=lambda s: None)["skipped_existing"] == len(grid)


def test_smoke_report_writes_tables_and_pngs(smoke_work, tmp_path):
    work, _ = smoke_work
    results = ex.collect(work)
    written = rr.write_report([results], tmp_path / "report", title="smoke",
                              per_scan=[results.with_name("results_per_scan.csv")])
    names = {p.name for p in written}
    assert {"README.md", "dice_vs_scans_paper.png", "dice_vs_scans_tuned.png", "cluster_panels.png"} <= names
    md = (tmp_path / "report" / "README.md").read_text()
    assert "| Baseline |" in md and "| MT + Ours | **90.25** |" in md  # ours, then the paper's table
    assert "## Cluster quality of the pre-trainings" in md and "| pre-training | LV | Myo | RV | NMI |" in md
    assert "## Hardest test scans" in md and "**LV** (runs: Baseline 1, Contrast (Enc) + Ours (Dec) 1, Mean Teacher 1)" in md
    for p in written:
        if p.suffix == ".png":
            assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_keeps_a_drawn_cluster_figure_when_the_pre_training_folders_are_gone(smoke_work, tmp_path):
    # the committed reports' panels were drawn from pre-training folders that never reach the repository: a later run
    # of the report must keep and link the PNG an earlier run drew, close the section with panels_note, and leave the
    # section out where no figure exists
    import shutil

    work, _ = smoke_work
    results = ex.collect(work)
    out = tmp_path / "report"
    assert out / "cluster_panels.png" in rr.write_report([results], out)
    drawn = (out / "cluster_panels.png").read_bytes()
    moved = tmp_path / "csv_only" / "results.csv"  # no runs/ beside it
    moved.parent.mkdir()
    shutil.copy(results, moved)
    written = rr.write_report([moved], out, panels_note="Made by hand:\n\n![more](more.png)\n")
    md = (out / "README.md").read_text()
    assert out / "cluster_panels.png" not in written and (out / "cluster_panels.png").read_bytes() == drawn
    section = md[md.index("## Cluster maps of the pre-training variants"):md.index("## Cluster quality")]
    assert section.endswith("![cluster panels](cluster_panels.png)\n\nMade by hand:\n\n![more](more.png)\n\n")
    rr.write_report([moved], tmp_path / "fresh", panels_note="Made by hand")
    assert "Cluster maps" not in (tmp_path / "fresh" / "README.md").read_text()


def test_panels_cli_draws_one_leases_cluster_maps_or_says_why_not(smoke_work, tmp_path):
    import shutil

    work, _ = smoke_work
    results = ex.collect(work)
    ex.CLI().panels(str(results), str(tmp_path / "lease.png"))
    assert (tmp_path / "lease.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    moved = tmp_path / "csv_only" / "results.csv"
    moved.parent.mkdir()
    shutil.copy(results, moved)
    with pytest.raises(ex.ExperimentError, match=r"none of their 1 pre-trainings has a cluster panel to draw"):
        ex.CLI().panels(f"[{moved}]", str(tmp_path / "none.png"))
    with pytest.raises(ex.ExperimentError, match="ablations must be True or False, got 'false'"):
        ex.CLI().panels(str(results), str(tmp_path / "x.png"), ablations="false")
    assert not (tmp_path / "none.png").exists() and not (tmp_path / "x.png").exists()


def test_method_names_with_spaces_survive_the_command_line(tmp_path):
    grid = ex.build_grid("acdc_fast", "/d", tmp_path, tasks="lv", counts=1, seeds=0, lrs=1e-4,
                         methods="Contrast (Enc) + Ours (Dec),Baseline")
    assert {r.meta.get("method") for r in grid if r.kind != "pretrain"} == {"Contrast (Enc) + Ours (Dec)", "Baseline"}


def test_ablation_rows_average_over_seeds_and_render(tmp_path):
    rows = [_row("Contrast (Enc) + Ours (Dec)", "lv", 1, s, 1e-4, 0.5, d, ablation="alpha", ablation_value=a)
            for a, ds in ((0.0, (0.2, 0.4)), (0.5, (0.6, 0.8))) for s, d in enumerate(ds)]
    abl = rr.ablation_rows(rows)
    assert [(p[0], round(p[1], 6), p[3]) for p in abl[("alpha", "lv", 1)]] == [(0.0, 30.0, 2), (0.5, 70.0, 2)]
    assert "each pre-training" not in "".join(rr.ablation_tables(abl))  # one pre-training per value: no such row
    png = rr.plot_ablations(abl, tmp_path / "ablations.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
    # the table puts the paper's ablation row of the same cell beside ours (its Table "Impact of alpha", LV 1 scan)
    md = rr.ablation_tables(abl)
    assert md[:4] == ["| alpha | 0 | 0.5 |", "|---|---|---|", "| LV, 1 scan, ours | 30.00 (10.00, n=2) | **70.00** (10.00, n=2) |",
                      "| LV, 1 scan, paper | 61.58 | 84.04 |"]
    assert rr.paper_ablation("num_clusters", "rv", 4, 60) == 76.39 and rr.paper_ablation("alpha", "lv", 1, 0.3) is None
    # ablation runs stay out of Table 1
    assert rr.table(rows)[0] == []


def test_a_value_pre_trained_twice_pools_its_runs_and_shows_each_pre_training(tmp_path):
    # alpha = 0 pre-trained twice (tags pre5k, pre5kb), 2 seeds each; alpha = 0.5 once: the cell pools all runs of a
    # value and a row gives each pre-training's mean, in the order met
    def row(value, init, seed, dice):
        return _row(f"Contrast (Enc) + Ours (Dec) [{init[-6:]}]", "lv", 1, seed, 1e-4, 0.5, dice, ablation="alpha",
                    ablation_value=value, init=init)

    rows = [row(0.0, "pre_full_alpha0_pre5k", 0, 0.2), row(0.0, "pre_full_alpha0_pre5k", 1, 0.4),
            row(0.0, "pre_full_alpha0_pre5kb", 0, 0.5), row(0.0, "pre_full_alpha0_pre5kb", 1, 0.7),
            row(0.5, "pre_full_alpha0.5_pre5k", 0, 0.8), row(0.5, "pre_full_alpha0.5_pre5k", 1, 0.8)]
    abl = rr.ablation_rows(rows)
    (a0, a5) = abl[("alpha", "lv", 1)]
    assert (a0[0], round(a0[1], 6), a0[3], [round(m, 6) for m in a0[5]]) == (0.0, 45.0, 4, [30.0, 60.0])
    assert (a5[3], a5[5]) == (2, [80.0])
    md = rr.ablation_tables(abl)
    assert "| LV, 1 scan, ours | 45.00 (18.03, n=4) | **80.00** (0.00, n=2) |" in md
    assert "| LV, 1 scan, each pre-training | 30.00 / 60.00 | 80.00 |" in md
    assert rr.plot_ablations(abl, tmp_path / "ablations.png").read_bytes()[:4] == b"\x89PNG"


def test_the_shared_default_point_fills_the_other_ablations_default_value(tmp_path):
    # the grid runs the default point (alpha 0.5, lambda_CC 1, K 40) once, as alpha = 0.5: the lambda_CC table
    # borrows it for lambda_CC = 1; K has no runs of its own, so no K table appears
    def row(key, value, seed, dice, method="Contrast (Enc) + Ours (Dec) [pre5k]"):
        return _row(method, "lv", 1, seed, 1e-4, 0.5, dice, ablation=key, ablation_value=value)

    assert ex.ablation_defaults("ours_mi_cc") == ex.ablation_defaults("full")  # the paper's ablated row: same point
    rows = [row(k, v, s, d) for k, v, ds in (("alpha", 0.0, (0.2, 0.4)), ("alpha", 0.5, (0.6, 0.8)),
                                              ("lambda_cc", 0.0, (0.1, 0.3)), ("lambda_cc", 4.0, (0.5, 0.5)))
            for s, d in enumerate(ds)]
    abl = rr.ablation_rows(rows)
    assert set(abl) == {("alpha", "lv", 1), ("lambda_cc", "lv", 1)}
    assert [(p[0], round(p[1], 6), p[3], p[4]) for p in abl[("alpha", "lv", 1)]] == [(0.0, 30.0, 2, ()), (0.5, 70.0, 2, ())]
    assert [(p[0], round(p[1], 6), p[3], p[4]) for p in abl[("lambda_cc", "lv", 1)]] == [
        (0.0, 20.0, 2, ()), (1.0, 70.0, 2, ("alpha", 0.5)), (4.0, 50.0, 2, ())]
    md = rr.ablation_tables(abl)
    assert "| lambda_CC | 0 | 1 | 4 |" in md
    assert "lambda_CC = 1 is the default point: the runs of alpha = 0.5, shared by the three ablations." in md
    assert not any(line.startswith("alpha = 0.5 is the default point") for line in md)
    assert rr.plot_ablations(abl, tmp_path / "ablations.png").read_bytes()[:4] == b"\x89PNG"
    # a variant carried by the rows picks its defaults; a tagless method label maps through experiments.METHODS
    assert rr._ablated_variant({"method": "Ours (Dec) MI+CC", "variant": ""}) == "ours_mi_cc"
    assert rr._ablated_variant({"method": "x", "variant": "full"}) == "full"
    # an older grid that ran lambda_CC = 1 itself keeps its own runs: nothing is borrowed
    own = rows + [row("lambda_cc", 1.0, s, d) for s, d in enumerate((0.9, 0.9))]
    abl = rr.ablation_rows(own)
    assert [(p[0], round(p[1], 6), p[4]) for p in abl[("lambda_cc", "lv", 1)]] == [
        (0.0, 20.0, ()), (1.0, 90.0, ()), (4.0, 50.0, ())]
    assert not any("is the default point" in line for line in rr.ablation_tables(abl))


def test_ablation_pretrainings_are_labelled_and_ordered_by_their_value():
    def pre(name, ablation="", **extra):
        return {"name": name, "kind": "pretrain", "variant": "full", "tag": "pre5k", "ablation": ablation, **extra}

    rows = [pre("pre_full_alpha1", "alpha1", alpha="1.0"), pre("pre_full"), pre("pre_full_k5", "num_clusters5"),
            pre("pre_full_alpha0.25", "alpha0.25", alpha="0.25")]
    assert [r["name"] for r in rr.sorted_pretrains(rows)] == ["pre_full", "pre_full_alpha0.25", "pre_full_alpha1",
                                                              "pre_full_k5"]
    assert rr._pretrain_label(rows[3], " ").endswith("(full) [pre5k] alpha=0.25")
    assert rr._pretrain_label(rows[2], " ").endswith("K=5") and rr._pretrain_label(rows[1], " ").endswith("[pre5k]")



def test_ablation_cluster_panels_put_each_ablation_on_a_row_of_its_own(tmp_path):
    from PIL import Image

    def pre(name, ablation, key, value):
        panel = tmp_path / f"{name}.png"  # a pretrain_bim panel: rows of four square tiles
        Image.new("RGB", (64, 16), (value * 40 % 255, 80, 120)).save(panel)
        return {"name": name, "kind": "pretrain", "variant": "full", "ablation": ablation, key: str(value),
                "panel": str(panel)}

    alpha = [pre("a0", "alpha0", "alpha", 0), pre("a1", "alpha1", "alpha", 1)]
    k = [pre("k5", "num_clusters5", "num_clusters", 5)]
    one = Image.open(rr.plot_cluster_panels(alpha, tmp_path / "one.png", ablations=True)).size
    two = Image.open(rr.plot_cluster_panels(alpha + k, tmp_path / "two.png", ablations=True)).size
    # alpha's two values on the first row, K's one on a second row: as wide, taller
    assert two[0] == one[0] and two[1] > 1.5 * one[1]
    assert rr.plot_cluster_panels(alpha, tmp_path / "none.png") is None  # not ablations: no variant panels here

def test_the_lr_chosen_table_names_the_cells_that_ran_at_one_lr_only():
    def row(method, task, n, seed, lr):
        return {"method": method, "task": task, "labelled_scans": n, "seed": seed, "lr": lr, "kind": "finetune"}

    rows = ([row("Baseline", "lv", 1, s, lr) for s in (0, 1) for lr in (2e-5, 1e-4)]
            + [row("Baseline", "myo", 2, 0, lr) for lr in (2e-5, 1e-4)] + [row("Baseline", "myo", 2, 1, 1e-4)]
            + [row("Baseline", "myo", 4, s, 1e-4) for s in (0, 1)]
            + [row("Baseline [long]", "lv", 1, 0, 1e-4), {**row("Baseline", "rv", 1, 0, 1e-4), "ablation": "alpha"}])
    assert rr.one_lr_lines(rows) == ["Where a seed ran at one LR only, the table shows that run, not a choice:", "",
                                     "- Baseline: Myo 2 (seed 1), Myo 4", "- one LR in every cell: Baseline [long]", ""]
    assert rr.one_lr_lines(rows[:4]) == []


def test_the_lr_chosen_tables_leave_out_the_tagged_rows_that_equal_the_paper_protocol(tmp_path):
    path = tmp_path / "r.csv"
    path.write_text("name,kind,method,task,labelled_scans,seed,lr,paper_lr,val_dice,test_dice\n" + "".join(
        f"{i},finetune,{m},lv,1,0,{lr},1e-4,{v},{d}\n" for i, (m, lr, v, d) in enumerate((
            ("Baseline", 2e-5, 0.7, 0.6), ("Baseline", 1e-4, 0.5, 0.5), ("IIC (Dec)", 1e-4, 0.5, 0.55),
            ("Baseline [long]", 1e-4, 0.5, 0.4), ("Ours (Dec) MI+CC [k10]", 1e-4, 0.5, 0.65),
            ("Baseline [odd]", 5e-4, 0.5, 0.3)))))  # [odd]: one LR, not the paper's, so in no paper table
    rr.write_report([path], tmp_path / "out")
    paper, tuned = (tmp_path / "out" / "README.md").read_text().split("## Paper protocol")[1].split("## Each method")
    assert "| Baseline [long] | 40.00 |" in paper and "| IIC (Dec) | 55.00 |" in paper
    mean, gap = (t[t.index("| method |"):].split("\n\n")[0] for t in tuned.split("Our mean minus the paper's")[:2])
    assert "| IIC (Dec) | 55.00 |" in mean and "| IIC (Dec) | -" in gap and "| Baseline [odd] | -" in gap
    assert "[long]" not in mean + gap and "[k10]" not in mean + gap
    assert "| Baseline | **60.00** |" in mean  # the best of the rows shown ([k10]'s 65.00 is in the paper table)
    assert ("- one LR in every cell: IIC (Dec), Baseline [long], Baseline [odd], Ours (Dec) MI+CC [k10] (Baseline "
            "[long], Ours (Dec) MI+CC [k10] are left out of this section's mean and gap tables: they equal the "
            "paper-protocol tables)") in tuned
    assert "| Baseline [long] | Baseline |" in tuned  # the run-for-run pairs keep every row


def test_paired_table_compares_run_for_run_and_takes_the_paper_gain_over_the_same_cells():
    def row(method, task, n, seed, dice):
        return {"method": method, "task": task, "labelled_scans": n, "seed": seed, "test_dice": dice / 100.0}

    rows = [row("Baseline", "lv", 1, 0, 50.0), row("Baseline", "lv", 1, 1, 60.0), row("Baseline", "rv", 2, 0, 40.0),
            row("Contrast (Enc) + Ours (Dec)", "lv", 1, 0, 80.0), row("Contrast (Enc) + Ours (Dec)", "lv", 1, 1, 55.0),
            row("Contrast (Enc) + Ours (Dec)", "rv", 2, 0, 70.0), row("Contrast (Enc) + Ours (Dec)", "rv", 4, 0, 90.0),
            row("Baseline [long]", "lv", 1, 0, 45.0), row("Ours (Dec) MI+CC [x]", "lv", 1, 0, 47.0)]
    lines = rr.paired_table(rows, {"Ours (Dec) MI+CC [x]": "Baseline [long]"})
    full = next(line for line in lines if line.startswith("| Contrast (Enc) + Ours (Dec) |"))
    # 3 pairs (RV 4 has no baseline run): +30, -5, +30 -> 2 wins, mean +18.3; paper: LV 1 twice, RV 2 once
    paper = ((84.48 - 67.13) * 2 + (79.73 - 60.50)) / 3
    # the sign test: 2 wins, 1 loss -> p = 2 * (C(3,2) + C(3,3)) / 8 = 1
    assert full == f"| Contrast (Enc) + Ours (Dec) | Baseline | 3 | 2 | 1.00 | +18.3 (-5.0 to +30.0) | {paper:+.1f} |"
    ours = next(line for line in lines if line.startswith("| Ours (Dec) MI+CC [x] |"))
    assert "| Baseline [long] | 1 | 1 | 1.00 | +2.0 (+2.0 to +2.0) | +16.9 |" in ours  # 84.04 - 67.13, the paper's rows
    assert any(line.startswith("| Baseline [long] | Baseline | 1 | 0 | 1.00 | -5.0") and line.endswith("| – |") for line in lines)
    assert "| method | against | pairs | wins | p | mean gain (range) | paper's gain |" in lines
    assert rr.paired_table([r for r in rows if r["method"] != "Baseline"]) == []  # no reference runs: no table


def test_paired_table_compares_a_method_with_each_of_several_references():
    def row(method, task, seed, dice):
        return {"method": method, "task": task, "labelled_scans": 2, "seed": seed, "test_dice": dice / 100.0}

    full = "Contrast (Enc) + Ours (Dec)"
    rows = [row("Baseline", "lv", 0, 50.0), row("Baseline", "lv", 1, 60.0), row("Contrast (Enc)", "lv", 0, 70.0),
            row("Contrast (Enc)", "lv", 1, 75.0), row(full, "lv", 0, 80.0), row(full, "lv", 1, 72.0)]
    lines = [line for line in rr.paired_table(rows, {full: ["Baseline", "Contrast (Enc)"]}) if line.startswith(f"| {full} |")]
    # against the baseline: +30, +12 (the paper's LV 2 cells: 87.85 - 74.49); against Contrast (Enc): +10, -3, and
    # no paper gain, since the paper publishes Contrast (Enc+Dec), not Contrast (Enc)
    assert lines == [f"| {full} | Baseline | 2 | 2 | 0.50 | +21.0 (+12.0 to +30.0) | {87.85 - 74.49:+.1f} |",
                     f"| {full} | Contrast (Enc) | 2 | 1 | 1.00 | +3.5 (-3.0 to +10.0) | – |"]
    with pytest.raises(rr.ReportError, match="pair_with\\['Contrast \\(Enc\\)'\\]: expected a row label or a list"):
        rr.paired_table(rows, {"Contrast (Enc)": 3})


def test_the_sign_test_gives_the_exact_binomial_tail_both_ways():
    # all of n pairs won: p = 2 / 2^n; 26 of 27 (MT + Ours against Mean Teacher): 2 * 28 / 2^27
    assert rr.sign_test_p(3, 0) == rr.sign_test_p(0, 3) == 0.25 and rr.sign_test_p(6, 0) == 2 / 64
    assert rr.sign_test_p(5, 1) == 2 * (6 + 1) / 64 and rr.sign_test_p(26, 1) == 2 * 28 / 2 ** 27
    assert rr.sign_test_p(2, 2) == rr.sign_test_p(0, 0) == 1.0  # capped at 1; no pairs, no evidence
    assert [rr._p_text(p) for p in (0.21875, 0.0078125, 4.2e-7)] == ["0.22", "0.008", "<0.001"]


def test_report_refuses_pair_with_labels_that_are_not_rows(tmp_path):
    fields = ["name", "kind", "method", "task", "labelled_scans", "seed", "lr", "paper_lr", "test_dice", "val_dice"]
    path = tmp_path / "r.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerow(dict(name="a", kind="finetune", method="Baseline", task="lv", labelled_scans=1, seed=0, lr=1e-4,
                        paper_lr=1e-4, test_dice=0.5, val_dice=0.5))
    with pytest.raises(rr.ReportError, match="pair_with names \\['Baseline \\[nope\\]'\\]"):
        rr.write_report([path], tmp_path / "out", pair_with={"Baseline": "Baseline [nope]"})
    with pytest.raises(rr.ReportError, match="pair_with names \\['IIC \\(Dec\\)'\\]"):  # in a list of references too
        rr.write_report([path], tmp_path / "out", pair_with={"Baseline": ["Baseline", "IIC (Dec)"]})
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_group_tables_split_the_test_dice_by_patient_group_and_detail_one_group(tmp_path):
    datalist = tmp_path / "datalist.json"
    datalist.write_text(json.dumps({
        "test": [{"scan": "p1_ED", "group": "NOR"}, {"scan": "p2_ED", "group": "DCM"}, {"scan": "p3_ED", "group": "DCM"}],
        "labelled_seed0_1": [{"scan": "p9_ES", "group": "HCM"}]}))
    scan_group, labelled = rr.read_groups(datalist)
    assert scan_group == {"p1_ED": "NOR", "p2_ED": "DCM", "p3_ED": "DCM"} and labelled == {"labelled_seed0_1": ["HCM"]}
    rows = [{"name": "b", "method": "Baseline", "task": "rv", "labelled_scans": 1, "seed": 0},
            {"name": "f", "method": "Contrast (Enc) + Ours (Dec)", "task": "rv", "labelled_scans": 1, "seed": 0}]
    per_scan = {"b": [("p1_ED", 0.10), ("p2_ED", 0.50), ("p3_ED", 0.70)], "f": [("p1_ED", 0.60), ("p2_ED", 0.80), ("p3_ED", 0.90)]}
    md = rr.group_tables(rows, per_scan, scan_group, labelled, focus="NOR")
    assert "| DCM (2) | 60.0 | 85.0 |" in md and "| NOR (1) | 10.0 | 60.0 |" in md
    assert "| RV | 1 | 0 | HCM | 10 / 60 | 60 / 85 |" in md  # NOR / the others, with the labelled scan's group
    with pytest.raises(rr.ReportError, match="group 'MINF' is not among"):
        rr.group_tables(rows, per_scan, scan_group, labelled, focus="MINF")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"test": [{"scan": "p1_ED"}]}))
    with pytest.raises(rr.ReportError, match="bad.json: expected a 'test' list whose items have 'scan' and 'group'"):
        rr.read_groups(bad)
    with pytest.raises(rr.ReportError, match="need per_scan"):
        rr.write_report([tmp_path / "none.csv"], tmp_path / "out", groups=str(datalist))
    assert not (tmp_path / "out").exists()


def test_the_committed_paper_length_report_is_what_its_script_makes_of_its_csvs(tmp_path):
    # docs/results/acdc_paper_length/README.md holds the headline numbers: it must stay what report.sh gives from the
    # committed CSVs and notes. Left out here: the test Dice by patient group (it needs the full ACDC set's datalist).
    # The cluster panels are drawn from pre-training folders that are not in the repository: the committed PNG is kept
    import os
    import shutil
    import subprocess

    folder = ROOT / "docs" / "results" / "acdc_paper_length"
    shutil.copy(folder / "cluster_panels.png", tmp_path)
    subprocess.run(["bash", str(folder / "report.sh"), "none", str(tmp_path)], check=True, capture_output=True,
                   env={**os.environ, "PYTHON": sys.executable})
    committed = (folder / "README.md").read_text()
    start = committed.index("## Test Dice by patient group")
    committed = committed[:start] + committed[committed.index("\n## ", start) + 1:]
    assert (tmp_path / "README.md").read_text() == committed
    assert (tmp_path / "table_cells.json").read_text() == (folder / "table_cells.json").read_text()
    assert "![cluster panels of the decdiag calls](cluster_panels_decdiag.png)" in committed  # report_panels_note.md
    assert "| Contrast (Enc) + Ours (Dec) | Baseline | 27 | 26 | <0.001 | +14.9 (-2.6 to +46.0) | +14.6 |" in committed


@pytest.mark.parametrize("name, line", [
    # the [pre10k] rows are paired with the baseline of their own fine-tuning length and augmentation
    ("acdc_fast", "| Contrast (Enc) + Ours (Dec) [pre10k] | Baseline [long] | 15 | 15 | <0.001 | +31.6 (+14.5 to +52.3) | +16.9 |"),
    ("promise12_fast", "| Contrast (Enc) + Ours (Dec) | Baseline | 3 | 2 | 1.00 | +0.2 (-2.7 to +2.8) | +10.9 |"),
    # the p12 to p12e calls: Baseline and the full method at the paper's lengths, then Mean Teacher and MT + Ours at
    # 4 / 6 / 8 scans, seeds 0-2, MT + Ours paired with Mean Teacher (the paper's claim between the two)
    ("promise12_paper_length", "| Baseline | 76.93 (2.69) | 81.15 (1.42) | 82.78 (1.32) |"),
    ("promise12_paper_length", "| MT + Ours | Mean Teacher | 9 | 5 | 1.00 | +0.3 (-1.6 to +2.7) | +0.7 |"),
])
def test_the_committed_fast_reports_are_what_their_scripts_make_of_their_csvs(tmp_path, name, line):
    # docs/results/*_fast/README.md (and promise12_paper_length's) must stay what report.sh gives from the committed CSVs and note (the cluster
    # panels, drawn from pre-training folders that are not in the repository, kept from the committed PNG)
    import os
    import shutil
    import subprocess

    folder = ROOT / "docs" / "results" / name
    shutil.copy(folder / "cluster_panels.png", tmp_path)
    subprocess.run(["bash", str(folder / "report.sh"), str(tmp_path)], check=True, capture_output=True,
                   env={**os.environ, "PYTHON": sys.executable})
    committed = (folder / "README.md").read_text()
    assert (tmp_path / "README.md").read_text() == committed
    assert (tmp_path / "table_cells.json").read_text() == (folder / "table_cells.json").read_text()
    assert line in committed


def test_the_committed_ablation_report_is_what_its_script_makes_of_its_csvs(tmp_path):
    # docs/results/acdc_ablation/README.md must stay what report.sh gives from the committed CSVs and note (the
    # cluster panels, drawn from pre-training folders that are not in the repository, kept from the committed PNG)
    import os
    import shutil
    import subprocess

    folder = ROOT / "docs" / "results" / "acdc_ablation"
    shutil.copy(folder / "cluster_panels_ablations.png", tmp_path)
    subprocess.run(["bash", str(folder / "report.sh"), str(tmp_path)], check=True, capture_output=True,
                   env={**os.environ, "PYTHON": sys.executable})
    committed = (folder / "README.md").read_text()
    assert (tmp_path / "README.md").read_text() == committed
    assert (tmp_path / "table_cells.json").read_text() == (folder / "table_cells.json").read_text()
    # alpha = 0: calls R's pre-training and the abl2 calls' second one (pre-training seed 1), 3 seeds each
    assert "| LV, 1 scan, ours | 61.36 (10.49, n=6) |" in committed
    assert "| LV, 1 scan, each pre-training | 59.52 / 63.21 |" in committed
    # lambda_CC and K: calls T's pre-training, the abl3 calls' second one and, for lambda_CC = 0, K = 20 and the default
    # point (alpha 0.5, lambda_CC 1, K 40, which the three ablations share), the abl4 call's third (pre-training seed 2)
    assert ("| LV, 1 scan, each pre-training | 68.40 / 73.31 / 73.42 | 64.83 / 67.50 | 70.57 / 68.99 / 67.74 | "
            "75.59 / 58.15 |") in committed
    assert "| LV, 1 scan, ours | 68.36 (7.23, n=6) | 67.66 (9.65, n=6) | **71.17** (6.08, n=9) | 69.10 (7.67, n=9) |" in committed


@pytest.mark.parametrize("tool, call", [
    ("benchmark_pretrain", lambda m: m.main(compile="false")),
    ("benchmark_meanteacher", lambda m: m.main(compile="false")),
    ("benchmark_inference", lambda m: m.main(amp="false")),
])
def test_the_benchmarks_refuse_a_lowercase_boolean_before_they_start(tool, call):
    # fire hands --compile false over as the string 'false', which bool() takes for true: the run would have
    # measured the compiled step under a flag that reads "false"; each tool stops first, naming the key and spelling
    import importlib

    key = "amp" if tool == "benchmark_inference" else "compile"
    with pytest.raises(ValueError, match=rf"{key} must be True or False, got 'false' \(write --{key} False\)"):
        call(importlib.import_module(tool))


def test_the_mean_teacher_benchmark_sets_cudnn_and_the_teacher_forward_as_the_bundles_do(tmp_path):
    # before --cudnn_deterministic it always autotuned, unlike the bundles; now it follows the flag (default: what the
    # step's bundle sets, autotuned for meanteacher_seg since 0.7.1, deterministic for finetune_seg's supervised step)
    # and says which it measured; likewise the teacher's forwards (default: meanteacher_seg's separate)
    import subprocess

    tiny = ["--batch_size", "2", "--unlabelled_batch_size", "2", "--size", "32", "--iterations", "1", "--warmup", "1",
            "--features", "4,4,8,8,16,4"]
    for flag, det, joint in (([], False, False),
                             (["--method", "supervised", "--unlabelled_batch_size", "0"], True, False),
                             (["--cudnn_deterministic", "True", "--joint_teacher_batch", "True"], True, True)):
        proc = subprocess.run([sys.executable, str(ROOT / "tools" / "benchmark_meanteacher.py"), *tiny, *flag],
                              capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        assert (result["cudnn_deterministic"], result["joint_teacher_batch"]) == (det, joint)


def test_a_plan_dry_run_flag_must_be_a_bool(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(ex, "run_grid", lambda *a, **k: ran.append(1))
    with pytest.raises(ex.ExperimentError, match=r"dry_run must be True or False, got 'false' \(write --dry_run False\)"):
        ex.CLI().run_plan(str(ROOT / "docs/results/gpu_calls/plans/y.json"), "/d", str(tmp_path), dry_run="false")
    assert not ran


def _stand_in_bin(tmp_path, machine_gpus, prints=""):
    """A bin folder for n.sh's tests: a python that records each command and its GPUs (and prints ``prints``) but
    passes ``python -c`` (n.sh's import check) unrecorded, an nvidia-smi that lists ``machine_gpus`` GPUs."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls.txt"
    bin_dir.mkdir()
    echo = f'echo "{prints}"\n' if prints else ""
    (bin_dir / "python").write_text(
        f'#!/usr/bin/env bash\n[ "$1" = -c ] && exit 0\necho "$CUDA_VISIBLE_DEVICES|$*" >> {calls}\n{echo}')
    listing = "".join(f"echo 'GPU {i}: stand-in'\n" for i in range(machine_gpus))
    (bin_dir / "nvidia-smi").write_text(f"#!/usr/bin/env bash\n{listing}")
    for tool in ("python", "nvidia-smi"):
        (bin_dir / tool).chmod(0o755)
    return bin_dir, calls


def _run_n_sh(tmp_path, bin_dir, seconds, phase, **env):
    """``bash n.sh SECONDS PHASE`` with the stand-ins of ``bin_dir`` first on PATH, its work root and $OUT in
    ``tmp_path``, its unpacked data packs in ``tmp_path / "data"`` unless ``env`` says N_DATA; ``env`` adds
    variables (FIRST, GPUS, JOBS...)."""
    import os
    import subprocess

    (tmp_path / "out").mkdir(exist_ok=True)
    run_env = {"N_DATA": str(tmp_path / "data"), **os.environ, **env, "PATH": f"{bin_dir}:{os.environ['PATH']}",
               "BIM_GIT_COMMIT": "x", "N_TMP": str(tmp_path / "w"), "OUT": str(tmp_path / "out")}
    return subprocess.run(["bash", str(ROOT / "docs" / "results" / "gpu_calls" / "n.sh"), str(seconds), phase],
                          cwd=ROOT, env=run_env, capture_output=True, text=True, timeout=120)


def test_n_sh_stage_prepares_the_data_and_nothing_else(tmp_path):
    # a lease whose later calls carry .carry/PHASE instead of the ACDC pack: its first call stages the machine
    bin_dir, calls = _stand_in_bin(tmp_path, 4)
    raw = tmp_path / "data" / "acdc_u8" / "training"
    raw.mkdir(parents=True)
    done = _run_n_sh(tmp_path, bin_dir, 120, "stage")
    assert done.returncode == 0 and "staged:" in done.stdout, done.stdout + done.stderr
    lines = [line.split("|")[1] for line in calls.read_text().splitlines()]
    assert lines == [f"-m data_prep acdc {raw} {tmp_path / 'w' / 'acdc'} --workers 16"]
    assert not list((tmp_path / "out").iterdir())  # no results tar: nothing ran


def test_n_sh_stops_at_once_on_a_machine_that_is_not_staged(tmp_path):
    # a call that carries .carry/PHASE lands on a fresh machine (the lease's staging call was more than 30 s before):
    # one clear line, before anything is restored or started, instead of a failed data_prep and ten lost minutes
    bin_dir, calls = _stand_in_bin(tmp_path, 4)
    done = _run_n_sh(tmp_path, bin_dir, 588, "rows2")
    assert done.returncode == 2 and "this machine is not staged" in done.stdout
    assert str(tmp_path / "data" / "acdc_u8" / "training") in done.stdout and not calls.exists()


@pytest.mark.parametrize("phase, env, expected", [
    # decdiag's first call: its four pre-trainings, one a GPU, and nothing else (REST_GPUS none)
    ("decdiag", {}, [("0,1,2,3", "decdiag.json", "--gpus 4 --jobs 4 --only [\"pre_*\"]")]),
    ("decdiag2", {}, [("0,1,2,3", "decdiag2.json", "--gpus 4 --jobs 4 --only [\"pre_*\"]")]),
    # rows2's: three pre-trainings on GPUs 0-2, the runs that need none on GPU 3
    ("rows2", {"JOBS": "3"}, [("0,1,2", "rows2.json", "--gpus 3 --jobs 3 --only [\"pre_*\"]"),
                              ("3", "rows2.json", "--gpus 1 --jobs 3 --only [\"ft_random_*\"]")]),
    # mt2's: pre_full alone on GPU 0, the random-init Mean Teacher runs on GPUs 1-3, two a GPU
    ("mt2", {"JOBS": "6"}, [("0", "mt2.json", "--gpus 1 --jobs 1 --only [\"pre_full\"]"),
                            ("1,2,3", "mt2.json", "--gpus 3 --jobs 6 --only [\"mt_random_*\"]")]),
    # on a 2-GPU machine (the z calls' lease) the rest goes to the GPU the pre-training leaves; on one GPU, beside it
    ("mt2", {"JOBS": "2", "machine_gpus": 2}, [("0", "mt2.json", "--gpus 1 --jobs 1 --only [\"pre_full\"]"),
                                               ("1", "mt2.json", "--gpus 1 --jobs 2 --only [\"mt_random_*\"]")]),
    ("mt2", {"JOBS": "2", "machine_gpus": 1}, [("0", "mt2.json", "--gpus 1 --jobs 1 --only [\"pre_full\"]"),
                                               ("0", "mt2.json", "--gpus 1 --jobs 2 --only [\"mt_random_*\"]")]),
    ("mt3", {"JOBS": "6"}, [("0", "mt3.json", "--gpus 1 --jobs 1 --only [\"pre_full\"]"),
                            ("1,2,3", "mt3.json", "--gpus 3 --jobs 6 --only [\"mt_random_*\"]")]),
    ("mt4", {"JOBS": "6"}, [("0", "mt4.json", "--gpus 1 --jobs 1 --only [\"pre_full\"]"),
                            ("1,2,3", "mt4.json", "--gpus 3 --jobs 6 --only [\"mt_random_*\"]")]),
    ("mtlr", {"JOBS": "6"}, [("0", "mtlr.json", "--gpus 1 --jobs 1 --only [\"pre_full\"]"),
                             ("1,2,3", "mtlr.json", "--gpus 3 --jobs 6 --only [\"mt_random_*\"]")]),
    # rows2 on 2 x H100 or more: IIC (Dec)'s pre-training on GPU 0 and [dicece] six on GPU 1 (the rows2a calls, as
    # run); Contrast (Enc)'s and Ours (Dec)'s pre-trainings, nothing else (the rows2b calls on 4 x H100, as run);
    # then on a staged machine pre_full for mtlr12's rest on GPU 0 and the two carried LR runs on GPU 1
    ("rows2", {"JOBS": "6", "PRE": '["pre_iic_dec"]', "PRE_GPUS": "0", "REST_GPUS": "1", "REST": '["ft_random_*"]',
               "machine_gpus": 2},
     [("0", "rows2.json", "--gpus 1 --jobs 1 --only [\"pre_iic_dec\"]"),
      ("1", "rows2.json", "--gpus 1 --jobs 6 --only [\"ft_random_*\"]")]),
    ("rows2", {"PRE": '["pre_contrast_enc", "pre_ours_mi_cc"]', "PRE_GPUS": "0,1", "REST_GPUS": "none"},
     [("0,1", "rows2.json", "--gpus 2 --jobs 2 --only [\"pre_contrast_enc\", \"pre_ours_mi_cc\"]")]),
    ("rows2", {"JOBS": "2", "PRE": '["pre_full"]', "PRE_GPUS": "0", "REST_GPUS": "1", "REST": '["ft_pre_contrast_enc_*"]',
               "machine_gpus": 2},
     [("0", "rows2.json", "--gpus 1 --jobs 1 --only [\"pre_full\"]"),
      ("1", "rows2.json", "--gpus 1 --jobs 2 --only [\"ft_pre_contrast_enc_*\"]")]),
    # mtlr12, one seed a lease: REST narrows the first call's random-init runs to that seed
    ("mtlr12", {"JOBS": "6", "REST": '["mt_random_*_s1_*"]'},
     [("0", "mtlr12.json", "--gpus 1 --jobs 1 --only [\"pre_full\"]"),
      ("1,2,3", "mtlr12.json", "--gpus 3 --jobs 6 --only [\"mt_random_*_s1_*\"]")]),
])
def test_n_sh_first_call_starts_the_runners_its_phase_needs(tmp_path, phase, env, expected):
    # a GPU call that starts the wrong runners costs ten minutes of the session's thirty: run n.sh's FIRST branch
    # with a stand-in python that records each command and the GPUs it was given
    env = dict(env)
    bin_dir, calls = _stand_in_bin(tmp_path, env.pop("machine_gpus", 4))
    (tmp_path / "w" / "acdc").mkdir(parents=True)
    (tmp_path / "w" / "acdc" / "datalist.json").write_text("{}")  # no data preparation
    runs = tmp_path / "w" / "n" / phase / "runs"  # finished pre-trainings: probed unless probed already or Contrast (Enc)
    for name in ("pre_full_ctl", "pre_ours_mi_cc_cc0", "pre_ours_mi_cc_rep", "pre_contrast_enc"):
        (runs / name).mkdir(parents=True)
        (runs / name / "checkpoint_final.pt").write_bytes(b"")
    (runs / "pre_ours_mi_cc_rep" / "path_dependence_validation.json").write_text("{}")
    done = _run_n_sh(tmp_path, bin_dir, 100, phase, FIRST="1", **env)
    assert done.returncode == 0 and f"phase {phase} ended" in done.stdout
    runners = sorted(line.split("|") for line in calls.read_text().splitlines() if " run_plan " in f" {line} ")
    assert len(runners) == len(expected)
    for (gpus, args), (want_gpus, plan, want_args) in zip(runners, sorted(expected)):
        assert gpus == want_gpus and f"plans/{plan}" in args and want_args in args
        assert f"--work_dir {tmp_path / 'w' / 'n' / phase} " in args
    # then the path probe (experiments.py probe) of each finished pre-training that lacks one
    probes = sorted(line.split("|")[1] for line in calls.read_text().splitlines() if " probe " in f" {line} ")
    assert [p.split("/runs/")[1] for p in probes] == ["pre_contrast_enc/", "pre_full_ctl/", "pre_ours_mi_cc_cc0/"]


@pytest.mark.parametrize("first, env, message", [
    ("1", {}, "PRE_GPUS=0,1,2,3: this machine has 2 GPU(s), 0,1"),  # decdiag2's four pre-trainings, one a GPU
    ("0", {"GPUS": "0,1,2,3"}, "GPUS=0,1,2,3: this machine has 2 GPU(s), 0,1"),
])
def test_n_sh_refuses_gpus_the_machine_lacks_before_it_starts_anything(tmp_path, first, env, message):
    # a runner given a GPU the machine lacks fails each of its runs, a whole call lost: n.sh stops at once instead
    bin_dir, calls = _stand_in_bin(tmp_path, 2)
    (tmp_path / "w" / "acdc").mkdir(parents=True)
    (tmp_path / "w" / "acdc" / "datalist.json").write_text("{}")
    done = _run_n_sh(tmp_path, bin_dir, 100, "decdiag2", FIRST=first, **env)
    assert done.returncode == 2 and message in done.stdout
    assert not calls.exists() or " run_plan " not in calls.read_text()


def test_n_sh_bench3_needs_no_data_and_times_both_steps_at_both_cudnn_settings(tmp_path):
    # bench3 fills a lease's spare minutes on any pack: it must not prepare data (there may be none), and must time
    # finetune_seg's step and the Mean Teacher step, each setting twice, on GPU 0 alone
    bin_dir, calls = _stand_in_bin(tmp_path, 1, prints="{}")
    done = _run_n_sh(tmp_path, bin_dir, 300, "bench3")
    assert done.returncode == 0, done.stderr
    lines = [line.split("|") for line in calls.read_text().splitlines()]
    assert not any("data_prep" in args for _, args in lines)
    runs = [args for gpus, args in lines if "benchmark_meanteacher.py" in args and gpus == "0"]
    assert len(runs) == len(lines) == 8
    for det in ("True", "False"):
        for step in ("--method supervised", "--unlabelled_batch_size 5"):
            assert sum(step in a and a.endswith(f"--cudnn_deterministic {det}") for a in runs) == 2, (step, det)
    assert (tmp_path / "out" / "bench3.jsonl").read_text().count("{}") == 8


def test_n_sh_bench6_runs_the_bundle_with_the_eager_then_the_compiled_teacher(tmp_path):
    # bench6 (the compiled teacher over the bundle's epochs): two meanteacher_seg runs on the prepared ACDC set, the
    # eager teacher first (half the time left), then the compiled one, each into its own folder, the log to $OUT
    bin_dir, calls = _stand_in_bin(tmp_path, 1)
    (tmp_path / "w" / "acdc").mkdir(parents=True)
    (tmp_path / "w" / "acdc" / "datalist.json").write_text("{}")
    done = _run_n_sh(tmp_path, bin_dir, 300, "bench6")
    assert done.returncode == 0, done.stderr
    runs = [args for _, args in (line.split("|") for line in calls.read_text().splitlines())]
    assert len(runs) == 2 and all("meanteacher_seg/configs/train.json" in a for a in runs)
    for args, value in zip(runs, ("False", "True")):
        assert f"--compile_teacher {value} " in args and f"--output_dir {tmp_path / 'w'}/mt_compile_teacher_{value}" in args
        assert "--compile_mode" not in args  # the bundle's default mode: CUDA graphs
    log = (tmp_path / "out" / "bench6.log").read_text()
    assert "compile_teacher False: rc 0" in log and "compile_teacher True: rc 0" in log


def test_n_sh_bench4_times_the_teacher_forwards_on_gpu_0_and_cudnn_on_gpu_1(tmp_path):
    # bench4: the Mean Teacher step only, no data; GPU 0 separate against joint teacher forwards (deterministic, the
    # bundle's default), GPU 1 deterministic against autotuned with the separate forwards; each setting twice
    bin_dir, calls = _stand_in_bin(tmp_path, 2, prints="{}")
    done = _run_n_sh(tmp_path, bin_dir, 400, "bench4")
    assert done.returncode == 0, done.stderr
    lines = [line.split("|") for line in calls.read_text().splitlines()]
    assert len(lines) == 8 and all("benchmark_meanteacher.py" in a and "--unlabelled_batch_size 5" in a for _, a in lines)
    by_gpu = {g: [a.split("--compile True ")[1] for gpu, a in lines if gpu == g] for g in ("0", "1")}
    assert sorted(by_gpu["0"]) == sorted(f"--cudnn_deterministic True --joint_teacher_batch {j}"
                                         for j in ("False", "False", "True", "True"))
    assert sorted(by_gpu["1"]) == sorted(f"--cudnn_deterministic {d} --joint_teacher_batch False"
                                         for d in ("False", "False", "True", "True"))
    assert all((tmp_path / "out" / f"bench4_gpu{g}.jsonl").read_text().count("{}") == 4 for g in "01")


def test_n_sh_later_call_probes_the_pre_trainings_that_end_during_it(tmp_path):
    # a later call probes its finished pre-trainings first, in the background, and again after its runner: one that
    # resumed and ended in the call (the decdiag calls' [rep] and [ctl]) is probed too, and none twice
    import os
    import subprocess

    bin_dir, calls = tmp_path / "bin", tmp_path / "calls.txt"
    runs = tmp_path / "w" / "n" / "decdiag2" / "runs"
    bin_dir.mkdir()
    # the stand-in runner "finishes" a pre-training that was cut in the call before
    (bin_dir / "python").write_text(f'#!/usr/bin/env bash\necho "$CUDA_VISIBLE_DEVICES|$*" >> {calls}\n'
                                    f'case " $* " in *" run_plan "*) sleep 1; touch {runs}/pre_full_con01/checkpoint_final.pt;; esac\n')
    (bin_dir / "python").chmod(0o755)
    (tmp_path / "w" / "acdc").mkdir(parents=True)
    (tmp_path / "w" / "acdc" / "datalist.json").write_text("{}")
    (tmp_path / "out").mkdir()
    for name in ("pre_ours_mi_cc_k10", "pre_full_con01"):
        (runs / name).mkdir(parents=True)
    (runs / "pre_ours_mi_cc_k10" / "checkpoint_final.pt").write_bytes(b"")
    run_env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "BIM_GIT_COMMIT": "x",
               "N_TMP": str(tmp_path / "w"), "OUT": str(tmp_path / "out")}
    done = subprocess.run(["bash", str(ROOT / "docs" / "results" / "gpu_calls" / "n.sh"), "100", "decdiag2"], cwd=ROOT,
                          env=run_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "phase decdiag2 ended" in done.stdout
    lines = calls.read_text().splitlines()
    runner = [i for i, x in enumerate(lines) if " run_plan " in f" {x} "]
    assert len(runner) == 1 and "--gpus 4 --jobs 14" in lines[runner[0]]
    probes = [(i, x.split("/runs/")[1]) for i, x in enumerate(lines) if " probe " in f" {x} "]
    # k10 (the stand-in writes no JSON, so the second pass probes it again: on the GPU its JSON would exist by then)
    assert [p for _, p in probes if p == "pre_full_con01/"] == ["pre_full_con01/"]
    assert all(i > runner[0] for i, p in probes if p == "pre_full_con01/") and probes[0][1] == "pre_ours_mi_cc_k10/"
    # then the unfinished runs' progress, so that the lease's next call can be narrowed before it starts
    progress = [i for i, x in enumerate(lines) if x.endswith(f" progress {tmp_path / 'w' / 'n' / 'decdiag2'}")]
    assert len(progress) == 1 and progress[0] > runner[0] and "-- unfinished runs" in done.stdout


def _carried_lease(tmp_path, data: str, phase: str, carried: dict, weights=()):
    """A device machine for n.sh's restore: ``python`` a stand-in that logs ``$CUDA_VISIBLE_DEVICES|ARGS`` to the
    returned calls file, ``data``'s prepared datalist, and the carry ``tmp_path / "carry"``: ``n_PHASE.tgz`` holding
    ``carried`` (paths under ``n/`` -> text) and an empty ``NAME_fp16.pt`` per ``weights``. Returns (calls file, carry,
    the environment for ``n.sh``)."""
    import os
    import tarfile

    bin_dir, calls, carry, src = tmp_path / "bin", tmp_path / "calls.txt", tmp_path / "carry", tmp_path / "src" / "n"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f'#!/usr/bin/env bash\necho "$CUDA_VISIBLE_DEVICES|$*" >> {calls}\n')
    (bin_dir / "python").chmod(0o755)
    (tmp_path / "w" / data).mkdir(parents=True)
    (tmp_path / "w" / data / "datalist.json").write_text("{}")
    (tmp_path / "out").mkdir()
    for rel, text in carried.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    carry.mkdir()
    with tarfile.open(carry / f"n_{phase}.tgz", "w:gz") as tar:
        tar.add(src, arcname="n")
    for name in weights:
        (carry / f"{name}_fp16.pt").write_bytes(b"")
    return calls, carry, {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "BIM_GIT_COMMIT": "x",
                          "CARRY": str(carry), "N_TMP": str(tmp_path / "w"), "OUT": str(tmp_path / "out"), "N_GPUS": "4"}


def test_n_sh_restores_a_carried_work_dir_before_its_runner(tmp_path):
    # the p12 calls brought back their results tar and pre_full's weights in float16; the next lease's first call
    # must unpack both (model.pt back in float32) before the runner starts, so that it skips the 28 finished runs
    # and fine-tunes from that pre-training; a later call of the same lease must not restore over the work dir, and
    # WEIGHTS_OUT sends the weights of the pre-trainings that have them back in float16
    import subprocess

    calls, carry, run_env = _carried_lease(tmp_path, "promise12", "p12", {
        f"p12/runs/{name}/result.json": "{}" for name in ("pre_full", "ft_random_prostate_n4_s0_lr2e-4")}, ["pre_full"])
    for call in (1, 2):
        if call == 2:  # the lease's last call sends the pre-training's weights back for the lease after
            run_env["WEIGHTS_OUT"] = "pre_full pre_missing"
            (tmp_path / "w" / "n" / "p12" / "runs" / "pre_full" / "model.pt").write_bytes(b"")
        done = subprocess.run(["bash", str(ROOT / "docs" / "results" / "gpu_calls" / "n.sh"), "100", "p12"], cwd=ROOT,
                              env=run_env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "phase p12 ended" in done.stdout
        # no PNG to send (the carried pre-training has no panels, PNG_RUNS is none): no empty tar, no tar error
        assert "Cowardly" not in done.stderr and not (tmp_path / "out" / "n_p12_png.tgz").exists()
        restored = f"restored {tmp_path / 'w' / 'n' / 'p12'} from {carry}: 2 finished runs"
        assert (restored in done.stdout) if call == 1 else ("restored" not in done.stdout)
    lines = calls.read_text().splitlines()
    work = tmp_path / "w" / "n" / "p12"
    assert (work / "runs" / "ft_random_prostate_n4_s0_lr2e-4" / "result.json").is_file()
    weights = [i for i, x in enumerate(lines) if " weights " in f" {x} "]
    runners = [i for i, x in enumerate(lines) if " run_plan " in f" {x} "]
    assert len(weights) == 2 and len(runners) == 2 and weights[0] < runners[0] < runners[1] < weights[1]
    assert lines[weights[0]].endswith(f"weights {carry}/pre_full_fp16.pt {work}/runs/pre_full/model.pt --dtype float32")
    assert lines[weights[1]].endswith(f"weights {work}/runs/pre_full/model.pt {tmp_path / 'out'}/pre_full_fp16.pt "
                                      "--dtype float16")


def test_n_sh_restores_a_carry_into_the_work_dir_this_lease_started_without_replacing_its_files(tmp_path):
    # an ACDC lease whose first call carried .device and began a pre-training in the plan's work dir: the next call,
    # carrying .carry/PHASE, must still restore the carried runs and weights, but never over this lease's own files
    # (its newer log, its pre-training's weights), and the call after it must not restore again
    import subprocess

    carried = {f"rows2/runs/{name}/result.json": '{"lease": "carried"}'
               for name in ("pre_contrast_enc", "ft_pre_contrast_enc_lv_n4_s0_lr1e-4", "pre_full")}
    calls, carry, run_env = _carried_lease(tmp_path, "acdc", "rows2", {**carried, "rows2.out": "the carried log"},
                                           ["pre_contrast_enc", "pre_full"])
    work = tmp_path / "w" / "n" / "rows2"
    (work / "runs" / "pre_full").mkdir(parents=True)  # this lease's first call: pre_full ended, its log written
    (work / "runs" / "pre_full" / "result.json").write_text('{"lease": "this"}')
    (work / "runs" / "pre_full" / "model.pt").write_text("this lease's weights")
    (tmp_path / "w" / "n" / "rows2.out").write_text("this lease's log")
    for call in (2, 3):
        done = subprocess.run(["bash", str(ROOT / "docs" / "results" / "gpu_calls" / "n.sh"), "100", "rows2"],
                              cwd=ROOT, env=run_env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "phase rows2 ended" in done.stdout, done.stdout + done.stderr
        restored = f"restored {work} from {carry}: 3 finished runs"
        assert (restored in done.stdout) if call == 2 else ("restored" not in done.stdout)
    assert (work / "runs" / "ft_pre_contrast_enc_lv_n4_s0_lr1e-4" / "result.json").read_text() == '{"lease": "carried"}'
    assert (work / "runs" / "pre_full" / "result.json").read_text() == '{"lease": "this"}'
    assert (work / "runs" / "pre_full" / "model.pt").read_text() == "this lease's weights"
    assert (tmp_path / "w" / "n" / "rows2.out").read_text().startswith("this lease's log")
    weights = [x for x in calls.read_text().splitlines() if " weights " in f" {x} "]
    assert [x.split("|", 1)[1] for x in weights] == [
        f"tools/experiments.py weights {carry}/pre_contrast_enc_fp16.pt {work}/runs/pre_contrast_enc/model.pt "
        "--dtype float32"]


def test_portable_command_keeps_the_settings_and_drops_the_paths():
    import shlex

    # the results CSV records what a run did, not where: interpreter and PATH_ARGS become stand-ins, nothing else moves
    cmd = ("/opt/torch/.venv/bin/python -m monai.bundle run --config_file \"['a.json', 'b.json']\" --dataset_dir /tmp/w/acdc "
           "--output_dir /tmp/w/n/t/runs/ft_pre_full_lv_n1_s0_lr1e-4 --pretrained /tmp/w/n/t/runs/pre_full/model.pt "
           "--overrides '{\"x\": 1}' --seed 0")
    got = ex.portable_command(cmd)
    assert shlex.split(got) == ["python", "-m", "monai.bundle", "run", "--config_file", "['a.json', 'b.json']",
                                "--dataset_dir", "DATASET", "--output_dir", "RUN", "--pretrained", "INIT",
                                "--overrides", '{"x": 1}', "--seed", "0"]
    assert ex.settings_of(got) == ex.settings_of(cmd) and ex.portable_command(got) == got
    assert "--pretrained None" in ex.portable_command("py -m x --pretrained None --seed 1")
    for csv_path in sorted((ROOT / "docs" / "results").rglob("*.csv.gz")):  # the committed CSVs were converted in place
        with rr.open_csv(csv_path) as f:
            commands = [r["command"] for r in csv.DictReader(f) if r.get("command")]
        assert all(c == ex.portable_command(c) for c in commands), csv_path


def test_cast_weights_round_trips_a_checkpoint_through_float16(tmp_path):
    # a pre-training's model.pt goes back to the next lease in float16: a plain state dict, floats cast, integer
    # counters kept, each weight within 2^-11 of its value, written atomically; bad input names what was expected
    import torch

    net = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4))
    net[1].running_var.fill_(3.7)
    ckpt = tmp_path / "checkpoint_final.pt"
    torch.save({"network": net.state_dict(), "optimizer": {"lr": 1.0}}, ckpt)
    half = ex.cast_weights(ckpt, tmp_path / "carry" / "pre_fp16.pt", "float16")
    back = ex.cast_weights(half, tmp_path / "model.pt", "float32")
    h, b = (torch.load(p, weights_only=True) for p in (half, back))
    assert set(h) == set(b) == set(net.state_dict())
    assert h["0.weight"].dtype == torch.float16 and b["0.weight"].dtype == torch.float32
    assert b["1.num_batches_tracked"].dtype == torch.int64
    for k, v in net.state_dict().items():
        assert torch.allclose(b[k].float(), v.float(), rtol=2 ** -11, atol=2 ** -25), k
    assert sorted(p.name for p in (tmp_path / "carry").iterdir()) == ["pre_fp16.pt"]
    with pytest.raises(ex.ExperimentError, match=r"dtype must be one of \['float16', 'float32'\], got 'bf16'"):
        ex.cast_weights(ckpt, tmp_path / "x.pt", "bf16")
    with pytest.raises(ex.ExperimentError, match="pretrained checkpoint .*missing.pt does not exist"):
        ex.cast_weights(tmp_path / "missing.pt", tmp_path / "x.pt", "float32")
    net[1].running_var[0] = 1e6  # beyond float16's 65504: refused, not written as inf
    torch.save(net.state_dict(), tmp_path / "big.pt")
    with pytest.raises(ex.ExperimentError, match=r"big.pt: tensor '1.running_var' has values that float16 cannot hold "
                                                 r"\(largest magnitude 1e\+06\); keep it in float32"):
        ex.cast_weights(tmp_path / "big.pt", tmp_path / "x.pt", "float16")
    assert not (tmp_path / "x.pt").exists()


def test_run_progress_counts_epochs_over_attempts_without_their_compiling_first_epochs(tmp_path, capsys):
    # a lease's next call is narrowed to the runs that can end in it: each unfinished run's last epoch, the median
    # epoch (training + validation) without each attempt's first, compiling one, and the seconds left
    def epoch(engine, k, seconds):
        return f"2026-11-27 17:00:00,000 - ignite.engine.engine.{engine} - INFO - Epoch[{k}] Complete. Time taken: 00:00:{seconds:06.3f}"

    cmd = "+ python -m monai.bundle run --config_file x.json --epochs 50 --iters_per_epoch 400"
    first = [cmd, epoch("SemiSupervisedTrainer", 1, 40.0), epoch("SupervisedEvaluator", 1, 5.0)]
    first += [line for k in range(2, 21) for line in (epoch("SemiSupervisedTrainer", k, 20.0),
                                                      epoch("SupervisedEvaluator", k, 1.0))]
    second = [cmd, epoch("SemiSupervisedTrainer", 21, 50.0), epoch("SupervisedEvaluator", 1, 9.0),
              epoch("SemiSupervisedTrainer", 22, 22.0), epoch("SupervisedEvaluator", 2, 1.0)]
    runs = tmp_path / "runs"
    for name, lines in (("mt_a", first + second), ("mt_b", [cmd]), ("ft_done", first)):
        (runs / name).mkdir(parents=True)
        (runs / name / "log.txt").write_text("\n".join(lines) + "\n")
    (runs / "ft_done" / "result.json").write_text("{}")
    (runs / "pre_waiting").mkdir()  # not started: no log
    assert ex.run_progress(tmp_path) == [
        {"name": "mt_a", "epoch": 22, "epochs": 50, "epoch_s": 21.0, "left_s": 588.0},
        {"name": "mt_b", "epoch": 0, "epochs": 50, "epoch_s": None, "left_s": None}]
    ex.CLI().progress(str(tmp_path))
    assert "mt_a: epoch 22 of 50, 21.0 s an epoch, 588.0 s left" in capsys.readouterr().out
    with pytest.raises(ex.ExperimentError, match="no runs/ folder"):
        ex.CLI().progress(str(tmp_path / "runs"))


def test_rename_pretraining_renames_the_row_and_its_fine_tunes_init_or_nothing(tmp_path):
    path = tmp_path / "results.csv"
    rows = [{"name": "pre_ours_mi_cc", "kind": "pretrain", "init": "", "panel": "runs/pre_ours_mi_cc/panels/c.png"},
            {"name": "ft_pre_ours_mi_cc_lv_n2_s0_lr1e-4", "kind": "finetune", "init": "pre_ours_mi_cc", "panel": ""},
            {"name": "ft_random_lv_n1_s0_lr1e-4", "kind": "finetune", "init": "random", "panel": ""}]
    ex.write_csv(rows, ["name", "kind", "init", "panel"], path)
    before = path.read_text()
    with pytest.raises(ex.ExperimentError, match=r"results.csv: expected one pre-training row named 'pre_full'; found none"):
        ex.rename_pretraining(path, "pre_full", "pre_full_x")
    with pytest.raises(ex.ExperimentError, match="expected one pre-training row named 'ft_random_lv_n1_s0_lr1e-4'; found"):
        ex.rename_pretraining(path, "ft_random_lv_n1_s0_lr1e-4", "x")
    with pytest.raises(ex.ExperimentError, match="a run named 'ft_random_lv_n1_s0_lr1e-4' exists already"):
        ex.rename_pretraining(path, "pre_ours_mi_cc", "ft_random_lv_n1_s0_lr1e-4")
    assert path.read_text() == before  # nothing half-done
    assert ex.rename_pretraining(path, "pre_ours_mi_cc", "pre_ours_mi_cc_rows2") == 1
    with open(path, newline="") as f:
        got = list(csv.DictReader(f))
    assert [(r["name"], r["init"]) for r in got] == [("pre_ours_mi_cc_rows2", ""),
                                                     ("ft_pre_ours_mi_cc_lv_n2_s0_lr1e-4", "pre_ours_mi_cc_rows2"),
                                                     ("ft_random_lv_n1_s0_lr1e-4", "random")]
    assert got[0]["panel"] == "runs/pre_ours_mi_cc_rows2/panels/c.png"
    with pytest.raises(ex.ExperimentError, match="no such results CSV"):
        ex.rename_pretraining(tmp_path / "none.csv", "a", "b")
    # the committed results are gzipped: renamed in place, still gzip, the same text as the plain CSV renamed
    gz = ex.write_csv(rows, ["name", "kind", "init", "panel"], tmp_path / "results.csv.gz")
    assert gz.read_bytes()[:2] == b"\x1f\x8b" and ex.rename_pretraining(gz, "pre_ours_mi_cc", "pre_ours_mi_cc_rows2") == 1
    with rr.open_csv(gz) as f:
        assert f.read() == path.read_bytes().decode()


def test_ordering_against_another_report_counts_untagged_rows_in_its_order_and_cells_round_trip(tmp_path):
    # a fast protocol is judged against the full protocol's own order: the other report's table_cells.json
    methods = ["Baseline", "IIC (Dec)", "Contrast (Enc) + Ours (Dec)", "Baseline [long]"]
    fast = {("Baseline", "lv", 1): (50.0, 1.0, 3), ("IIC (Dec)", "lv", 1): (60.0, 1.0, 3),
            ("Contrast (Enc) + Ours (Dec)", "lv", 1): (70.0, 1.0, 3), ("Baseline [long]", "lv", 1): (99.0, 1.0, 3)}
    full = {"paper": {("Baseline", "lv", 1): 55.0, ("IIC (Dec)", "lv", 1): 45.0, ("Contrast (Enc) + Ours (Dec)", "lv", 1): 80.0,
                      ("Baseline [long]", "lv", 1): 1.0}}  # tagged: never compared, whatever it scores
    path = tmp_path / "full" / "table_cells.json"
    path.parent.mkdir()
    path.write_text(rr.cells_json({"paper": {k: (v, 0.0, 3) for k, v in full["paper"].items()}}))
    assert rr.read_cells_json(path) == full
    lines = rr.ordering_lines(methods, [("lv", 1)], fast, full["paper"], "the full runs")
    assert lines[0] == ("Ordering against the full runs: of the pairs of untagged rows measured in both, 2 of 3 are in "
                        "the same order (per column below):")
    assert "| LV 1 | 3 | 2 of 3 | Contrast (Enc) + Ours (Dec) > IIC (Dec) > Baseline | " \
           "Contrast (Enc) + Ours (Dec) > Baseline > IIC (Dec) |" in lines
    bad = tmp_path / "bad.json"
    bad.write_text('{"paper": [["Baseline", "lv"]]}')
    with pytest.raises(rr.ReportError, match=r"bad.json: expected \{protocol: \[\[method, task, labelled scans, mean, seeds\]"):
        rr.read_cells_json(bad)
    with pytest.raises(rr.ReportError, match=r"none.json: no such file \(expected the table_cells.json a report writes"):
        rr.read_cells_json(tmp_path / "none.json")


def test_table1_status_merges_reports_marks_seeds_and_refuses_a_cell_in_two_reports(tmp_path):
    # Table 1 as far as it is measured: the issue's rows only (no tagged row), our mean beside the paper's, fewer
    # than 3 seeds marked, the ordering counted over the rows with a paper number (not Contrast (Enc))
    acdc, p12 = tmp_path / "acdc" / "table_cells.json", tmp_path / "p12" / "table_cells.json"
    for path, cells in ((acdc, {("Baseline", "lv", 1): (50.0, 1.0, 3), ("Contrast (Enc)", "lv", 1): (90.0, 1.0, 3),
                                ("Contrast (Enc) + Ours (Dec)", "lv", 1): (80.0, 1.0, 3),
                                ("Mean Teacher", "rv", 1): (30.0, 0.0, 1), ("Baseline [long]", "lv", 1): (99.0, 1.0, 3)}),
                        (p12, {("Baseline", "prostate", 4): (76.93, 2.7, 3)})):
        path.parent.mkdir()
        path.write_text(rr.cells_json({"paper": cells, "tuned": {}}))
    text = rr.table1_status([acdc, p12])
    first_table = text.split("\n\n")[0].splitlines()
    rows = {line.split(" | ")[0][2:]: line.split(" | ")[1:] for line in first_table if line.startswith("| ")}
    assert list(rows)[1:] == list(rr.TABLE1_ROWS) and "Baseline [long]" not in text
    assert rows["Baseline"][0] == "50.00 (67.13)" and rows["Baseline"][9] == "76.93 (49.91)"
    assert rows["Contrast (Enc)"][0] == "90.00 (77.98)" and rows["Mean Teacher"][3] == "30.00<sup>1</sup> (61.61)"
    assert rows["MT + Ours"][0] == "– (90.25)"
    assert "5 of 84 cells measured, 4 of them with 3 seeds." in text
    assert "| LV 1 | 2 | 1 of 1 | Contrast (Enc) + Ours (Dec) > Baseline | Contrast (Enc) + Ours (Dec) > Baseline |" in text
    again = tmp_path / "again" / "table_cells.json"
    again.parent.mkdir()
    again.write_text(rr.cells_json({"paper": {("Baseline", "lv", 1): (51.0, 1.0, 3)}}))
    with pytest.raises(rr.ReportError, match=r"\('Baseline', 'lv', 1\) is in both .*acdc/table_cells.json and .*again/"):
        rr.table1_status([acdc, again])
    out = rr.write_table1_status([acdc, p12], tmp_path / "docs" / "table1.md", "CMD")
    text = out.read_text()
    assert "[`acdc/`](../acdc/README.md)" in text and "Made by `CMD`." in text
    assert text.index("## The paper's protocol") < text.index("5 of 84") < text.index("## Each row at its") < \
        text.index("0 of 84 cells measured")  # the fixture's reports have no LR-chosen cells
    with pytest.raises(rr.ReportError, match="protocol must be 'paper' or 'tuned', got 'best'"):
        rr.table1_status([acdc], "best")


def test_the_committed_table1_is_what_its_command_makes_of_the_reports(tmp_path):
    # docs/results/table1.md must stay what the command it names writes from the committed table_cells.json files
    import shlex
    import subprocess

    committed = (ROOT / "docs" / "results" / "table1.md").read_text()
    command = committed.split("Made by `", 1)[1].split("`", 1)[0]
    args = shlex.split(command)
    assert args[:3] == ["python", "tools/experiments.py", "table1"]
    subprocess.run([sys.executable, *args[1:], "--out", str(tmp_path / "table1.md")], cwd=ROOT, check=True,
                   capture_output=True)
    made = (tmp_path / "table1.md").read_text()
    assert made.splitlines()[4:] == committed.splitlines()[4:]  # the table and the ordering (the links differ)
    assert "| Contrast (Enc) + Ours (Dec) | 78.75 (84.48) |" in committed


def test_ordering_lines_count_the_pairs_of_paper_rows_in_the_papers_order():
    # the paper's LV 1 order: full 84.48 > Ours (Dec) 84.04 > IIC (Dec) 71.96 > Baseline 67.13
    methods = ["Baseline", "IIC (Dec)", "Ours (Dec) MI+CC", "Contrast (Enc) + Ours (Dec)", "Baseline [dicece]",
               "Contrast (Enc)"]
    same = {("Baseline", "lv", 1): (50.0, 1.0, 3), ("IIC (Dec)", "lv", 1): (60.0, 1.0, 3),
            ("Ours (Dec) MI+CC", "lv", 1): (70.0, 1.0, 3), ("Contrast (Enc) + Ours (Dec)", "lv", 1): (80.0, 1.0, 3),
            # neither a tagged row nor a row the paper lacks is ranked, however it scores
            ("Baseline [dicece]", "lv", 1): (99.0, 1.0, 3), ("Contrast (Enc)", "lv", 1): (1.0, 1.0, 3),
            ("Baseline", "rv", 1): (20.0, 1.0, 3)}  # a column with one paper row is left out
    lines = rr.ordering_lines(methods, [("lv", 1), ("rv", 1)], same)
    assert lines[0].startswith("Ordering: of the pairs of the paper's rows measured here, 6 of 6 are in the paper's order")
    assert len([x for x in lines if x.startswith("| LV 1 | 4 | 6 of 6 |")]) == 1 and not any("| RV 1 |" in x for x in lines)
    swapped = {**same, ("Baseline", "lv", 1): (90.0, 1.0, 3)}  # the baseline now first: its 3 pairs are out of order
    assert "| LV 1 | 4 | 3 of 6 | Baseline > Contrast (Enc) + Ours (Dec) > Ours (Dec) MI+CC > IIC (Dec) |" in \
        "\n".join(rr.ordering_lines(methods, [("lv", 1)], swapped))
    assert rr.ordering_lines(["Baseline"], [("lv", 1)], same) == []


def test_n_sh_decdiag_probes_each_finished_pre_training_with_the_bundle_and_tars_only_its_own_work_dir(tmp_path, demo_dataset):
    # the probe's command (its config list spans two lines of n.sh) run for real on a finished pre-training of the
    # demo data; only the plan runner is stood in for. Its JSON must come back in the call's tar.
    import os
    import shlex
    import subprocess
    import tarfile

    sys.path.insert(0, str(ROOT / "tests"))
    from bundle_helpers import run_bundle

    work = tmp_path / "w"
    runs = work / "n" / "decdiag" / "runs"
    work.mkdir()
    (work / "acdc").symlink_to(demo_dataset, target_is_directory=True)
    pre = runs / "pre_ours_mi_cc_cc0"
    (work / "n" / "lr12" / "runs" / "ft_x").mkdir(parents=True)  # another phase's work dir, run beside this one
    (work / "n" / "lr12" / "runs" / "ft_x" / "result.json").write_text("{}")
    (work / "n" / "lr12.out").write_text("done ft_x\n")
    overrides = dict(epochs=1, iters_per_epoch=2, crop_size=64, scans_per_batch=2, panel_every=100, save_every=100,
                     progress_bar=False, features=[8, 8, 16, 16, 32, 8], num_clusters=10, dense_level=2)
    run_bundle("pretrain_bim", ["train.json", "variants/ours_mi_cc.json"], dataset_dir=work / "acdc", output_dir=pre,
               **overrides)
    # the runner's record of it (the probe reuses its arguments: the widths, clusters and dense_level must match)
    command = ex._cmd([ex.PRETRAIN_TRAIN, "bundles/pretrain_bim/configs/variants/ours_mi_cc.json"],
                      {"dataset_dir": str(work / "acdc"), "output_dir": "/elsewhere", **overrides})
    (pre / "run.json").write_text(json.dumps({"name": pre.name, "kind": "pretrain", "commands": [shlex.join(command)]}))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text('#!/usr/bin/env bash\ncase " $* " in *" run_plan "*|*" collect "*) exit 0 ;; esac\n'
                                    f'exec {sys.executable} "$@"\n')
    (bin_dir / "python").chmod(0o755)
    (tmp_path / "out").mkdir()
    # what the stood-in collect would have written: the pre-training's row, for the call's cluster-map figure
    ex.write_csv([{"name": pre.name, "kind": "pretrain", "method": "", "task": "", "labelled_scans": "", "seed": "",
                   "lr": "", "test_dice": "", "val_dice": "", "variant": "ours_mi_cc",
                   "panel": "runs/pre_ours_mi_cc_cc0/panels/clusters_latest.png"}],
                 ["name", "kind", "method", "task", "labelled_scans", "seed", "lr", "test_dice", "val_dice", "variant",
                  "panel"], work / "n" / "decdiag" / "results.csv")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "BIM_GIT_COMMIT": "x", "N_TMP": str(work),
           "OUT": str(tmp_path / "out")}
    done = subprocess.run(["bash", str(ROOT / "docs" / "results" / "gpu_calls" / "n.sh"), "300", "decdiag"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    probe = json.loads((runs / "pre_ours_mi_cc_cc0" / "path_dependence_validation.json").read_text())
    assert set(probe["levels"]) == set("01234")
    with tarfile.open(tmp_path / "out" / "n_decdiag.tgz") as tar:
        names = tar.getnames()
    assert "n/decdiag/runs/pre_ours_mi_cc_cc0/path_dependence_validation.json" in names and "n/decdiag.out" in names
    assert not [n for n in names if n.startswith("n/lr12")]  # a phase run beside it in the same call tars its own
    assert (tmp_path / "out" / "cluster_panels_decdiag.png").read_bytes()[:4] == b"\x89PNG"  # the lease's figure


def test_collect_reads_the_path_probe_and_the_report_shows_it_beside_the_cluster_quality(tmp_path):
    for name, probed in (("pre_ours_mi_cc_cc0", True), ("pre_full_ctl", False)):
        run = tmp_path / "runs" / name
        run.mkdir(parents=True)
        (run / "result.json").write_text(json.dumps({"name": name, "kind": "pretrain", "variant": name.split("_", 1)[1],
                                                     "cq_nmi": 0.07, "cq_LV": 0.285, "cq_LV_per_scan": 0.329}))
        if probed:
            levels = {str(k): {"changed": k / 10, "changed_in_structures": k / 5, "pooled_dice": {"LV": 0.2}}
                      for k in range(5)}
            (run / "path_dependence_validation.json").write_text(json.dumps({"split": "validation", "levels": levels}))
    with open(ex.collect(tmp_path), newline="") as f:
        rows = {r["name"]: r for r in csv.DictReader(f)}
    assert float(rows["pre_ours_mi_cc_cc0"]["pd_L4"]) == 0.4 and float(rows["pre_ours_mi_cc_cc0"]["pd_L0_in"]) == 0.0
    assert rows["pre_full_ctl"]["pd_L4"] == ""  # not probed: an empty cell, not a zero
    lines = rr.cluster_quality_table(rr.read_rows([tmp_path / "results.csv"]))
    assert lines[4].endswith("| NMI | level 4 | level 0 |")
    row = next(x for x in lines if "`pre_ours_mi_cc_cc0`" in x)
    assert row.endswith("| 0.070 | 40.0 (80.0) | 0.0 (0.0) |")
    assert next(x for x in lines if "`pre_full_ctl`" in x).endswith("| 0.070 | – | – |")
    # without any probe the table keeps its columns
    assert rr.cluster_quality_table([{**rows["pre_full_ctl"], "cq_nmi": 0.07}])[4].endswith("| NMI |")


def test_collect_leaves_out_the_runs_an_earlier_lease_collected_and_points_at_their_new_names(tmp_path):
    # a staged lease restores the earlier lease's runs from .carry/PHASE; its CSV must hold only what it ran, and a
    # new fine-tune of a restored pre-training must name it as the committed CSV does after rename_pretraining
    def finished(work, name, kind, wall_s, init=""):
        run = work / "runs" / name
        run.mkdir(parents=True, exist_ok=True)
        cmd = f"/usr/bin/python3 -m monai.bundle run --output_dir {run} --dataset_dir /tmp/w/acdc" + (
            f" --pretrained {work / 'runs' / init / 'model.pt'}" if init else "")
        (run / "result.json").write_text(json.dumps({"name": name, "kind": kind, "init": init, "wall_s": wall_s,
                                                     "commit": "5c35b04", "command": cmd, "test_dice": 0.5}))

    first = tmp_path / "lease1"
    finished(first, "pre_contrast_enc", "pretrain", 271.0)
    finished(first, "ft_pre_contrast_enc_lv_n4_s0_lr1e-4", "finetune", 509.3, "pre_contrast_enc")
    earlier = ex.collect(first, tmp_path / "rows2b.csv.gz")
    ex.rename_pretraining(earlier, "pre_contrast_enc", "pre_contrast_enc_rows2")
    second = tmp_path / "lease2"
    shutil.copytree(first, second)  # the restore: the same runs, the same result.json
    finished(second, "ft_pre_contrast_enc_rv_n4_s1_lr5e-4", "finetune", 301.7, "pre_contrast_enc")
    finished(second, "pre_full", "pretrain", 500.1)
    finished(second, "ft_pre_contrast_enc_lv_n4_s0_lr1e-4", "finetune", 480.0, "pre_contrast_enc")  # a rerun: kept
    with rr.open_csv(ex.collect(second, tmp_path / "rows2c.csv.gz", skip_collected=f"[{earlier}]")) as f:
        got = [(r["name"], r["init"]) for r in csv.DictReader(f)]
    assert got == [("ft_pre_contrast_enc_lv_n4_s0_lr1e-4", "pre_contrast_enc_rows2"),
                   ("ft_pre_contrast_enc_rv_n4_s1_lr5e-4", "pre_contrast_enc_rows2"), ("pre_full", "")]
    with pytest.raises(ex.ExperimentError, match="every finished run is in .* already; nothing new to collect"):
        ex.collect(first, tmp_path / "again.csv", skip_collected=[str(earlier)])
    with pytest.raises(ex.ExperimentError, match="missing.csv.gz: no such results CSV"):
        ex.collect(second, tmp_path / "x.csv", skip_collected=[str(tmp_path / "missing.csv.gz")])
    assert not (tmp_path / "again.csv").exists() and not (tmp_path / "x.csv").exists()


def test_probe_command_reuses_the_pre_trainings_arguments_or_refuses_clearly(tmp_path):
    import shlex

    grid = ex.build_plan(ROOT / "docs" / "results" / "gpu_calls" / "plans" / "decdiag.json", "/data", tmp_path)
    by_name = {r.name: r for r in grid}
    for name in ("pre_ours_mi_cc_cc0", "pre_full_ctl"):
        run = tmp_path / "runs" / name
        run.mkdir(parents=True)
        (run / "run.json").write_text(json.dumps({"name": name, "kind": "pretrain",
                                                  "commands": [shlex.join(c) for c in by_name[name].commands]}))
    with pytest.raises(ex.ExperimentError, match="pre_ours_mi_cc_cc0: no checkpoint_final.pt"):
        ex.probe_command(tmp_path / "runs" / "pre_ours_mi_cc_cc0")
    (tmp_path / "runs" / "pre_ours_mi_cc_cc0" / "checkpoint_final.pt").write_bytes(b"")
    cmd = ex.probe_command(tmp_path / "runs" / "pre_ours_mi_cc_cc0", dataset_dir="/moved")
    args = dict(zip(cmd[4::2], cmd[5::2]))
    assert eval(args["--config_file"])[-1] == ex.PRETRAIN_PATHS and "variants/ours_mi_cc.json" in args["--config_file"]
    assert args["--lambda_cc"] == "0.0" and args["--dataset_dir"] == "/moved"  # its own overrides, the data moved
    assert args["--output_dir"] == str(tmp_path / "runs" / "pre_ours_mi_cc_cc0") and cmd[0] == sys.executable
    # a variant that trains no cluster head has nothing to probe
    run = tmp_path / "runs" / "pre_contrast_enc"
    run.mkdir()
    (run / "checkpoint_final.pt").write_bytes(b"")
    enc = next(r for r in ex.build_grid("acdc_paper", "/data", tmp_path, methods="Contrast (Enc)") if r.kind == "pretrain")
    (run / "run.json").write_text(json.dumps({"kind": "pretrain", "commands": [shlex.join(enc.commands[0])]}))
    assert ex.probe_command(run) is None
    with pytest.raises(ex.ExperimentError, match=r"run.json: expected the record of a pre-training"):
        (run / "run.json").write_text(json.dumps({"kind": "finetune", "commands": ["x"]}))
        ex.probe_command(run)
    with pytest.raises(ex.ExperimentError, match="no such file"):
        ex.probe_command(tmp_path / "nowhere")
