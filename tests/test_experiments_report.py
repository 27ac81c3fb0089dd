"""tools/experiments: a known results CSV renders to a known table; the committed pages match their CSVs; the
package's imports run one way."""

import ast
import csv
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from experiments import pages  # noqa: E402
from experiments.report import ReportSpec, load_spec, write_report  # noqa: E402

PACKAGE = ROOT / "tools" / "experiments"
# each module may import only those before it
LAYERS = ("vocabulary", "grid", "runner", "collection", "tables", "sections", "figures", "report", "pages", "cli")
COLUMNS = ("name", "kind", "method", "init", "task", "labelled_scans", "seed", "lr", "paper_lr", "val_dice",
           "test_dice", "gpu", "wall_s")


def _write_csv(path: Path, runs) -> Path:
    """Runs ``(method, seed, lr, val_dice, test_dice)`` of LV at 1 labelled scan as a results CSV."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for method, seed, lr, val, test in runs:
            init = "random" if method == "Baseline" else "pre_full"
            w.writerow([f"{method}_{seed}_{lr}", "finetune", method, init, "lv", 1, seed, lr, 1e-4, val, test,
                        "NVIDIA H200", 100.0])
    return path


def test_a_known_csv_renders_to_a_known_table(tmp_path):
    csv_path = _write_csv(tmp_path / "results.csv", [
        ("Baseline", 0, 1e-4, 0.5, 0.50), ("Baseline", 1, 1e-4, 0.5, 0.60),
        ("Baseline", 0, 5e-4, 0.9, 0.70), ("Baseline", 1, 5e-4, 0.1, 0.10),
        ("Contrast (Enc) + Ours (Dec)", 0, 1e-4, 0.5, 0.80), ("Contrast (Enc) + Ours (Dec)", 1, 1e-4, 0.5, 0.90)])
    readme = write_report(ReportSpec(csvs=[csv_path], title="Known", paper_lr=1e-4), tmp_path / "out")[0]
    text = readme.read_text()
    paper = text[text.index("## Paper protocol"):text.index("## Each method")]
    assert ("| method | LV 1 |\n|---|---|\n| Baseline | 55.00 (5.00) n=2 |\n"
            "| Contrast (Enc) + Ours (Dec) | **85.00 (5.00) n=2** |") in paper
    assert "| Contrast (Enc) + Ours (Dec) | +0.5 |" in paper  # the gap to the paper's 84.48
    assert "| Contrast (Enc) + Ours (Dec) | Baseline | 2 | 2 | 0.50 | +30.0 (+30.0 to +30.0) | +17.4 |" in paper
    tuned = text[text.index("## Each method"):]
    # validation chooses 5e-4 for seed 0 (test 0.70) and 1e-4 for seed 1 (test 0.60)
    assert "| Baseline | 65.00 (5.00) n=2 |" in tuned
    assert "| Baseline | LV 1 | s0: 5e-4, s1: 1e-4 | 1e-4: 55.0, 5e-4: 40.0 |" in tuned
    assert "| Baseline | 4 | NVIDIA H200 (4) | 0.1 |" in text  # where the runs ran, from the CSV rows


def test_the_summary_page_tables_match_the_committed_csvs():
    assert pages.regenerate(check=True) == []


@pytest.mark.parametrize("page", pages.PAGES)
def test_a_protocol_page_matches_its_committed_csvs(tmp_path, page):
    folder = pages.RESULTS / page
    for panel in folder.glob("cluster_panels*.png"):  # drawn from pre-training folders that are not committed
        shutil.copy(panel, tmp_path)
    written = write_report(load_spec(folder), tmp_path)
    assert written[0].read_text() == (folder / "README.md").read_text()
    assert written[1].read_text() == (folder / "table_cells.json").read_text()


def _imports(module: Path) -> set[str]:
    """The package modules ``module`` imports (relative imports)."""
    found = set()
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found.add(node.module.split(".")[0] if node.module else "")
    return found


def test_the_package_imports_run_one_way():
    modules = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__", "__main__"}
    assert modules == set(LAYERS)
    for name in LAYERS:
        later = set(LAYERS[LAYERS.index(name):])
        assert not _imports(PACKAGE / f"{name}.py") & later, f"{name} imports a module at or below its layer"


def test_no_function_is_longer_than_80_lines_and_no_command_takes_more_than_8_options():
    for path in PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.end_lineno - node.lineno + 1 <= 80, f"{path.name}: {node.name}"
    cli = ast.parse((PACKAGE / "cli.py").read_text())
    commands = next(n for n in cli.body if isinstance(n, ast.ClassDef) and n.name == "CLI").body
    for fn in (n for n in commands if isinstance(n, ast.FunctionDef)):
        assert len(fn.args.args) - 2 <= 8, fn.name  # all but self and the first, positional, argument


def test_the_early_stopping_section_compares_both_models_of_the_same_runs():
    """Rows with recorded early stops (``es<N>_*`` columns, one set per patience; ``es_*`` with ``es_patience`` in
    CSVs of one patience) give one line per method, cell and patience: both models' mean (std over seeds), the mean
    paired difference, the time share and how many runs it stopped."""
    from experiments.sections import early_stop_lines

    def row(seed, full, early, share, stopped):
        return {"method": "Baseline", "task": "lv", "labelled_scans": "1", "seed": str(seed), "test_dice": full,
                "es_test_dice": early, "es_patience": "10", "es_time_share": share, "es_stopped": stopped}

    md = early_stop_lines([row(0, "0.5", "0.45", "0.4", "True"), row(1, "0.6", "0.6", "1.0", "False")])
    assert md[0] == "## Early stopping (patience 10), recorded on the full-length runs"
    assert "| Baseline | LV 1 | 55.0 (5.0) | 10 | 52.5 (7.5) | -2.5 | 70 % | 1 of 2 |" in md
    assert early_stop_lines([row(0, "0.5", "", "", "")]) == []

    def two(seed, full, p5, p10):  # (test Dice, time share, stopped) of patience 5 and 10
        r = {"method": "Baseline", "task": "rv", "labelled_scans": "2", "seed": str(seed), "test_dice": full}
        for n, (dice, share, stopped) in ((5, p5), (10, p10)):
            r.update({f"es{n}_test_dice": dice, f"es{n}_time_share": share, f"es{n}_stopped": stopped})
        return r

    md = early_stop_lines([two(0, "0.5", ("0.4", "0.2", True), ("0.5", "0.5", True)),
                           two(1, "0.7", ("0.7", "0.4", True), ("0.7", "1.0", False))])
    assert md[0] == "## Early stopping (patience 5, 10), recorded on the full-length runs"
    lines = [line for line in md if line.startswith("| Baseline")]
    assert lines[:2] == ["| Baseline | RV 2 | 60.0 (10.0) | 5 | 55.0 (15.0) | -5.0 | 30 % | 2 of 2 |",
                         "| Baseline | RV 2 | 60.0 (10.0) | 10 | 60.0 (10.0) | +0.0 | 75 % | 1 of 2 |"]
    # per count, over the runs of all its cells: an LV 2 cell joins RV 2, a 4-scan cell stays apart
    lv = {**two(0, "0.8", ("0.6", "0.4", True), ("0.8", "0.9", True)), "task": "lv"}
    four = {**two(0, "0.8", ("0.8", "0.1", True), ("0.8", "0.1", True)), "labelled_scans": "4"}
    md = early_stop_lines([two(0, "0.5", ("0.4", "0.2", True), ("0.5", "0.5", True)),
                           two(1, "0.7", ("0.7", "0.4", True), ("0.7", "1.0", False)), lv, four])
    summary = md[md.index("| method | labelled scans | patience | difference | time | stopped |") + 2:-1]
    assert summary == ["| Baseline | 2 | 5 | -10.0 | 33 % | 3 of 3 |", "| Baseline | 2 | 10 | +0.0 | 80 % | 2 of 3 |",
                       "| Baseline | 4 | 5 | +0.0 | 10 % | 1 of 1 |", "| Baseline | 4 | 10 | +0.0 | 10 % | 1 of 1 |"]


def test_the_cluster_table_sums_up_each_setting_over_its_pre_training_seeds():
    """Pre-trainings whose names differ only in ``_ps<seed>`` (the grid's ``pretrain_per_seed``) are one setting:
    per structure the mean over seeds, the range, and how many seeds reach 60; a setting of one seed gets no line."""
    from experiments.sections import cluster_quality_table

    def row(name, lv, myo, nmi=0.1):
        return {"name": name, "kind": "pretrain", "variant": "ours_mi_cc", "ablation": "", "cq_nmi": nmi,
                "cq_LV": lv, "cq_LV_per_scan": lv, "cq_Myo": myo, "cq_Myo_per_scan": myo}

    rows = [row("pre_ours_mi_cc_ps0", 0.80, 0.659), row("pre_ours_mi_cc_ps1", 0.86, 0.503, 0.2),
            row("pre_ours_mi_cc_ps2", 0.78, 0.41, 0.3), row("pre_ours_mi_cc_alpha0.25_ps0_t", 0.7, 0.7)]
    md = cluster_quality_table(rows)
    (line,) = [m for m in md if "`pre_ours_mi_cc` |" in m]
    assert line.endswith("| 3 | 81.3 (78.0–86.0) 3/3 | 52.4 (41.0–65.9) 1/3 | 0.200 |"), line
    assert not [m for m in md if "`pre_ours_mi_cc_alpha0.25_t` |" in m]
    md = cluster_quality_table(rows + [row("pre_ours_mi_cc_alpha0.25_ps1_t", 0.5, 0.6)])
    assert [m for m in md if "`pre_ours_mi_cc_alpha0.25_t` | 2 | 60.0 (50.0–70.0) 1/2 | 65.0 (60.0–70.0) 2/2 |" in m]


def test_an_ablation_grid_reports_its_ablation_table_and_no_empty_method_tables(tmp_path):
    """An ``acdc_ablation_paper`` grid's rows record the one LR they ran as the preset's ``paper_lr``, so ``report``
    shows them without ``--paper_lr``: the ablation table with the paper's row, and no method or per-scan section,
    which such a grid has no rows for."""
    from experiments.grid import build_grid

    finetunes = [run for run in build_grid("acdc_ablation_paper", "/data", "/work") if run.kind == "finetune"]
    assert finetunes and {run.meta["paper_lr"] for run in finetunes} == {run.meta["lr"] for run in finetunes} == {1e-4}
    path = tmp_path / "results.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS + ("ablation", "ablation_value", "variant"))
        for value, seed, test in ((0.0, 0, 0.80), (0.0, 1, 0.90), (4.0, 0, 0.60), (4.0, 1, 0.70)):
            w.writerow([f"ft_l{value:g}_s{seed}", "finetune", "Ours (Dec) MI+CC", f"pre_l{value:g}_ps{seed}", "lv", 1,
                        seed, 1e-4, 1e-4, 0.5, test, "NVIDIA H200", 100.0, "lambda_cc", value, "ours_mi_cc"])
    with open(tmp_path / "results_per_scan.csv", "w", newline="") as f:
        csv.writer(f).writerows([("name", "scan", "dice"), ("ft_l0_s0", "patient001", 0.8)])
    text = write_report(ReportSpec(csvs=[path]), tmp_path / "out")[0].read_text()
    assert "| lambda_CC | 0 | 4 |" in text and "| LV, 1 scan, ours | **85.00** (5.00, n=2) | 65.00 (5.00, n=2) |" in text
    assert "| LV, 1 scan, paper | 83.63 | 78.36 |" in text
    assert "## Paper protocol" not in text and "## Each method" not in text and "## Hardest" not in text


def test_an_ablation_run_whose_pre_training_a_tagged_grid_changed_is_not_the_papers_ablation_cell():
    """A tagged grid's ``pretrain_overrides`` (``{"edge_power": 0.5}``) make another pre-training: its runs form a cell
    of their own beside the untagged runs of the same value, without the paper's row, and lend the default point
    only to cells changed the same way."""
    from experiments.sections import ablation_rows, ablation_tables

    def row(key, value, seed, test, changed=""):
        return {"ablation": key, "ablation_value": value, "task": "lv", "labelled_scans": 1, "test_dice": test,
                "init": f"pre_{key}{value}_{changed}_{seed}", "variant": "ours_mi_cc", "pretrain_overrides": changed}

    edge = '{"edge_power": 0.5}'
    rows = [row("alpha", 0.5, 0, 0.70), row("alpha", 0.5, 1, 0.80), row("alpha", 0.5, 0, 0.90, edge),
            row("num_clusters", 60, 0, 0.60), row("num_clusters", 60, 0, 0.50, edge)]
    abl = ablation_rows(rows)
    plain, changed = abl[("alpha", "lv", 1)], abl[(f"alpha with {edge}", "lv", 1)]
    assert [(p[0], round(p[1], 6), p[3]) for p in plain] == [(0.5, 75.0, 2)]
    assert [(p[0], round(p[1], 6), p[3]) for p in changed] == [(0.5, 90.0, 1)]
    # K = 40 (the default point) of each K cell comes from the alpha = 0.5 runs changed as that cell is
    assert [(p[0], round(p[1], 6), p[4]) for p in abl[("num_clusters", "lv", 1)]] == [(40, 75.0, ("alpha", 0.5)),
                                                                                     (60, 60.0, ())]
    assert [(p[0], round(p[1], 6), p[4]) for p in abl[(f"num_clusters with {edge}", "lv", 1)]] == [
        (40, 90.0, (f"alpha with {edge}", 0.5)), (60, 50.0, ())]
    text = "\n".join(ablation_tables(abl))
    assert f'| alpha with {edge} | 0.5 |\n|---|---|\n| LV, 1 scan, ours | **90.00** (0.00, n=1) |\n\n' in text
    assert "| LV, 1 scan, paper | 84.04 |" in text  # the untagged alpha cell keeps the paper's row
    assert text.count("LV, 1 scan, paper") == 2  # alpha and K, not the changed cells


def test_a_long_legend_gets_room_of_its_own_and_leaves_the_panels_their_height(tmp_path):
    from experiments.figures import dice_vs_scans_figure

    def panel_heights(methods: int) -> list[float]:
        rows = [{"name": f"m{i}_{n}", "kind": "finetune", "method": f"Method {i}", "init": "random", "task": "lv",
                 "labelled_scans": n, "seed": 0, "lr": 1e-4, "paper_lr": 1e-4, "val_dice": 0.5,
                 "test_dice": 0.5 + i / 100, "gpu": "NVIDIA H200", "wall_s": 1.0}
                for i in range(methods) for n in (1, 2)]
        fig = dice_vs_scans_figure(rows, "legend")
        fig.canvas.draw()
        legend_top = fig.legends[0].get_window_extent().y1
        heights = [ax.get_window_extent().height / fig.dpi for ax in fig.axes]
        assert all(ax.get_tightbbox().y0 >= legend_top for ax in fig.axes)  # the legend covers no panel
        return heights

    few, many = panel_heights(2), panel_heights(32)
    assert len(few) == len(many) == 1
    assert many[0] > 0.9 * few[0] > 1.5  # inches: 32 methods in the legend do not shrink the panel


def test_the_seeds_of_one_pre_training_setting_and_the_pages_protocol_make_no_cell_of_their_own():
    """Pre-trainings that differ only in their seed repeat one setting: one cell. Overrides every run of a page
    shares (its ``pretrain_protocol``, 5,000 iterations) are no change either: the paper's row stays beside them."""
    from experiments.sections import ablation_rows, ablation_tables

    def row(value, seed, test, overrides):
        return {"ablation": "alpha", "ablation_value": value, "task": "lv", "labelled_scans": 1, "test_dice": test,
                "init": f"pre_alpha{value}_ps{seed}", "variant": "ours_mi_cc", "pretrain_overrides": overrides}

    short = '{"epochs": 25, "warmup_epochs": 5}'
    rows = [row(0.5, 0, 0.70, short), row(0.5, 1, 0.80, '{"epochs": 25, "seed": 1, "warmup_epochs": 5}'),
            row(0.25, 2, 0.60, '{"seed": 2, "warmup_epochs": 5, "epochs": 25}')]
    alone = ablation_rows(rows)
    assert list(alone) == [(f"alpha with {short}", "lv", 1)]
    assert [(p[0], round(p[1], 6), p[3]) for p in alone[(f"alpha with {short}", "lv", 1)]] == [(0.25, 60.0, 1),
                                                                                                (0.5, 75.0, 2)]
    on_page = ablation_rows(rows, {"epochs": 25, "warmup_epochs": 5})
    assert list(on_page) == [("alpha", "lv", 1)]
    text = "\n".join(ablation_tables(on_page))
    assert "| LV, 1 scan, paper | 84.36 | 84.04 |" in text and "| LV, 1 scan, each pre-training | 60.00 | 70.00 / 80.00 |" in text


def _ab_rows(tag: str, cluster: float, dice: dict[int, float], seeds=(1, 2)) -> list[dict]:
    """Rows as ``read_rows`` gives them: one pre-training per seed (every structure's best cluster ``cluster``) and
    its fine-tunes at 1 scan, validation Dice ``dice[seed]`` and test Dice 0.1 above."""
    rows = []
    for s in seeds:
        rows.append({"name": f"pre_{tag}_ps{s}", "kind": "pretrain", "cq_LV": str(cluster), "cq_Myo": str(cluster / 2),
                     "cq_RV": str(cluster)})
        rows += [{"name": f"ft_{tag}_{t}_s{s}", "kind": "finetune", "method": f"Ours (Dec) MI+CC [{tag}]",
                  "init": f"pre_{tag}_ps{s}", "task": t, "labelled_scans": 1, "seed": s, "val_dice": dice[s],
                  "test_dice": dice[s] + 0.1} for t in ("lv", "rv", "myo")]
    return rows


def test_an_ab_comparison_pairs_the_split_seeds_both_settings_ran():
    from experiments.sections import ab_comparison
    from experiments.vocabulary import ExperimentError

    candidate = _ab_rows("new", 0.8, {1: 0.7, 2: 0.5, 3: 0.9}, seeds=(1, 2, 3))
    reference = _ab_rows("old", 0.6, {1: 0.6, 2: 0.3})
    md = ab_comparison(candidate, reference, ("new", "old"))
    assert md[2] == "| seed 1, new | 80.0 / 40.0 / 80.0 | 70.0 / 70.0 / 70.0 (70.0) | 80.0 / 80.0 / 80.0 (80.0) |"
    assert "| mean, new | 80.0 / 40.0 / 80.0 | 60.0 / 60.0 / 60.0 (60.0) | 70.0 / 70.0 / 70.0 (70.0) |" in md
    assert "| mean, old | 60.0 / 30.0 / 60.0 | 45.0 / 45.0 / 45.0 (45.0) | 55.0 / 55.0 / 55.0 (55.0) |" in md
    assert md[-1] == ("new against old (seeds 1, 2, 1 labelled scan): validation +15.0 (seed 1 +10.0, seed 2 "
                      "+20.0), test +15.0.")  # seed 3, which only the candidate ran, is left out
    with pytest.raises(ExperimentError, match="two runs of lv"):
        ab_comparison(candidate + [dict(candidate[1], name="ft_new_lv_s1_lr5e-4")], reference, ("new", "old"))
    with pytest.raises(ExperimentError, match="no split seed"):
        ab_comparison(candidate, reference, ("new", "old"), labelled_scans=2)


@pytest.mark.parametrize("csv_name, names, heading, gap", [
    ("masked_joint_paper_length", "masked joint,defaults", "## The masked joint at paper length",
     "validation +6.2 (seed 1 +3.6, seed 2 +8.8), test +5.0."),
    ("cc_p_hat_sobel_paper_length", "p̂ + Sobel,defaults", "## L_CC on one map with Sobel edges at paper length",
     "validation +1.8 (seed 1 -2.8, seed 2 +6.4), test +0.2.")])
def test_the_compare_command_prints_the_authors_options_pages_ab_tables(capsys, csv_name, names, heading, gap):
    """The page's A/B tables are the ``compare`` command's output from the committed CSVs."""
    from experiments.cli import CLI
    from experiments.vocabulary import ExperimentError

    page = pages.RESULTS / "acdc_authors_options"
    candidate, reference = str(page / f"{csv_name}.csv.gz"), str(page / "fp32_grid_decoder_rows.csv.gz")
    CLI().compare(candidate, reference, names=names)
    printed = capsys.readouterr().out.splitlines()
    assert printed[-1].endswith(gap)
    section = (page / "README.md").read_text().split(heading)[1].split("\n## ")[0]
    assert "\n".join(printed[:8]) in section
    with pytest.raises(ExperimentError, match="two labels"):
        CLI().compare(candidate, reference, names="one label")


def test_figure_methods_narrow_the_figure_not_the_tables_and_must_be_rows(tmp_path):
    from experiments.vocabulary import ExperimentError

    csv_path = _write_csv(tmp_path / "results.csv", [
        ("Baseline", 0, 1e-4, 0.5, 0.50), ("Contrast (Enc) + Ours (Dec)", 0, 1e-4, 0.5, 0.80)])
    text = write_report(ReportSpec(csvs=[csv_path], paper_lr=1e-4, figure_methods=["Baseline"]),
                        tmp_path / "out")[0].read_text()
    assert "The figure draws Baseline; the tables above have every row." in text
    assert "| Contrast (Enc) + Ours (Dec) | **80.00** |" in text  # the tables keep the row the figure leaves out
    with pytest.raises(ExperimentError, match="figure_methods name \\['Nope'\\]"):
        write_report(ReportSpec(csvs=[csv_path], paper_lr=1e-4, figure_methods=["Nope"]), tmp_path / "out2")
