"""Collecting a work dir's finished runs into one results CSV (each row: the run's settings, test and validation Dice,
its portable command, commit, bundle version, GPU and wall time) and a per-scan CSV beside it; and probing a
finished pre-training's clusters (pretrain_bim's ``path_dependence.json``)."""

from __future__ import annotations

import ast
import csv
import gzip
import io
import json
import math
import re
import shlex
import sys
from pathlib import Path

from bim.files import atomic_file

from .grid import _variant
from .runner import portable_command, test_evaluations
from .vocabulary import PRETRAIN_PATHS, PRETRAIN_TRAIN, ROOT, ExperimentError
CSV_SIGNIFICANT_DIGITS = 6  # a Dice of 0.8574790954589844 is written 0.857479: far below any difference we report
LONG_DECIMAL = re.compile(r"-?\d+\.\d{7,}(e[-+]?\d+)?")  # a float written with more digits than that


def short_float(value):
    """``value`` rounded to :data:`CSV_SIGNIFICANT_DIGITS` significant digits if it is a float (or a string of one
    with more digits, as a committed CSV holds it), else unchanged: the results CSVs stay about 5 % smaller."""
    if isinstance(value, str):
        return short_float(float(value)) if LONG_DECIMAL.fullmatch(value) else value
    return float(f"{value:.{CSV_SIGNIFICANT_DIGITS}g}") if isinstance(value, float) and math.isfinite(value) else value


def write_csv(rows: list[dict], keys: list[str], path: Path) -> Path:
    """``rows`` as a CSV with columns ``keys``, floats to :func:`short_float`'s precision, written to a temporary file
    and renamed (never half-written). A ``*.gz`` path is gzip-compressed without a name or time stamp, so the same
    rows give the same bytes (the committed results under ``docs/results`` are ``*.csv.gz``)."""
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=keys, extrasaction="ignore")
    writer.writeheader()
    writer.writerows({k: short_float(v) for k, v in row.items()} for row in rows)
    data = text.getvalue().encode()
    with atomic_file(path) as tmp:
        Path(tmp).write_bytes(gzip.compress(data, compresslevel=9, mtime=0) if path.suffix == ".gz" else data)
    return path


def per_scan_path(path: Path) -> Path:
    """The per-scan CSV beside a results CSV: ``X.csv`` -> ``X_per_scan.csv``, ``X.csv.gz`` -> ``X_per_scan.csv.gz``."""
    name = path.name
    for ext in (".csv.gz", ".csv"):
        if name.endswith(ext):
            return path.with_name(name[: -len(ext)] + "_per_scan" + ext)
    raise ExperimentError(f"{path}: a results CSV's name must end in .csv or .csv.gz")


def trains_cluster_head(variant_configs) -> bool:
    """Whether a pre-training of pretrain_bim's train.json with these variant config files (paths relative to the
    repository, or variant names) trains its dense cluster head: some weight of L_MI, L_CC or IMSAT is not 0. Those
    that do not (Contrast (Enc), Contrast (Dec)) leave the head at its initialisation: nothing to probe or score."""
    weights = json.loads((ROOT / PRETRAIN_TRAIN).read_text())["loss_weights"]
    for cfg in variant_configs:
        path = cfg if str(cfg).endswith(".json") else _variant(cfg)
        weights = {**weights, **json.loads((ROOT / path).read_text()).get("loss_weights", {})}
    return any(weights.get(k) not in (0, 0.0) for k in ("mi", "cc", "imsat"))


def _check_recorded_command(record: Path, args: list[str], configs: list[str]) -> None:
    """A recorded command is re-run only if it is what the runner writes: ``monai.bundle run`` of pretrain_bim's own
    config files with ``--key value`` pairs whose values are no config expressions (``$``, ``@``, ``%``), so a run
    folder from elsewhere cannot make the probe execute code of its choosing."""
    bundle_configs = (ROOT / "bundles" / "pretrain_bim" / "configs").resolve()
    if args[1:4] != ["-m", "monai.bundle", "run"]:
        raise ExperimentError(f"{record}: its command is not `python -m monai.bundle run ...`; not re-run")
    for cfg in configs:
        path = (ROOT / cfg).resolve() if not Path(cfg).is_absolute() else Path(cfg).resolve()
        if bundle_configs not in path.parents:
            raise ExperimentError(f"{record}: config file {cfg} is not one of pretrain_bim's configs; not re-run")
    pairs = args[4:]
    for key, value in zip(pairs[0::2], pairs[1::2]):
        if not key.startswith("--") or value.lstrip()[:1] in ("$", "@", "%"):
            raise ExperimentError(f"{record}: argument {key} {value!r} is not a plain --key value pair; not re-run")
    if len(pairs) % 2:
        raise ExperimentError(f"{record}: its command ends with a key without a value; not re-run")


def probe_command(run_dir, dataset_dir: str | None = None) -> list[str] | None:
    """The command that runs pretrain_bim's ``path_dependence.json`` on the finished pre-training in ``run_dir`` with
    the arguments it was trained with (read from its ``run.json``, so that the network matches: widths, clusters,
    ``dense_level``), its ``output_dir`` set to ``run_dir`` and, if given, another ``dataset_dir``. None for a
    variant whose cluster head is not trained (no L_MI, L_CC or IMSAT weight: nothing to probe)."""
    run_dir = Path(run_dir)
    record = run_dir / "run.json"
    if not record.is_file():
        raise ExperimentError(f"{record}: no such file (expected the run.json the runner writes for a pre-training)")
    rec = json.loads(record.read_text())
    if rec.get("kind") != "pretrain" or not rec.get("commands"):
        raise ExperimentError(f"{record}: expected the record of a pre-training with its commands, got kind "
                              f"{rec.get('kind')!r}")
    if not (run_dir / "checkpoint_final.pt").is_file():
        raise ExperimentError(f"{run_dir}: no checkpoint_final.pt; probe a pre-training once it has finished")
    args = shlex.split(rec["commands"][0])
    try:
        i, j = args.index("--config_file") + 1, args.index("--output_dir") + 1
    except ValueError:
        raise ExperimentError(f"{record}: its command has no --config_file or --output_dir: {rec['commands'][0]}") from None
    configs = ast.literal_eval(args[i]) if args[i].startswith("[") else [args[i]]
    _check_recorded_command(record, args, configs)
    if not trains_cluster_head(configs[1:]):
        return None
    args[0], args[i], args[j] = sys.executable, repr([*configs, PRETRAIN_PATHS]), str(run_dir)
    if dataset_dir is not None:
        args[args.index("--dataset_dir") + 1] = str(dataset_dir)
    return args


def path_dependence_columns(run_dir: Path) -> dict:
    """A pre-training's ``path_dependence_validation.json`` (pretrain_bim's ``configs/path_dependence.json``, run after
    the pre-training, so read at collection): ``pd_L<k>`` the share of pixels whose cluster changes without encoder
    level k's spatial information, ``pd_L<k>_in`` the same inside the labelled structures. Empty when not probed."""
    path = run_dir / "path_dependence_validation.json"
    if not path.is_file():
        return {}
    levels = json.loads(path.read_text())["levels"]
    return {key: value for k, v in levels.items()
            for key, value in ((f"pd_L{k}", v["changed"]), (f"pd_L{k}_in", v["changed_in_structures"]))}


def per_scan_dice(work: Path, results: list[dict]) -> dict[str, list[tuple[str, str]]]:
    """Run name -> [(scan, test Dice as written)] for every finished segmentation run (its evaluation's
    ``eval/*_dice.csv``); the run's method, task, seed and LR are its row of the results CSV."""
    runs = {}
    for res in results:
        if res.get("kind") == "pretrain":
            continue
        dice_csvs = test_evaluations(work / "runs" / res["name"], "_dice.csv")
        if not dice_csvs:
            continue
        with open(dice_csvs[-1], newline="") as f:
            runs[res["name"]] = [(scan["scan"], scan["dice"]) for scan in csv.DictReader(f)]
    return runs


def per_scan_table(runs: dict[str, list[tuple[str, object]]]) -> tuple[list[str], list[dict]]:
    """The per-scan CSV's columns and rows: one row per run, ``name`` then one column per test scan (sorted; empty
    where a run has no such scan). A run's 16 ACDC test scans take one row, not 16 (the long ``name,scan,dice``
    layout of earlier CSVs repeated the name on each; the report reads both)."""
    scans = sorted({scan for dice in runs.values() for scan, _ in dice})
    return ["name", *scans], [{"name": name, **{scan: d for scan, d in dice}} for name, dice in runs.items()]


def collect(work_dir, csv_path: str | None = None) -> Path:
    """Gather every ``runs/*/result.json`` of ``work_dir`` into one CSV (default ``work_dir/results.csv``; each run's
    training command as :func:`portable_command` writes it), and the test Dice of every scan into
    ``<that name>_per_scan.csv`` beside it (for the report's hardest-scans table). ``csv_path`` ``X.csv.gz`` writes
    both gzip-compressed, as the committed results are."""
    work = Path(work_dir)
    rows = [json.loads(p.read_text()) for p in sorted(work.glob("runs/*/result.json"))]
    if not rows:
        raise ExperimentError(f"{work}: no runs/*/result.json yet (run the grid first)")
    for row in rows:
        if row.get("command"):
            row["command"] = portable_command(row["command"])
    keys = ["name", "kind", "preset", "method", "init", "variant", "ablation", "ablation_value", "task", "labelled_scans",
            "seed", "lr", "paper_lr", "val_dice", "best_epoch", "test_dice", "test_dice_std_scans", "test_scans", "wall_s",
            "wall_s_all_attempts", "attempt", "gpu", "commit", "bundle_version", "panel", "command"]
    for row in rows:
        if row.get("kind") == "pretrain":
            row.update(path_dependence_columns(work / "runs" / row["name"]))
    keys += sorted({k for r in rows for k in r} - set(keys))
    path = Path(csv_path) if csv_path else work / "results.csv"
    per_scan = per_scan_path(path)  # checks the name before anything is written
    scans = per_scan_dice(work, rows)
    if scans:
        scan_keys, table = per_scan_table(scans)
        write_csv(table, scan_keys, per_scan)
    return write_csv(rows, keys, path)
