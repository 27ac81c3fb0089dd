"""Results CSVs as the paper's tables: reading the rows, choosing one run per cell under a protocol (the paper's single
LR, or each row's LR chosen on validation), the Table 1 layout in markdown, gaps to the paper, the order of the rows,
and run-for-run comparisons with a sign test."""

from __future__ import annotations

import csv
import gzip
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

from bim.files import atomic_file

from .vocabulary import METHOD_ORDER, PAPER_TABLE1, TASK_COLUMNS, ExperimentError


def open_csv(path):
    """A CSV for reading as text: ``*.gz`` (the committed results under ``docs/results``, written by
    ``experiments.write_csv``) decompressed, any other path as it is."""
    path = Path(path)
    return gzip.open(path, "rt", newline="") if path.suffix == ".gz" else open(path, newline="")


def read_rows(csv_paths) -> list[dict]:
    """The runs of the CSVs (pre-trainings and segmentation runs with a test Dice), numeric fields converted.
    A run name found in several CSVs (the same cell run again) is taken from the last
    CSV that holds it, so list the CSVs oldest first; found with two different presets (the ``preset`` column,
    written since the runner records it) it is two runs under one name, a ``ExperimentError``."""
    rows: dict[str, dict] = {}
    source: dict[str, Path] = {}
    for path in csv_paths:
        path = Path(path)
        if not path.is_file():
            raise ExperimentError(f"{path}: no such results CSV (tools/experiments.py collect writes it)")
        with open_csv(path) as f:
            reader = csv.DictReader(f)
            missing = {"method", "task", "labelled_scans", "seed", "lr", "test_dice", "val_dice"} - set(reader.fieldnames or [])
            if missing:
                raise ExperimentError(f"{path}: missing columns {sorted(missing)}")
            for r in reader:
                earlier = rows.get(r.get("name"))
                if earlier and earlier.get("preset") and r.get("preset") and earlier["preset"] != r["preset"]:
                    raise ExperimentError(f"{path}: run {r['name']} is from preset {r['preset']}, but {source[r['name']]} "
                                      f"holds a run of that name from preset {earlier['preset']}: report them separately")
                source[r.get("name")] = path
                if r.get("kind") == "pretrain":
                    if r.get("panel"):  # relative to the CSV's folder (the runner's work_dir)
                        r["panel"] = str(path.parent / r["panel"])
                    rows.pop(r.get("name"), None)
                    rows[r.get("name")] = r
                    continue
                try:
                    for k in ("test_dice", "val_dice", "lr", "paper_lr"):
                        r[k] = float(r[k]) if r.get(k) not in (None, "") else math.nan
                    cw = r.get("consistency_weight")  # a Mean Teacher run of a weight search (--mt_weights)
                    r["consistency_weight"] = float(cw) if cw not in (None, "") else None
                    r["labelled_scans"], r["seed"] = int(r["labelled_scans"]), int(r["seed"])
                except ValueError as e:
                    raise ExperimentError(f"{path}: row {r.get('name')}: {e}") from None
                rows.pop(r.get("name"), None)
                rows[r.get("name")] = r
    return list(rows.values())


def read_per_scan(csv_paths) -> dict[str, list[tuple[str, float]]]:
    """Run name -> [(scan, test Dice)] from the ``*_per_scan.csv`` files that ``collect`` writes beside its
    results CSV: one row per run, ``name`` then a column per scan (empty where the run has no such scan), or the
    long ``name,scan,dice`` layout of earlier CSVs. A run found in several files is taken from the last one (list
    them oldest first)."""
    runs: dict[str, list[tuple[str, float]]] = {}
    for path in map(Path, csv_paths):
        if not path.is_file():
            raise ExperimentError(f"{path}: no such per-scan CSV (tools/experiments.py collect writes <results>_per_scan.csv)")
        fresh: dict[str, list[tuple[str, float]]] = {}
        with open_csv(path) as f:
            reader = csv.DictReader(f)
            columns = list(reader.fieldnames or [])
            if "name" not in columns or len(columns) < 2:
                raise ExperimentError(f"{path}: expected a 'name' column and one column per test scan (or name,scan,dice)")
            long = columns == ["name", "scan", "dice"]
            for r in reader:
                cells = [(r["scan"], r["dice"])] if long else [(c, r[c]) for c in columns[1:] if r[c] not in ("", None)]
                for scan, dice in cells:
                    try:
                        fresh.setdefault(r["name"], []).append((scan, float(dice)))
                    except ValueError:
                        raise ExperimentError(f"{path}: run {r['name']}, scan {scan}: dice {dice!r} is not a number") from None
        runs.update(fresh)
    return runs


def candidates(rows: list[dict], protocol: str, paper_lr: float | None = None) -> list[dict]:
    """The segmentation runs a protocol may choose from: ``paper`` those at ``paper_lr`` (the argument when given,
    one LR for every row, else each run's preset ``paper_lr``), ``tuned`` all."""
    if protocol not in ("paper", "tuned"):
        raise ExperimentError(f"unknown protocol {protocol!r} (paper | tuned)")
    seg = [r for r in rows if r.get("kind") != "pretrain"]
    if protocol == "tuned":
        return seg
    return [r for r in seg if math.isclose(r["lr"], r["paper_lr"] if paper_lr is None else paper_lr, rel_tol=1e-6)]


def select(rows: list[dict], protocol: str, paper_lr: float | None = None) -> list[dict]:
    """One row per (method, ablation, task, labelled scans, seed) among the protocol's :func:`candidates`: the
    run with the best validation Dice (ties: the smaller LR, then the first). Under ``paper`` that is the one run at
    the paper's LR, or, for Mean Teacher runs at several consistency weights, the weight the validation split
    chooses, as the paper grid-searches it; under ``tuned`` the LR (and weight) with the best validation Dice."""
    groups = defaultdict(list)
    for r in candidates(rows, protocol, paper_lr):
        key = (r["method"], r.get("ablation", ""), r.get("ablation_value", ""), r["task"], r["labelled_scans"], r["seed"])
        groups[key].append(r)
    return [max(runs, key=lambda r: (r["val_dice"], -r["lr"])) for runs in groups.values()]


def _lrs_run(rows: list[dict]) -> dict:
    """(method, ablation, ablation value, task, labelled scans, seed) -> the LRs its segmentation runs used."""
    groups = defaultdict(set)
    for r in rows:
        if r.get("kind") != "pretrain":
            groups[(r["method"], r.get("ablation", ""), r.get("ablation_value", ""), r["task"], r["labelled_scans"],
                    r["seed"])].add(r["lr"])
    return groups


def _lrs_tried(rows: list[dict]) -> list[int]:
    """How many LRs each (method, ablation, task, labelled scans, seed) cell was run at."""
    return [len(v) for v in _lrs_run(rows).values()] or [0]


def _mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.pstdev(values) if len(values) > 1 else 0.0)


def table(rows: list[dict]) -> tuple[list[str], list[tuple], dict]:
    """``(methods, columns, cells)``: cells[(method, task, n)] = (mean x 100, std x 100, number of seeds)."""
    values = defaultdict(list)
    for r in rows:
        if r.get("ablation"):
            continue
        values[(r["method"], r["task"], r["labelled_scans"])].append(100.0 * r["test_dice"])
    cells = {k: (*_mean_std(v), len(v)) for k, v in values.items()}
    methods = [m for m in METHOD_ORDER if any(k[0] == m for k in cells)]
    methods += sorted({k[0] for k in cells} - set(methods))
    columns = [(t, n) for t, _ in TASK_COLUMNS for n in sorted({k[2] for k in cells if k[1] == t})]
    return methods, columns, cells


def markdown_table(methods, columns, cells, paper: bool = False) -> str:
    """Table 1's layout in markdown; the best mean of each column in bold. ``paper``: the paper's numbers."""
    names = dict(TASK_COLUMNS)
    header = "| method | " + " | ".join(f"{names[t]} {n}" for t, n in columns) + " |"
    lines = [header, "|" + "---|" * (len(columns) + 1)]
    best = {}
    for c in columns:
        vals = [(cells[(m, *c)][0] if (m, *c) in cells else None) if not paper else PAPER_TABLE1.get(m, {}).get(c[0], {}).get(c[1])
                for m in methods]
        vals = [v for v in vals if v is not None]
        best[c] = max(vals) if vals else None
    for m in methods:
        row = [m]
        for c in columns:
            if paper:
                v = PAPER_TABLE1.get(m, {}).get(c[0], {}).get(c[1])
                text = "–" if v is None else f"{v:.2f}"
            else:
                cell = cells.get((m, *c))
                v = None if cell is None else cell[0]
                text = "–" if cell is None else (f"{cell[0]:.2f}" if cell[2] == 1 else
                                                 f"{cell[0]:.2f} ({cell[1]:.2f})" + (f" n={cell[2]}" if cell[2] != 3 else ""))
            row.append(f"**{text}**" if v is not None and best[c] is not None and math.isclose(v, best[c]) else text)
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def gap_table(methods, columns, cells) -> str:
    """Our mean minus the paper's, in Dice points (negative: we fall short)."""
    names = dict(TASK_COLUMNS)
    lines = ["| method | " + " | ".join(f"{names[t]} {n}" for t, n in columns) + " |", "|" + "---|" * (len(columns) + 1)]
    for m in methods:
        row = [m]
        for c in columns:
            paper_row = PAPER_TABLE1.get(m.split(" [")[0], {})  # "Baseline [adam]": a tagged grid of the same row
            p, cell = paper_row.get(c[0], {}).get(c[1]), cells.get((m, *c))
            row.append("–" if p is None or cell is None else f"{cell[0] - p:+.1f}")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def ordering_lines(methods, columns, cells, reference=None, reference_name: str = "") -> list[str]:
    """Whether our ranking of the paper's rows follows the paper's, per column: of the pairs of rows that have a mean
    here and a number in the paper's Table 1 (untagged rows only: a tagged row ran other settings), how many are in
    the paper's order, and our order, best first. Whether a fast protocol preserves the paper's
    ordering of methods is then a count. With ``reference`` (``{(method, task, labelled scans): mean}`` of another
    report, named ``reference_name``, e.g. our runs at the paper's lengths) the same count against that report's
    order, over the untagged rows both have: does a fast protocol keep the order of the full one? Empty when no
    column has two such rows."""
    names = dict(TASK_COLUMNS)

    def other(m, t, n):
        if reference is not None:
            return reference.get((m, t, n)) if "[" not in m else None
        return PAPER_TABLE1[m][t][n] if m in PAPER_TABLE1 and n in PAPER_TABLE1[m].get(t, {}) else None

    lines, agree_all, pairs_all = [], 0, 0
    for t, n in columns:
        rows = [(m, cells[(m, t, n)][0], other(m, t, n)) for m in methods
                if (m, t, n) in cells and other(m, t, n) is not None]
        if len(rows) < 2:
            continue
        pairs = [(a, b) for i, a in enumerate(rows) for b in rows[i + 1:]]
        agree = sum((a[1] - b[1]) * (a[2] - b[2]) > 0 for a, b in pairs)
        agree_all, pairs_all = agree_all + agree, pairs_all + len(pairs)
        ours = " > ".join(m for m, _, _ in sorted(rows, key=lambda r: -r[1]))
        theirs = " > ".join(m for m, _, _ in sorted(rows, key=lambda r: -r[2]))
        lines.append(f"| {names[t]} {n} | {len(rows)} | {agree} of {len(pairs)} | {ours} | {theirs} |")
    if not lines:
        return []
    if reference is None:
        return [f"Ordering: of the pairs of the paper's rows measured here, {agree_all} of {pairs_all} are in the "
                "paper's order (per column below; untagged rows with a paper number only):", "",
                "| column | rows | pairs in the paper's order | our order, best first | the paper's order |",
                "|---|---|---|---|---|", *lines, ""]
    return [f"Ordering against {reference_name}: of the pairs of untagged rows measured in both, {agree_all} of "
            f"{pairs_all} are in the same order (per column below):", "",
            f"| column | rows | pairs in the same order | our order, best first | order in {reference_name} |",
            "|---|---|---|---|---|", *lines, ""]


def cells_json(cells_by_protocol: dict) -> str:
    """The report's table cells, ``{protocol: [[method, task, labelled scans, mean, seeds], ...]}``, as JSON: what
    another report reads with ``order_against``, and ``table1_status`` merges (see :func:`read_cells_json`)."""
    return json.dumps({p: [[m, t, n, round(v[0], 4), v[2]] for (m, t, n), v in sorted(c.items(), key=lambda kv: str(kv[0]))]
                       for p, c in cells_by_protocol.items()}, indent=0) + "\n"


def read_cells_json(path, seeds: bool = False) -> dict:
    """``{protocol: {(method, task, labelled scans): mean}}`` from a report's ``table_cells.json`` (``seeds``: the
    values are ``(mean, number of seeds)``), with a clear error for a missing or malformed file."""
    path = Path(path)
    if not path.is_file():
        raise ExperimentError(f"{path}: no such file (expected the table_cells.json a report writes beside its README.md)")
    try:
        data = json.loads(path.read_text())
        return {p: {(m, t, int(n)): (float(v), int(k)) if seeds else float(v) for m, t, n, v, k in rows}
                for p, rows in data.items()}
    except (ValueError, TypeError, AttributeError) as e:
        raise ExperimentError(f"{path}: expected {{protocol: [[method, task, labelled scans, mean, seeds], ...]}}: "
                          f"{e}") from None


def sign_test_p(wins: int, losses: int) -> float:
    """Two-sided exact sign test of ``wins`` against ``losses`` (ties dropped before): under no effect each pair is a
    coin flip, so with n = wins + losses and k = max(wins, losses),

        p = min(1, 2 * sum_{i=k}^{n} C(n, i) / 2^n)

    (1 for no pairs). It treats the pairs as independent: runs fine-tuned from one shared pre-training are not, so it
    measures the fine-tuning noise, not the pre-training's."""
    n, k = wins + losses, max(wins, losses)
    if n == 0:
        return 1.0
    return min(1.0, 2.0 * sum(math.comb(n, i) for i in range(k, n + 1)) / 2 ** n)


def _p_text(p: float) -> str:
    """A p-value as the tables print it: two decimals, three below 0.01, "<0.001" below that."""
    return "<0.001" if p < 0.001 else f"{p:.3f}" if p < 0.01 else f"{p:.2f}"


def pair_references(pair_with: dict | None, method: str, reference: str = "Baseline") -> list[str]:
    """The references ``method`` is compared with run for run: ``pair_with[method]``, one label or a list of labels
    (e.g. the full method against ``["Baseline", "Contrast (Enc)"]``: what its decoder adds to the encoder alone),
    else ``[reference]``."""
    refs = (pair_with or {}).get(method, reference)
    if isinstance(refs, str):
        return [refs]
    if not isinstance(refs, (list, tuple)) or not refs or not all(isinstance(r, str) for r in refs):
        raise ExperimentError(f"pair_with[{method!r}]: expected a row label or a list of row labels; got {refs!r}")
    return list(refs)


def paired_table(rows: list[dict], pair_with: dict | None = None, reference: str = "Baseline") -> list[str]:
    """Each method against its reference(s) run for run: a pair shares structure, labelled scans and seed (so the same
    labelled scans). The reference is ``reference`` unless ``pair_with`` names another for the method (a tagged
    row against the baseline run with the same tag's settings), or several (:func:`pair_references`), one line
    each. Per line: pairs, wins, the sign test's p (:func:`sign_test_p`), the mean paired gain with its range, and
    the paper's gain over the same pairs' cells (– where the paper has no such row). Empty when no method has a pair."""
    dice = {(r["method"], r["task"], r["labelled_scans"], r["seed"]): 100.0 * r["test_dice"]
            for r in rows if not r.get("ablation")}
    present = {k[0] for k in dice}
    methods = [m for m in METHOD_ORDER if m in present] + sorted(present - set(METHOD_ORDER))
    lines = []
    for m, ref in ((m, ref) for m in methods for ref in pair_references(pair_with, m, reference)):
        if ref == m or ref not in present:
            continue
        pairs = [(k, v - dice[(ref, *k[1:])]) for k, v in dice.items() if k[0] == m and (ref, *k[1:]) in dice]
        if not pairs:
            continue
        gains = [g for _, g in pairs]
        ours, theirs = PAPER_TABLE1.get(m.split(" [")[0], {}), PAPER_TABLE1.get(ref.split(" [")[0], {})
        paper = [ours.get(k[1], {}).get(k[2], math.nan) - theirs.get(k[1], {}).get(k[2], math.nan) for k, _ in pairs]
        same_row = m.split(" [")[0] == ref.split(" [")[0]
        paper_text = "–" if same_row or any(math.isnan(x) for x in paper) else f"{sum(paper) / len(paper):+.1f}"
        wins, losses = sum(g > 0 for g in gains), sum(g < 0 for g in gains)
        lines.append(f"| {m} | {ref} | {len(pairs)} | {wins} | {_p_text(sign_test_p(wins, losses))} | "
                     f"{sum(gains) / len(gains):+.1f} ({min(gains):+.1f} to {max(gains):+.1f}) | {paper_text} |")
    if not lines:
        return []
    return ["Run for run against a reference (same structure, labelled scans and seed, so the same labelled scans); "
            "the paper's gain is its Table 1 difference over the same pairs' cells; p: the two-sided sign test of wins "
            "against losses, which takes the pairs as independent (runs from one shared pre-training are not, so it "
            "gauges the fine-tuning noise only):", "",
            "| method | against | pairs | wins | p | mean gain (range) | paper's gain |", "|---|---|---|---|---|---|---|",
            *lines, ""]


def write_text(path: Path, text: str) -> Path:
    """``text`` to ``path`` through a temporary file in its folder and a rename: never a half-written file."""
    with atomic_file(path) as tmp:
        Path(tmp).write_text(text)
    return path


def relabel_rows(rows: list[dict], relabel: dict[str, str]) -> list[str]:
    """Report the rows of one label under another (``{"Baseline [longaug]": "Baseline"}``): for runs that used
    the same settings under another name, e.g. a tag whose overrides later became the bundles' default. Changes
    ``rows`` in place and returns one markdown line per label moved. A label found in no row, or two runs
    landing in the same cell (method, task, labelled scans, seed, LR, consistency weight), is a ``ExperimentError``."""
    present = {r.get("method") for r in rows if r.get("kind") != "pretrain"}
    unknown = sorted(set(relabel) - present)
    if unknown:
        raise ExperimentError(f"relabel: methods {unknown} are in no row (labels found: {sorted(present)})")
    cells: dict[tuple, str] = {}
    for r in rows:
        if r.get("kind") == "pretrain":
            continue
        r["method"] = relabel.get(r["method"], r["method"])
        key = (r["method"], r.get("ablation", ""), r.get("ablation_value", ""), r["task"], r["labelled_scans"],
               r["seed"], r["lr"], r.get("consistency_weight"))  # a weight search's runs share the rest
        if key in cells:
            raise ExperimentError(f"relabel: runs {cells[key]} and {r.get('name')} both give {r['method']}'s cell "
                              f"{r['task']}, {r['labelled_scans']} scan(s), seed {r['seed']}, LR {r['lr']:g}")
        cells[key] = r.get("name")
    return [f"- rows `{old}` are reported as `{new}` (the same settings under another name)."
            for old, new in relabel.items()]
