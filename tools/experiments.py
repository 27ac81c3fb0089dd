"""The paper's tables as experiments: grids of bundle runs, executed resumably, collected into one CSV.

    python tools/experiments.py plan acdc_fast                                   # list the runs of a preset
    python tools/experiments.py run acdc_fast --dataset_dir data/acdc --work_dir runs/acdc_fast --jobs 6
    python tools/experiments.py run_plan plan.json --dataset_dir data/acdc --work_dir runs/mixed --gpus 4 --jobs 16
    python tools/experiments.py collect runs/acdc_fast                           # -> runs/acdc_fast/results.csv
    python tools/experiments.py report runs/acdc_fast/results.csv --out_dir docs/results
    python tools/experiments.py weights W/runs/pre_full/model.pt pre_full_fp16.pt  # carry it to the next GPU lease

A *run* is one bundle job: a ``pretrain_bim`` variant, a ``finetune_seg`` fine-tune (train + evaluate on the test
scans) or a ``meanteacher_seg`` run (train + evaluate). Each run has its own folder ``work_dir/runs/<name>/``
(the bundle's ``output_dir``) holding ``log.txt``, ``run.json`` (the exact commands, overrides, seed, git commit,
GPU, wall time, status) and, once it has succeeded, ``result.json``. A run whose ``result.json`` exists is
skipped, so ``run`` resumes an interrupted grid (an interrupted bundle run resumes from its own last checkpoint,
``resume_from auto``). Fine-tunes wait for the pre-training they start from; up to ``jobs`` runs share the
GPU(s) concurrently (several small fine-tunes on one GPU are faster together than one after the other).

Presets (``PRESETS``): ``*_paper`` is the paper's protocol (50 epochs x 200 iterations everywhere, one
fine-tuning LR for all methods); ``*_fast`` a shortened protocol for a 10-minute GPU call. Both also run every
fine-tune at each LR of ``lrs`` so that the report can give, besides the paper's protocol (``paper_lr``), the
result of each method at its LR chosen on the validation split. ``*_ablation*`` are the alpha, lambda_CC and K
ablations at 1 labelled ACDC scan, of the full method's pre-training or, with ``--methods "Ours (Dec) MI+CC"`` (as
the paper's ablation tables), another pre-trained row's. ``smoke`` is a seconds-long CPU grid on the demo data (tests).
The grid of a preset can be narrowed on the command line (``--tasks lv --counts 1 --seeds 0 --lrs 5e-4``,
``--only 'ft_*'``), spread over several GPUs (``--gpus 2``) and run with extra bundle overrides under a tag
(``--tag adam --overrides '{"optimizer#_target_": "torch.optim.Adam"}'``, see :func:`build_grid`).
"""

from __future__ import annotations

import ast
import csv
import fnmatch
import gzip
import io
import json
import math
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUNDLES = ROOT / "bundles"
from bim.flags import require_flags  # noqa: E402  (torch-free, so the runner stays light)
from results_report import open_csv  # noqa: E402  (reads the committed *.csv.gz too; torch-free)

PRETRAIN_TRAIN = "bundles/pretrain_bim/configs/train.json"
PRETRAIN_PATHS = "bundles/pretrain_bim/configs/path_dependence.json"
FINETUNE_TRAIN = "bundles/finetune_seg/configs/train.json"
FINETUNE_EVAL = "bundles/finetune_seg/configs/evaluate.json"
MT_TRAIN = "bundles/meanteacher_seg/configs/train.json"
MT_EVAL = "bundles/meanteacher_seg/configs/evaluate.json"

# the rows of the paper's Table 1: label -> (pre-training variant or None, trainer)
METHODS = {
    "Baseline": (None, "finetune"),
    "IIC (Dec)": ("iic_dec", "finetune"),
    "Contrast (Enc)": ("contrast_enc", "finetune"),
    "Contrast (Enc+Dec)": ("contrast_enc_dec", "finetune"),
    "Ours (Dec) MI+CC": ("ours_mi_cc", "finetune"),
    "Contrast (Enc) + Ours (Dec)": ("full", "finetune"),
    "Mean Teacher": (None, "meanteacher"),
    "MT + Ours": ("full", "meanteacher"),
}


class ExperimentError(RuntimeError):
    """A preset, a grid or a results file that cannot be used as asked."""


@dataclass(frozen=True)
class Protocol:
    """The training budget of a preset. ``*_overrides`` are extra bundle command-line overrides."""

    pretrain_epochs: int = 50
    pretrain_iters: int = 200
    pretrain_warmup: int = 10
    finetune_epochs: int = 50
    finetune_iters: int = 200
    finetune_warmup: int = 10
    rampup_epochs: int = 10
    paper_lr: float = 2e-5
    lrs: tuple[float, ...] = (2e-5, 1e-4, 5e-4)
    pretrain_overrides: tuple[str, ...] = ()
    finetune_overrides: tuple[str, ...] = ()
    # appended to run names (a grid run with extra overrides, see ``build_grid``'s ``tag``)
    name_suffix: str = ""
    pretrain_suffix: str = ""


@dataclass(frozen=True)
class Run:
    """One bundle job of a grid. ``meta`` holds what the results table is indexed by (method, task, labelled
    scans, seed, lr, ablation ...); ``depends`` names the pre-training run it starts from."""

    name: str
    kind: str  # pretrain | finetune | meanteacher
    commands: tuple[tuple[str, ...], ...]
    meta: dict = field(default_factory=dict, hash=False, compare=False)
    depends: tuple[str, ...] = ()
    # the wall time a fresh run is expected to take, in seconds (a plan grid's ``expected_s``), for ``finish_by``
    expected_s: float | None = field(default=None, compare=False)


def _fmt_lr(lr: float) -> str:
    return f"{lr:.0e}".replace("e-0", "e-")


def _cli_value(value) -> str:
    """A bundle override as ``monai.bundle run`` (Python Fire) reads it back: strings as they are, anything else as
    a Python literal -- JSON's ``false`` / ``null`` would arrive as the strings 'false' / 'null'."""
    return value if isinstance(value, str) else repr(value)


def _cmd(config_files: list[str], overrides: dict) -> tuple[str, ...]:
    cfg = config_files[0] if len(config_files) == 1 else repr(config_files)
    args = [sys.executable, "-m", "monai.bundle", "run", "--config_file", cfg]
    for k, v in overrides.items():
        args += [f"--{k}", _cli_value(v)]
    return tuple(args)


def _merge_args(cmd: tuple[str, ...], extra: tuple[str, ...]) -> tuple[str, ...]:
    """``cmd`` with the ``--key value`` pairs of ``extra`` applied: a key already in ``cmd`` gets the new value in
    place, a new key is appended -- so a recorded command names every key once."""
    args = list(cmd)
    for key, value in zip(extra[::2], extra[1::2]):
        if key in args:
            args[args.index(key) + 1] = value
        else:
            args += [key, value]
    return tuple(args)


def _variant(name: str) -> str:
    path = f"bundles/pretrain_bim/configs/variants/{name}.json"
    if not (ROOT / path).is_file():
        raise ExperimentError(f"pre-training variant {name!r}: {path} does not exist")
    return path


def pretrain_run(variant: str, dataset_dir: str, work: Path, proto: Protocol, extra: dict | None = None,
                 tag: str = "") -> Run:
    """Pre-training with the ``variant`` of ``pretrain_bim`` (plus ``extra`` overrides, e.g. an ablation's alpha)."""
    name = f"pre_{variant}{tag}{proto.pretrain_suffix}"
    out = work / "runs" / name
    overrides = {"dataset_dir": dataset_dir, "output_dir": str(out), "epochs": proto.pretrain_epochs,
                 "iters_per_epoch": proto.pretrain_iters, "warmup_epochs": proto.pretrain_warmup,
                 "progress_bar": False, **(extra or {})}
    cmd = _merge_args(_cmd([PRETRAIN_TRAIN, _variant(variant)], overrides), proto.pretrain_overrides)
    meta = {"variant": variant, "ablation": tag.lstrip("_"), **(extra or {})}
    if proto.pretrain_suffix:
        meta["tag"] = proto.pretrain_suffix.lstrip("_")
    return Run(name, "pretrain", (cmd,), meta)


def segmentation_run(kind: str, method: str, init: Run | None, task: str, n: int, seed: int, lr: float,
                     dataset_dir: str, work: Path, proto: Protocol, extra_meta: dict | None = None,
                     consistency_weight: float | None = None) -> Run:
    """A fine-tune (``kind`` finetune) or a Mean Teacher run (``kind`` meanteacher): train, then evaluate the
    best-validation checkpoint on the test scans. ``init`` is the pre-training run it starts from (None: random).
    ``consistency_weight``: a Mean Teacher run's weight of L_MT, in its name (``_cw0.1``) and meta (None: the
    bundle's default, not named)."""
    init_name = init.name if init is not None else "random"
    prefix = {"finetune": "ft", "meanteacher": "mt"}[kind]
    cw = "" if consistency_weight is None else f"_cw{consistency_weight:g}"
    name = f"{prefix}_{init_name}_{task}_n{n}_s{seed}_lr{_fmt_lr(lr)}{cw}{proto.name_suffix}"
    out = work / "runs" / name
    common = {"dataset_dir": dataset_dir, "output_dir": str(out), "task": task, "labelled_scans": n,
              "split_seed": seed, "seed": seed}
    train = {**common, "pretrained": str(work / "runs" / init.name / "model.pt") if init else "None",
             "learning_rate": lr, "epochs": proto.finetune_epochs, "iters_per_epoch": proto.finetune_iters,
             "warmup_epochs": proto.finetune_warmup, "progress_bar": False}
    if kind == "meanteacher":
        train["rampup_epochs"] = proto.rampup_epochs
        if consistency_weight is not None:
            train["consistency_weight"] = consistency_weight
    train_cfg, eval_cfg = (FINETUNE_TRAIN, FINETUNE_EVAL) if kind == "finetune" else (MT_TRAIN, MT_EVAL)
    commands = (_merge_args(_cmd([train_cfg], train), proto.finetune_overrides),
                _merge_args(_cmd([train_cfg, eval_cfg], common), proto.finetune_overrides))
    meta = {"method": method, "init": init_name, "task": task, "labelled_scans": n, "seed": seed, "lr": lr,
            "paper_lr": proto.paper_lr, **(extra_meta or {})}
    if consistency_weight is not None:
        meta["consistency_weight"] = consistency_weight
    return Run(name, kind, commands, meta, (init.name,) if init else ())


# --------------------------------------------------------------------------------------------------- presets

ACDC_TASKS, ACDC_COUNTS = ("lv", "rv", "myo"), (1, 2, 4)
PROSTATE_TASKS, PROSTATE_COUNTS = ("prostate",), (4, 6, 8)
TABLE1 = ("Baseline", "IIC (Dec)", "Contrast (Enc)", "Ours (Dec) MI+CC", "Contrast (Enc) + Ours (Dec)",
          "Mean Teacher", "MT + Ours")
PROSTATE_ROWS = ("Baseline", "Contrast (Enc) + Ours (Dec)", "Mean Teacher", "MT + Ours")

FAST = Protocol(pretrain_epochs=10, pretrain_iters=200, pretrain_warmup=2, finetune_epochs=20,
                finetune_iters=100, finetune_warmup=2, rampup_epochs=5, paper_lr=1e-4, lrs=(2e-5, 1e-4, 5e-4),
                pretrain_overrides=("--panel_every", "1000", "--save_every", "1000", "--log_every", "200"),
                finetune_overrides=("--save_every", "500", "--log_every", "100"))
# acdc_fast keeps the light labelled augmentation all of its rows were measured with (finetune_seg and meanteacher_seg
# < 0.3.0: rotation ±15°, zoom 0.9-1.1, no gamma); the bundles' ACDC default is T's ranges since 0.3.0
# (ACDC_AUGMENTATION in bundles/bim/tasks.py). A tag's --overrides still replace these values.
LIGHT_AUGMENTATION = ("--max_rotation_deg", "15.0", "--scale_range", "[0.9, 1.1]", "--gamma_range", "None")
ACDC_FAST = replace(FAST, finetune_overrides=FAST.finetune_overrides + LIGHT_AUGMENTATION)
PAPER = Protocol()
SMOKE = Protocol(pretrain_epochs=1, pretrain_iters=2, pretrain_warmup=0, finetune_epochs=1, finetune_iters=2,
                 finetune_warmup=0, rampup_epochs=1, paper_lr=1e-3, lrs=(1e-3,),
                 pretrain_overrides=("--features", "[8,16,32,64,128,8]", "--scans_per_batch", "2",
                                     "--crop_size", "64", "--panel_every", "2", "--save_every", "2"),
                 finetune_overrides=("--features", "[8,16,32,64,128,8]", "--crop_size", "64", "--batch_size", "2",
                                     "--unlabelled_batch_size", "2", "--save_every", "2"))

PRESETS = {
    # name: (protocol, methods, tasks, counts, seeds, ablations)
    "acdc_fast": (ACDC_FAST, TABLE1, ACDC_TASKS, ACDC_COUNTS, (0, 1, 2), False),
    "acdc_paper": (PAPER, TABLE1, ACDC_TASKS, ACDC_COUNTS, (0, 1, 2), False),
    "promise12_fast": (replace(FAST, pretrain_epochs=5, pretrain_iters=400), PROSTATE_ROWS, PROSTATE_TASKS, PROSTATE_COUNTS, (0, 1, 2), False),
    # the paper's epoch is N iterations for both stages, N = 400 for PROMISE12 (its appendix); its fine-tuning base LR
    # 1e-6 x the ACDC multiplier 200 gives 2e-4 (the same sentence's N = 400 as the multiplier would give 4e-4)
    "promise12_paper": (replace(PAPER, pretrain_iters=400, finetune_iters=400, paper_lr=2e-4, lrs=(2e-5, 2e-4, 5e-4)),
                        PROSTATE_ROWS,
                        PROSTATE_TASKS, PROSTATE_COUNTS, (0, 1, 2), False),
    "acdc_ablation_fast": (ACDC_FAST, (), ("lv",), (1,), (0,), True),
    "smoke": (SMOKE, ("Baseline", "Contrast (Enc) + Ours (Dec)", "Mean Teacher"), ("lv",), (1,), (0,), False),
}
ABLATIONS = {"alpha": (0.0, 0.25, 0.5, 0.75, 1.0), "lambda_cc": (0.0, 0.1, 1.0, 4.0),
             "num_clusters": (5, 10, 20, 40, 60)}


def ablation_defaults(variant: str = "full") -> dict:
    """The value each ablated hyper-parameter (``ABLATIONS``) takes in ``variant``'s pre-training when not ablated:
    pretrain_bim's ``configs/train.json`` under the variant's overrides. The three ablations share this point."""
    values = {}
    for path in (ROOT / PRETRAIN_TRAIN, ROOT / _variant(variant)):
        values.update(json.loads(path.read_text()))
    return {key: float(values[key]) for key in ABLATIONS}


def narrow_runs(grid: list[Run], only) -> list[Run]:
    """The runs of ``grid`` whose names match one of the ``only`` patterns (fnmatch), plus the pre-trainings they
    need, in the grid's order; ``only`` None keeps the grid."""
    if not only:
        return grid
    pats = _as_tuple(only, str)
    keep = [r for r in grid if any(fnmatch.fnmatch(r.name, p) for p in pats)]
    needed = {d for r in keep for d in r.depends}
    return [r for r in grid if r in keep or r.name in needed]


def collected_rows(csv_paths, columns: tuple[str, ...]) -> list[dict]:
    """The rows of ``csv_paths`` (results CSVs of earlier GPU leases, written by ``collect``; a list, or fire's
    ``"[a.csv, b.csv]"`` string), each CSV checked to exist and to have ``columns`` (``skip_collected``'s reading)."""
    listed = isinstance(csv_paths, str) and csv_paths.startswith("[")  # fire keeps "[a.csv, b.csv]" a string
    rows = []
    for p in (_path_list(csv_paths) if listed else _as_tuple(csv_paths, str)):
        path = Path(p)
        if not path.is_file():
            raise ExperimentError(f"{path}: no such results CSV (skip_collected expects CSVs written by collect)")
        with open_csv(path) as f:
            reader = csv.DictReader(f)
            if not set(columns) <= set(reader.fieldnames or []):
                wanted = f"a {columns[0]} column" if len(columns) == 1 else f"the columns {', '.join(columns)}"
                raise ExperimentError(f"{path}: expected a results CSV with {wanted}; got columns {reader.fieldnames}")
            rows += list(reader)
    return rows


def drop_collected(grid: list[Run], csv_paths) -> list[Run]:
    """``grid`` without the runs already collected, by name, in ``csv_paths`` (results CSVs of earlier GPU leases,
    written by ``collect``), so that a later lease of a plan runs only what is missing. A pre-training stays while a
    remaining run needs it, and goes when every run that needed it is collected; ``csv_paths`` None keeps the grid."""
    if not csv_paths:
        return grid
    collected = {row["name"] for row in collected_rows(csv_paths, ("name",))}
    remaining = [r for r in grid if r.kind == "pretrain" or r.name not in collected]
    needed = {d for r in remaining for d in r.depends}
    had_dependants = {d for r in grid for d in r.depends}
    return [r for r in remaining if r.kind != "pretrain" or r.name in needed
            or (r.name not in collected and r.name not in had_dependants)]


def _as_tuple(value, cast, names: bool = False) -> tuple | None:
    """A command-line value (one item, a list, or a comma/space-separated string; ``names``: comma-separated
    only, since method names contain spaces) as a tuple of ``cast`` items."""
    if value is None:
        return None
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",")] if names else value.replace(",", " ").split()
    if not isinstance(value, (list, tuple)):
        value = [value]
    return tuple(cast(v) for v in value)


_JSON_WORDS = {"null": None, "true": True, "false": False}


def _json_literals(value):
    """``value`` with JSON's bare ``null`` / ``true`` / ``false`` as Python's: Fire parses the command line's
    ``--overrides '{"compile_mode": null}'`` into ``{"compile_mode": "null"}``."""
    if isinstance(value, dict):
        return {k: _json_literals(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_literals(v) for v in value]
    return _JSON_WORDS.get(value, value) if isinstance(value, str) else value


def _overrides_args(overrides, what: str) -> tuple[str, ...]:
    """A ``{key: value}`` dict of bundle overrides (or None) as command-line arguments."""
    if overrides in (None, "", {}):
        return ()
    if not isinstance(overrides, dict):
        raise ExperimentError(f"{what} must be a dict of bundle overrides such as "
                              f"'{{\"optimizer#_target_\": \"torch.optim.Adam\"}}', got {overrides!r}")
    return tuple(a for k, v in overrides.items() for a in (f"--{k}", _cli_value(v)))


def build_grid(preset: str, dataset_dir: str, work_dir: str, tasks=None, counts=None, seeds=None, lrs=None,
               methods=None, only: str | None = None, tag: str | None = None, overrides: dict | None = None,
               pretrain_overrides: dict | None = None, mt_weights=None) -> list[Run]:
    """The runs of ``preset`` (see ``PRESETS``), optionally narrowed; pre-training runs first.

    ``mt_weights``: Mean Teacher's consistency weights to search (``--mt_weights 0.01,0.1,1``; the paper picks it on
    validation from 1e-4 to 10): each Mean Teacher / MT + Ours run is then run once per weight, named ``..._cw0.1``
    and recorded with its ``consistency_weight``; the report chooses among them on validation. None: the bundle's
    default weight, one run per cell.

    ``overrides`` / ``pretrain_overrides``: extra bundle overrides for every fine-tune and Mean Teacher run / every
    pre-training (e.g. another optimiser, a longer schedule). They need a ``tag``, which is appended to the names of
    the runs they change and to the method labels (``Baseline [tag]``), so that they neither collide with nor mix
    into the preset's own runs; a tagged grid reuses the untagged pre-trainings unless ``pretrain_overrides``."""
    if preset not in PRESETS:
        raise ExperimentError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
    proto, rows, p_tasks, p_counts, p_seeds, ablation = PRESETS[preset]
    overrides, pretrain_overrides = _json_literals(overrides), _json_literals(pretrain_overrides)
    seg_extra, pre_extra = _overrides_args(overrides, "overrides"), _overrides_args(pretrain_overrides, "pretrain_overrides")
    if (seg_extra or pre_extra) and not tag:
        raise ExperimentError("overrides / pretrain_overrides change the protocol: give them a --tag (a short name "
                              "such as adam) that keeps their runs apart from the preset's")
    if tag is not None and (not str(tag) or not all(c.isalnum() or c in "-." for c in str(tag))):
        raise ExperimentError(f"tag must be letters, digits, '-' or '.', got {tag!r}")
    if tag:
        proto = replace(proto, finetune_overrides=proto.finetune_overrides + seg_extra,
                        pretrain_overrides=proto.pretrain_overrides + pre_extra, name_suffix=f"_{tag}",
                        pretrain_suffix=f"_{tag}" if pre_extra else "")
    tag_meta = {"tag": tag} if tag else {}
    if tag:  # what the tag means travels with each run into the CSV, so the report can say it
        tag_meta.update({k: json.dumps(v, sort_keys=True) for k, v in
                         (("overrides", overrides), ("pretrain_overrides", pretrain_overrides)) if v})
        tag_meta.setdefault("overrides", "{}")  # a tag without overrides: the preset's settings in a row of its own

    def label(method: str) -> str:  # the report's row: tagged runs get rows of their own
        return f"{method} [{tag}]" if tag else method
    tasks = _as_tuple(tasks, str) or p_tasks
    counts = _as_tuple(counts, int) or p_counts
    seeds = _as_tuple(seeds, int) or p_seeds
    lrs = _as_tuple(lrs, float) or proto.lrs
    rows = _as_tuple(methods, str, names=True) if methods is not None else rows
    for m in rows:
        if m not in METHODS:
            raise ExperimentError(f"unknown method {m!r}; choose among {list(METHODS)}")
    ablated = ()
    if ablation:  # methods name the pre-trained rows whose pre-training the ablation varies (default: the full method)
        ablated, rows = (rows if methods is not None else ("Contrast (Enc) + Ours (Dec)",)), ()
        pretrained = [m for m, (v, kind) in METHODS.items() if v is not None and kind == "finetune"]
        for m in ablated:
            if m not in pretrained:
                raise ExperimentError(f"{preset} varies a pre-training: method {m!r} has none to vary; choose among "
                                      f"{pretrained}")
    work = Path(work_dir).resolve()
    dataset_dir = str(Path(dataset_dir).resolve()) if dataset_dir not in (None, "None") else "None"
    pre: dict[str, Run] = {}
    runs: list[Run] = []

    def init_run(variant, extra=None, ablation_tag=""):
        if variant is None:
            return None
        key = f"{variant}{ablation_tag}"
        if key not in pre:
            pre[key] = pretrain_run(variant, dataset_dir, work, proto, extra, ablation_tag)
        return pre[key]

    weights = _as_tuple(mt_weights, float) or ()
    if any(not math.isfinite(w) or w < 0 for w in weights):
        raise ExperimentError(f"mt_weights must be consistency weights >= 0, got {mt_weights!r}")
    for method in rows:
        variant, kind = METHODS[method]
        init = init_run(variant)
        for task in tasks:
            for n in counts:
                for seed in seeds:
                    for lr in lrs:
                        for weight in (weights if kind == "meanteacher" and weights else (None,)):
                            runs.append(segmentation_run(kind, label(method), init, task, n, seed, lr, dataset_dir,
                                                         work, proto, tag_meta, consistency_weight=weight))
    for method in ablated:
        defaults, default_point_run = ablation_defaults(METHODS[method][0]), False
        for key, values in ABLATIONS.items():
            for value in values:
                if float(value) == defaults[key]:  # the point all three share runs once, under the first key
                    if default_point_run:
                        continue
                    default_point_run = True
                init = init_run(METHODS[method][0], {key: value}, f"_{key}{value:g}")
                for task in tasks:
                    for n in counts:
                        for seed in seeds:
                            for lr in lrs:
                                runs.append(segmentation_run("finetune", label(method), init, task, n, seed, lr,
                                                             dataset_dir, work, proto,
                                                             {"ablation": key, "ablation_value": value, **tag_meta}))
    grid = list(pre.values()) + runs
    for r in grid:  # into result.json and the CSV: the report refuses one run name from two presets
        r.meta.setdefault("preset", preset)
    return narrow_runs(grid, only)


def is_positive_seconds(value) -> bool:
    """A positive number of seconds (an int or float, not a bool or a string): ``expected_s``, ``finish_by``."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


PLAN_KEYS = ("preset", "tasks", "counts", "seeds", "lrs", "methods", "only", "tag", "overrides", "pretrain_overrides",
             "mt_weights", "expected_s")
INCLUDE_KEYS = ("plan", "only")  # a plan entry that takes another plan's runs, narrowed


def read_plan(plan) -> list[dict]:
    """A plan: a list of entries, given as a list or as the path of a JSON file holding one. An entry is a grid, a
    dict of :func:`build_grid`'s arguments (``preset`` and optionally ``PLAN_KEYS``), or an include,
    ``{"plan": "other.json", "only": ["ft_pre_x_*"]}``: the runs of another plan file (a path relative to the
    including file's folder) that ``only`` names, with the pre-trainings they need (:func:`narrow_runs`), so that one
    lease can run the remainders of two plans without copying their grids."""
    if isinstance(plan, (str, Path)):
        path = Path(plan)
        if not path.is_file():
            raise ExperimentError(f"plan {str(plan)!r}: no such JSON file (expected a list of grids such as "
                                  '[{"preset": "acdc_fast", "tag": "long", "overrides": {"epochs": 50}}])')
        try:
            plan = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ExperimentError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(plan, (list, tuple)) or not plan:
        raise ExperimentError(f"plan: expected a non-empty list of grids, got {type(plan).__name__}")
    for i, entry in enumerate(plan):
        if isinstance(entry, dict) and "plan" in entry:
            unknown = sorted(set(entry) - set(INCLUDE_KEYS))
            if unknown or not isinstance(entry["plan"], str) or not entry["plan"].endswith(".json"):
                raise ExperimentError(f"plan entry {i}: an include takes only {list(INCLUDE_KEYS)}, 'plan' the name of "
                                      f"a plan file (.json), got {entry!r}")
            only = entry.get("only")
            if only is not None and not (isinstance(only, list) and only and all(isinstance(o, str) for o in only)):
                raise ExperimentError(f"plan entry {i}: an include's 'only' must be a non-empty list of run-name "
                                      f"patterns, got {only!r}")
            continue
        if not isinstance(entry, dict) or "preset" not in entry:
            raise ExperimentError(f"plan entry {i}: expected an object with a 'preset' (a grid) or a 'plan' (an "
                                  f"include), got {entry!r}")
        unknown = sorted(set(entry) - set(PLAN_KEYS))
        if unknown:
            raise ExperimentError(f"plan entry {i}: unknown keys {unknown}; allowed: {list(PLAN_KEYS)}")
        if entry.get("expected_s") is not None and not is_positive_seconds(entry["expected_s"]):
            raise ExperimentError(f"plan entry {i}: expected_s must be a positive number of seconds (the wall time of "
                                  f"one of its runs at the plan's concurrency), got {entry['expected_s']!r}")
    return [dict(e) for e in plan]


def build_plan(plan, dataset_dir: str, work_dir: str, only=None, _including: tuple = ()) -> list[Run]:
    """The runs of every entry of ``plan`` (see :func:`read_plan`) in one list, pre-trainings first, so that one runner
    spreads them all over its GPUs; a grid's ``expected_s`` becomes its runs' estimate (for ``run_grid``'s
    ``finish_by``); an include brings the runs of another plan as that plan gives them. A run that several entries
    share (the same name, e.g. an untagged pre-training) is kept once; the same name with other commands (e.g. one tag
    given two meanings) is an error. ``only``: run-name patterns that narrow the whole plan (see
    :func:`narrow_runs`), e.g. one pre-training for a GPU of its own."""
    here = Path(plan).resolve() if isinstance(plan, (str, Path)) else None
    runs: dict[str, Run] = {}
    for i, entry in enumerate(read_plan(plan)):
        if "plan" in entry:
            other = ((here.parent if here else Path.cwd()) / entry["plan"]).resolve()
            if not other.is_file():
                raise ExperimentError(f"plan entry {i}{f' of {here}' if here else ''}: includes {entry['plan']}, but "
                                      f"{other} is no file (an include names a plan file beside the including one)")
            if other in _including or other == here:
                chain = " -> ".join(p.name for p in (*_including, here, other) if p)
                raise ExperimentError(f"plan entry {i} of {here}: including {entry['plan']} makes a cycle: {chain}")
            grid = build_plan(other, dataset_dir, work_dir, entry.get("only"), (*_including, *([here] if here else [])))
        else:
            expected_s = entry.pop("expected_s", None)
            grid = [replace(r, expected_s=None if expected_s is None else float(expected_s))
                    for r in build_grid(dataset_dir=dataset_dir, work_dir=work_dir, **entry)]
        for r in grid:
            if r.name in runs and runs[r.name].commands != r.commands:
                raise ExperimentError(f"plan entry {i}: run {r.name} is in an earlier grid with other commands "
                                      "(give this grid its own --tag)")
            runs.setdefault(r.name, r)
    return narrow_runs(sorted(runs.values(), key=lambda r: r.kind != "pretrain"), only)


# ---------------------------------------------------------------------------------------------------- runner


def _git_commit() -> str:
    """HEAD (``+dirty`` with uncommitted changes to tracked files); ``BIM_GIT_COMMIT`` overrides it, for copies of
    the checkout whose ``.git`` is not the one the code came from (e.g. a remote GPU machine)."""
    if os.environ.get("BIM_GIT_COMMIT"):
        return os.environ["BIM_GIT_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                               text=True, check=True).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


TRAIN_CONFIG_OF_KIND = {"pretrain": PRETRAIN_TRAIN, "finetune": FINETUNE_TRAIN, "meanteacher": MT_TRAIN}


def bundle_version(kind: str) -> str | None:
    """The ``version`` in ``configs/metadata.json`` of the bundle that runs of ``kind`` train with, recorded with each
    run, so that a CSV shows which defaults a run had when a bundle's default changes between leases (e.g.
    ``meanteacher_seg`` 0.7.2's CUDA graphs); None for a kind without a bundle or a metadata file without one."""
    if kind not in TRAIN_CONFIG_OF_KIND:
        return None
    meta = (ROOT / TRAIN_CONFIG_OF_KIND[kind]).with_name("metadata.json")
    if not meta.is_file():
        return None
    try:
        return json.loads(meta.read_text()).get("version")
    except json.JSONDecodeError as e:
        raise ExperimentError(f"{meta}: not valid JSON ({e})") from None


def _gpu_name() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30)
        names = [n.strip() for n in out.stdout.splitlines() if n.strip()]
        if out.returncode == 0 and names:
            return f"{len(names)} x {names[0]}" if len(names) > 1 else names[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return "cpu"


def atomic_write_json(obj, path: Path) -> None:
    """Write ``obj`` as JSON to ``path`` through a temporary file in the same folder and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=2, sort_keys=True)
            f.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def run_dir(work_dir, run: Run) -> Path:
    return Path(work_dir).resolve() / "runs" / run.name


# where a run reads and writes, not what it does, and the stand-in of each in the results CSV (portable_command)
PATH_PLACEHOLDERS = {"--dataset_dir": "DATASET", "--output_dir": "RUN", "--pretrained": "INIT"}
PATH_ARGS = tuple(PATH_PLACEHOLDERS)


def settings_of(command) -> list[str]:
    """A bundle command (a string as ``run.json`` records it, or an argument list) without its interpreter and
    ``PATH_ARGS``: what makes two runs of one name the same run, wherever the data and the work dir live."""
    args = iter((shlex.split(command) if isinstance(command, str) else list(command))[1:])
    kept = []
    for a in args:
        if a in PATH_ARGS:
            next(args, None)  # and its value
        else:
            kept.append(a)
    return kept


def portable_command(command: str) -> str:
    """A bundle command as the results CSV records it: the interpreter as ``python`` and the value of each of
    ``PATH_ARGS`` as a placeholder, ``DATASET`` (the prepared data set), ``RUN`` (the run's folder, ``runs/<name>`` in
    the work dir) and ``INIT`` (the ``model.pt`` of the run in the ``init`` column; ``None`` stays), so that the CSV
    holds what a run did, not where it ran (the run's ``run.json`` keeps the exact command). Its
    :func:`settings_of` are the command's."""
    args = shlex.split(command)
    if args:
        args[0] = "python"
    for i, a in enumerate(args[:-1]):
        if a in PATH_PLACEHOLDERS and not (a == "--pretrained" and args[i + 1] == "None"):
            args[i + 1] = PATH_PLACEHOLDERS[a]
    return shlex.join(args)


def _flag_values(commands: list[list[str]]) -> dict[str, str]:
    """``{"cmd0 --flag": value}`` over several commands' arguments (a flag without a value maps to "")."""
    pairs = {}
    for i, args in enumerate(commands):
        for k, a in enumerate(args):
            if a.startswith("--"):
                nxt = args[k + 1] if k + 1 < len(args) and not args[k + 1].startswith("--") else ""
                pairs[f"{a}" if i == 0 else f"{a} (command {i + 1})"] = nxt
    return pairs


def check_finished_runs(grid: list[Run], work_dir) -> None:
    """A finished run is skipped by name, so a work dir that holds a run of the same name made with other settings
    (another preset, other overrides) would silently stand in for this grid's: refuse it, naming the run and the
    arguments that differ. Runs whose ``run.json`` recorded no commands are not checked."""
    clashes = []
    for r in grid:
        out = run_dir(work_dir, r)
        if not (out / "result.json").is_file() or not (out / "run.json").is_file():
            continue
        recorded = json.loads((out / "run.json").read_text()).get("commands")
        if recorded is None:
            continue
        old, new = [settings_of(c) for c in recorded], [settings_of(c) for c in r.commands]
        if old != new:
            o, n = _flag_values(old), _flag_values(new)
            diff = sorted(k for k in o.keys() | n.keys() if o.get(k) != n.get(k))
            clashes.append(f"{r.name} (recorded: {', '.join(f'{k} {o.get(k)}' for k in diff) or old}; "
                           f"this grid: {', '.join(f'{k} {n.get(k)}' for k in diff) or new})")
    if clashes:
        raise ExperimentError(f"{Path(work_dir).resolve()}: {len(clashes)} finished run(s) of this grid's names were "
                              f"made with other settings, e.g. {clashes[0]}. Use another --work_dir for another preset, "
                              "or a --tag for other overrides")


def result_of(run: Run, out: Path) -> dict:
    """What a finished run contributes to the results table (read from the files its bundle wrote)."""
    res = {"name": run.name, "kind": run.kind, **run.meta}
    if run.kind == "pretrain":
        if not (out / "model.pt").is_file():
            raise ExperimentError(f"{out}: the pre-training wrote no model.pt")
        panel = out / "panels" / "clusters_latest.png"  # relative to the work_dir (results.csv's folder)
        res["panel"] = panel.relative_to(out.parents[1]).as_posix() if panel.is_file() else ""
        quality = out / "cluster_quality.json"  # pretrain_bim's label-based score of the clusters, when labels exist
        if quality.is_file():
            q = json.loads(quality.read_text())
            res["cq_nmi"] = q["nmi"]
            for name, v in q["classes"].items():
                res[f"cq_{name}"], res[f"cq_{name}_per_scan"] = v["pooled_dice"], v["per_scan_dice"]
                for key in ("many_to_one_dice", "precision", "recall"):  # absent from pretrain_bim < 0.2.1
                    if key in v:
                        res[f"cq_{name}_{key.removesuffix('_dice')}"] = v[key]
        return res
    summaries = sorted((out / "eval").glob("*_summary.json"))
    best = out / "best_metric.json"
    if not summaries or not best.is_file():
        raise ExperimentError(f"{out}: expected eval/*_summary.json and best_metric.json after training + evaluation")
    summary, best = json.loads(summaries[-1].read_text()), json.loads(best.read_text())
    res.update(test_dice=summary["mean"], test_dice_std_scans=summary["std"], test_scans=summary["n"],
               val_dice=best["value"], best_epoch=best["epoch"])
    return res


_CHILDREN: set[subprocess.Popen] = set()  # the bundle processes running now (stopped with the runner)
_CHILDREN_LOCK = threading.Lock()
_STOPPING = threading.Event()  # set by stop_children: no bundle command starts any more


def _run_child(cmd, log, env) -> int:
    """Run one bundle command to its end and return its exit code; :func:`stop_children` can stop it."""
    with _CHILDREN_LOCK:
        if _STOPPING.is_set():
            return -signal.SIGTERM
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
        _CHILDREN.add(proc)
    try:
        return proc.wait()
    finally:
        with _CHILDREN_LOCK:
            _CHILDREN.discard(proc)


def stop_children(grace_s: float = 20.0) -> None:
    """SIGTERM every running bundle process, then SIGKILL those still alive after ``grace_s`` seconds. A stopped
    run is recorded as failed; its next attempt resumes from its last checkpoint."""
    with _CHILDREN_LOCK:
        _STOPPING.set()
        procs = list(_CHILDREN)
    for proc in procs:
        proc.terminate()
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()


def execute(run: Run, work_dir, env: dict | None = None) -> dict:
    """Run the commands of ``run`` (logging to ``log.txt``), then write ``run.json`` and ``result.json``."""
    out = run_dir(work_dir, run)
    out.mkdir(parents=True, exist_ok=True)
    # an interrupted earlier attempt (its bundle resumes from its checkpoints): wall_s counts this attempt only,
    # wall_s_all_attempts adds the earlier ones (None when one of them was killed before it could record its time)
    previous = json.loads((out / "run.json").read_text()) if (out / "run.json").is_file() else {}
    record = {"name": run.name, "kind": run.kind, "meta": run.meta, "commands": [shlex.join(c) for c in run.commands],
              "commit": _git_commit(), "bundle_version": bundle_version(run.kind), "gpu": _gpu_name(),
              "host": os.uname().nodename, "status": "running",
              "cuda_visible_devices": (env or os.environ).get("CUDA_VISIBLE_DEVICES"),
              "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "attempt": int(previous.get("attempt", 0)) + 1,
              "earlier_attempts_started": previous.get("earlier_attempts_started", []) + (
                  [previous["started"]] if "started" in previous else []),
              "earlier_attempts_wall_s": previous.get("earlier_attempts_wall_s", []) + (
                  [previous.get("wall_s")] if "started" in previous else [])}
    atomic_write_json(record, out / "run.json")
    start = time.perf_counter()
    with open(out / "log.txt", "a") as log:
        for cmd in run.commands:
            log.write(f"+ {shlex.join(cmd)}\n")
            log.flush()
            rc = _run_child(cmd, log, env)
            if rc != 0:
                record.update(status="failed", returncode=rc, wall_s=round(time.perf_counter() - start, 1))
                atomic_write_json(record, out / "run.json")
                raise ExperimentError(f"run {run.name} failed (exit {rc}); see {out / 'log.txt'}")
    record.update(status="done", wall_s=round(time.perf_counter() - start, 1))
    earlier = record["earlier_attempts_wall_s"]
    record["wall_s_all_attempts"] = None if None in earlier else round(record["wall_s"] + sum(earlier), 1)
    result = {**result_of(run, out), "wall_s": record["wall_s"], "wall_s_all_attempts": record["wall_s_all_attempts"],
              "attempt": record["attempt"],
              "commit": record["commit"], "bundle_version": record["bundle_version"], "gpu": record["gpu"],
              "command": record["commands"][0]}
    atomic_write_json(record, out / "run.json")
    atomic_write_json(result, out / "result.json")
    return result


# GPU load of a run when placing it on one of several GPUs: a pre-training step processes ~7x the images of a
# fine-tuning step (36 vs 5), a Mean Teacher step ~3x (student labelled + unlabelled, teacher)
RUN_LOAD = {"pretrain": 3, "meanteacher": 2, "finetune": 1}


def parse_gpus(gpus) -> list[str]:
    """``--gpus``: None (every run sees what the environment gives), a count (``2``: GPUs 0 and 1) or a list of
    device ids (``0,1`` / ``[0, 1]``). Ids count within the parent's ``CUDA_VISIBLE_DEVICES`` when that is set
    (see :func:`visible_device`), so ``CUDA_VISIBLE_DEVICES=1 ... --gpus 1`` runs everything on physical GPU 1."""
    if gpus in (None, "", "None"):
        return []
    if isinstance(gpus, int) and not isinstance(gpus, bool):
        if gpus < 1:
            raise ExperimentError(f"gpus must be >= 1 (a count) or a list of device ids, got {gpus}")
        return [str(i) for i in range(gpus)]
    ids = [str(g).strip() for g in (gpus.split(",") if isinstance(gpus, str) else gpus) if str(g).strip()]
    if not ids or len(set(ids)) != len(ids) or not all(i.isdigit() for i in ids):
        raise ExperimentError(f"gpus must be a count or distinct device ids such as 0,1; got {gpus!r}")
    return ids


def visible_device(gpu: str, env: dict) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` value for the runner's GPU id ``gpu``: the id itself, or, when the parent
    environment already restricts the devices, the ``gpu``-th entry of that list (as CUDA numbers them)."""
    parent = [d.strip() for d in (env.get("CUDA_VISIBLE_DEVICES") or "").split(",") if d.strip()]
    if not parent:
        return gpu
    if int(gpu) >= len(parent):
        raise ExperimentError(f"gpus: id {gpu} is out of range for CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']!r} "
                              f"({len(parent)} device(s), ids 0..{len(parent) - 1})")
    return parent[int(gpu)]


def pick_gpu(gpus: list[str], running: list[tuple[str, str]]) -> str:
    """The GPU of ``gpus`` with the least load (``RUN_LOAD``) among the ``running`` (gpu, kind) pairs; ties go to
    the first listed."""
    load = {g: 0 for g in gpus}
    for g, kind in running:
        if g in load:
            load[g] += RUN_LOAD.get(kind, 1)
    return min(gpus, key=lambda g: load[g])


def fits_before(run: Run, work_dir, elapsed_s: float, finish_by: float | None) -> bool:
    """Whether ``run`` may start ``elapsed_s`` seconds into a runner that must be done ``finish_by`` seconds after
    its start: always without ``finish_by`` or without the run's ``expected_s``, and always for a run with an
    earlier attempt (it resumes from its checkpoint, so its estimate says nothing); else if it is expected to end
    in time. A run held back is left for a later runner, where it would be lost if cut (the last call of a lease)."""
    if finish_by is None or run.expected_s is None or (run_dir(work_dir, run) / "run.json").is_file():
        return True
    return elapsed_s + run.expected_s <= finish_by


def run_grid(grid: list[Run], work_dir, jobs: int = 1, log=print, gpus=None, finish_by: float | None = None) -> dict:
    """Execute ``grid`` with up to ``jobs`` concurrent runs; runs with a ``result.json`` are skipped, a run waits
    for its pre-training, a failed pre-training skips its dependants. With ``gpus`` (see :func:`parse_gpus`) each
    run is started on the least loaded of those GPUs (``CUDA_VISIBLE_DEVICES``). With ``finish_by`` (seconds from
    now) a fresh run is started only if its ``expected_s`` ends before then (see :func:`fits_before`); a later,
    shorter run of the grid may take its place, and the runner returns when only held runs (and their dependants)
    are left. Returns counts per outcome."""
    if jobs < 1:
        raise ExperimentError(f"jobs must be >= 1, got {jobs}")
    if finish_by is not None and not is_positive_seconds(finish_by):
        raise ExperimentError(f"finish_by must be a positive number of seconds from the runner's start, got {finish_by!r}")
    gpus = parse_gpus(gpus)
    env = dict(os.environ)
    for g in gpus:  # an id outside the parent's CUDA_VISIBLE_DEVICES fails before anything runs
        visible_device(g, env)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // jobs)))
    check_finished_runs(grid, work_dir)
    placed: dict[str, str] = {}  # run name -> GPU
    done = {r.name for r in grid if (run_dir(work_dir, r) / "result.json").is_file()}
    counts = {"skipped_existing": len(done), "done": 0, "failed": 0, "skipped_dependency": 0, "held": 0}
    pending = [r for r in grid if r.name not in done]
    failed: set[str] = set()
    held: set[str] = set()  # fresh runs expected to end after finish_by
    running: dict[Future, Run] = {}
    t0 = time.perf_counter()
    _STOPPING.clear()

    def on_sigterm(signum, frame):  # `timeout` or `kill` stops the runner: stop its bundles too, never orphan them
        if _STOPPING.is_set():  # GNU timeout signals the runner and then its whole process group: act once
            return
        _STOPPING.set()
        log(f"signal {signum}: stopping {len(running)} running run(s)")
        stop_children()
        raise SystemExit(128 + signum)

    in_main = threading.current_thread() is threading.main_thread()
    previous_handler = signal.signal(signal.SIGTERM, on_sigterm) if in_main else None
    try:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            while pending or running:
                for r in list(pending):
                    if any(d in failed for d in r.depends):
                        pending.remove(r)
                        failed.add(r.name)
                        counts["skipped_dependency"] += 1
                        log(f"skip {r.name}: its pre-training failed")
                    elif len(running) < jobs and all(d in done for d in r.depends):
                        if not fits_before(r, work_dir, time.perf_counter() - t0, finish_by):
                            if r.name not in held:
                                held.add(r.name)
                                log(f"hold {r.name}: expected {r.expected_s:.0f} s, "
                                    f"{finish_by - (time.perf_counter() - t0):.0f} s left before finish_by")
                            continue
                        pending.remove(r)
                        run_env = env
                        if gpus:
                            placed[r.name] = pick_gpu(gpus, [(placed[x.name], x.kind) for x in running.values()])
                            run_env = {**env, "CUDA_VISIBLE_DEVICES": visible_device(placed[r.name], env)}
                        log(f"start {r.name}" + (f" on GPU {placed[r.name]}" if gpus else ""))
                        running[pool.submit(execute, r, work_dir, run_env)] = r
                if not running:
                    blocked = set(held)  # held runs and, transitively, the runs that start from them
                    while True:
                        more = {r.name for r in pending if set(r.depends) & blocked} - blocked
                        if not more:
                            break
                        blocked |= more
                    outside = [r.name for r in pending if r.name not in blocked]
                    if outside:
                        raise ExperimentError(f"runs wait on pre-trainings outside the grid: {outside}")
                    counts["held"] = len(pending)
                    if pending:
                        log(f"{len(pending)} run(s) held for a later runner: expected to end after finish_by")
                    break
                finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
                for fut in finished:
                    r = running.pop(fut)
                    try:
                        res = fut.result()
                        done.add(r.name)
                        counts["done"] += 1
                        dice = f", test Dice {res['test_dice']:.4f}" if "test_dice" in res else ""
                        log(f"done {r.name} in {res['wall_s']:.0f} s{dice} [{time.perf_counter() - t0:.0f} s]")
                    except ExperimentError as e:
                        failed.add(r.name)
                        counts["failed"] += 1
                        log(f"FAILED {e}")
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous_handler)
    counts["wall_s"] = round(time.perf_counter() - t0, 1)
    return counts


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
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(gzip.compress(data, compresslevel=9, mtime=0) if path.suffix == ".gz" else data)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
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
        dice_csvs = sorted((work / "runs" / res["name"] / "eval").glob("*_dice.csv"))
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


def _run_identity(row: dict) -> tuple:
    """What tells one finished run from every other, whatever it was renamed to since (``rename_pretraining``): its
    portable training command, commit and wall time (a rerun of the same command takes another time)."""
    wall = row.get("wall_s")
    return (row.get("command") or "", row.get("commit") or "",
            "" if wall in (None, "") else str(short_float(float(wall))))


def drop_recollected(rows: list[dict], csv_paths) -> list[dict]:
    """``rows`` (a work dir's results, commands already portable) without the runs that ``csv_paths`` (results CSVs
    of earlier leases) hold already: the runs a lease restored from ``.carry/PHASE`` and did not run again. A kept
    run fine-tuned from a dropped pre-training that those CSVs hold under another name (``rename_pretraining``) gets
    that name as its ``init``, so that the new CSV points at the row the report already has."""
    earlier = {_run_identity(r): r["name"] for r in collected_rows(csv_paths, ("name", "command", "commit", "wall_s"))}
    dropped = {r["name"]: earlier[_run_identity(r)] for r in rows if _run_identity(r) in earlier}
    kept = [dict(r) for r in rows if r["name"] not in dropped]
    for r in kept:
        if r.get("init") in dropped:
            r["init"] = dropped[r["init"]]
    return kept


def collect(work_dir, csv_path: str | None = None, skip_collected=None) -> Path:
    """Gather every ``runs/*/result.json`` of ``work_dir`` into one CSV (default ``work_dir/results.csv``; each run's
    training command as :func:`portable_command` writes it), and the test Dice of every scan into
    ``<that name>_per_scan.csv`` beside it (for the report's hardest-scans table). ``csv_path`` ``X.csv.gz`` writes
    both gzip-compressed, as the committed results are. ``skip_collected``: results CSVs of the plan's earlier
    leases, whose runs (restored from ``.carry``) are left out (:func:`drop_recollected`)."""
    work = Path(work_dir)
    rows = [json.loads(p.read_text()) for p in sorted(work.glob("runs/*/result.json"))]
    if not rows:
        raise ExperimentError(f"{work}: no runs/*/result.json yet (run the grid first)")
    for row in rows:
        if row.get("command"):
            row["command"] = portable_command(row["command"])
    if skip_collected:
        rows = drop_recollected(rows, skip_collected)
        if not rows:
            raise ExperimentError(f"{work}: every finished run is in {skip_collected} already; nothing new to collect")
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


def rename_pretraining(csv_path, old: str, new: str) -> int:
    """Rename the pre-training ``old`` to ``new`` in a results CSV: its row's ``name`` (and ``panel`` folder) and the
    ``init`` of every run fine-tuned from it, so that CSVs of two leases whose runner gave their pre-trainings the
    same name (e.g. ``pre_ours_mi_cc``) can be reported together. Returns the number of runs re-pointed; the CSV is
    rewritten whole (temporary file, then rename) or not at all."""
    path = Path(csv_path)
    if not path.is_file():
        raise ExperimentError(f"{path}: no such results CSV (expected one written by collect)")
    with open_csv(path) as f:
        reader = csv.DictReader(f)
        keys, rows = list(reader.fieldnames or []), list(reader)
    if not {"name", "kind", "init"} <= set(keys):
        raise ExperimentError(f"{path}: expected a results CSV with the columns name, kind and init; got {keys}")
    names = [r["name"] for r in rows]
    pre = [r for r in rows if r["name"] == old]
    if len(pre) != 1 or pre[0]["kind"] != "pretrain":
        raise ExperimentError(f"{path}: expected one pre-training row named {old!r}; found "
                              f"{[r['kind'] for r in pre] or 'none'} (pre-trainings: "
                              f"{[r['name'] for r in rows if r['kind'] == 'pretrain']})")
    if new in names:
        raise ExperimentError(f"{path}: a run named {new!r} exists already; choose another name")
    pre[0]["name"] = new
    if pre[0].get("panel"):
        pre[0]["panel"] = pre[0]["panel"].replace(f"runs/{old}/", f"runs/{new}/")
    moved = [r for r in rows if r["init"] == old]
    for r in moved:
        r["init"] = new
    write_csv(rows, keys, path)
    return len(moved)


_EPOCH_LINE = re.compile(r" - [\w.]*?(Trainer|Evaluator) - INFO - Epoch\[(\d+)\] Complete\. Time taken: (\d+):(\d+):([\d.]+)")


def run_progress(work_dir) -> list[dict]:
    """How far each unfinished run of ``work_dir`` got (a ``runs/NAME/log.txt`` and no ``result.json``), for a GPU
    lease's next call: ``epoch`` (its trainer's last finished epoch) of ``epochs`` (``--epochs`` of the last command
    its log shows), ``epoch_s`` (the median trainer epoch plus the median validation, leaving out the first epoch of
    each attempt, which compiles) and ``left_s`` = (``epochs`` - ``epoch``) x ``epoch_s``, without the next attempt's
    start-up (about 30-90 s). A run with no finished epoch has ``epoch_s`` and ``left_s`` None."""
    out = []
    for log in sorted(Path(work_dir).glob("runs/*/log.txt")):
        if (log.parent / "result.json").exists():
            continue
        epochs, epoch, times, first = None, 0, {"Trainer": [], "Evaluator": []}, set()
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("+ "):  # an attempt's command: its first epochs compile, leave them out
                flags = line.split()
                epochs = int(flags[flags.index("--epochs") + 1]) if "--epochs" in flags[:-1] else epochs
                first = {"Trainer", "Evaluator"}
                continue
            m = _EPOCH_LINE.search(line)
            if m is None:
                continue
            engine, seconds = m.group(1), int(m.group(3)) * 3600 + int(m.group(4)) * 60 + float(m.group(5))
            if engine == "Trainer":
                epoch = max(epoch, int(m.group(2)))
            if engine in first:
                first.discard(engine)
            else:
                times[engine].append(seconds)
        epoch_s = None
        if times["Trainer"]:
            epoch_s = statistics.median(times["Trainer"]) + statistics.median(times["Evaluator"] or [0.0])
        left = None if epoch_s is None or epochs is None else round(max(epochs - epoch, 0) * epoch_s, 1)
        out.append({"name": log.parent.name, "epoch": epoch, "epochs": epochs,
                    "epoch_s": None if epoch_s is None else round(epoch_s, 2), "left_s": left})
    return out


WEIGHT_DTYPES = ("float16", "float32")


def cast_weights(src, dst, dtype: str) -> Path:
    """Write the weights of checkpoint ``src`` to ``dst`` as a plain state dict whose floating tensors are ``dtype``
    (``"float16"`` or ``"float32"``), atomically. A pre-training's ``model.pt`` (31 MB in float32 for the paper's
    U-Net) comes back from a GPU call in float16 (16 MB, under the device's 16 MiB a file) and is carried to the next
    lease, where float32 makes it the ``model.pt`` its fine-tunes read again; the round trip changes each weight by
    at most 2^-11 of its value (2^-25 under float16's normal range, 6e-5). ``src``: a plain state dict or a bundle
    checkpoint with a ``"network"`` entry. A finite value that ``dtype`` cannot hold (over 65504 in float16) is an
    error naming the tensor, not an inf in the copy."""
    if dtype not in WEIGHT_DTYPES:
        raise ExperimentError(f"dtype must be one of {list(WEIGHT_DTYPES)}, got {dtype!r}")
    import torch
    from bim.engine import atomic_save
    from bim.segmentation import read_state_dict

    try:
        tensors = read_state_dict(src)
    except (FileNotFoundError, ValueError) as e:
        raise ExperimentError(str(e)) from None
    to = getattr(torch, dtype)
    cast = {k: v.to(to) if v.is_floating_point() else v for k, v in tensors.items()}
    for k, v in cast.items():
        if v.is_floating_point() and not torch.equal(torch.isfinite(v), torch.isfinite(tensors[k])):
            raise ExperimentError(f"{src}: tensor {k!r} has values that {dtype} cannot hold (largest magnitude "
                                  f"{tensors[k].abs().max().item():.4g}); keep it in float32")
    return atomic_save(cast, dst)


# ------------------------------------------------------------------------------------------------------- CLI


class CLI:
    """Experiment runner of the BIM bundles (see the module docstring)."""

    def presets(self) -> list[str]:
        """The preset names."""
        return sorted(PRESETS)

    def plan(self, preset: str, dataset_dir: str = "DATASET", work_dir: str = "WORK", **narrow) -> None:
        """Print the runs of ``preset`` (narrowed by tasks/counts/seeds/lrs/methods/only) without running them."""
        grid = build_grid(preset, dataset_dir, work_dir, **narrow)
        for r in grid:
            print(f"{r.name}\t{r.kind}\t{json.dumps(r.meta)}")
        print(f"{len(grid)} runs", file=sys.stderr)

    def run(self, preset: str, dataset_dir: str | None, work_dir: str, jobs: int = 1, gpus=None, **narrow) -> None:
        """Execute the grid of ``preset`` on ``dataset_dir`` (prepared by data_prep; None: the demo data) in
        ``work_dir``, ``jobs`` runs at a time (``gpus``: spread them over these GPUs, e.g. ``2`` or ``0,1``), then
        write ``work_dir/results.csv``. Exits 1 if a run failed."""
        self._execute(preset, build_grid(preset, dataset_dir, work_dir, **narrow), work_dir, jobs, gpus)

    def run_plan(self, plan, dataset_dir: str | None, work_dir: str, jobs: int = 1, gpus=None,
                 dry_run: bool = False, only=None, finish_by: float | None = None, skip_collected=None) -> None:
        """Execute several grids as one (see :func:`build_plan`): ``plan`` is a JSON file (or list) of grids, each
        ``{"preset": ..., "tasks": ..., "tag": ..., "overrides": {...}}`` as ``run``'s arguments, or includes of another
        plan's runs, ``{"plan": "other.json", "only": ["ft_pre_x_*"]}`` (see :func:`read_plan`). One runner then
        balances all of their runs over ``gpus``, which separate runners, blind to each other, cannot.
        ``only``: run-name patterns narrowing the whole plan (``'["pre_full"]'``). ``dry_run``: print the runs.
        ``finish_by``: seconds from now by which the runner must be done (the last call of a GPU lease, whose cut runs
        are lost with the machine): a fresh run of a grid with ``expected_s`` starts only if it should end in time,
        and a later, shorter one may take its slot (see :func:`run_grid`). ``skip_collected``: results CSVs of earlier
        leases (``'["docs/results/X/results_calls_Y.csv.gz"]'``) whose runs are left out (see :func:`drop_collected`)."""
        try:  # fire gives --dry_run false as the string 'false', which is truthy
            require_flags({"dry_run": dry_run})
        except ValueError as e:
            raise ExperimentError(str(e)) from None
        grid = narrow_runs(drop_collected(build_plan(plan, dataset_dir, work_dir), skip_collected), only)
        if dry_run:
            for r in grid:
                print(f"{r.name}\t{r.kind}\t{json.dumps(r.meta)}")
            print(f"{len(grid)} runs", file=sys.stderr)
            return
        self._execute("plan", grid, work_dir, jobs, gpus, finish_by)

    def _execute(self, what: str, grid: list[Run], work_dir: str, jobs: int, gpus, finish_by=None) -> None:
        parse_gpus(gpus)  # a bad --gpus fails before anything runs
        Path(work_dir).mkdir(parents=True, exist_ok=True)
        print(f"{what}: {len(grid)} runs, {jobs} at a time, on {_gpu_name()}", flush=True)
        counts = run_grid(grid, work_dir, jobs, log=lambda s: print(s, flush=True), gpus=gpus, finish_by=finish_by)
        print(json.dumps(counts), flush=True)
        if counts["done"] + counts["skipped_existing"]:
            print(f"results: {collect(work_dir)}")
        if counts["failed"] or counts["skipped_dependency"]:
            sys.exit(1)

    def collect(self, work_dir: str, csv_path: str | None = None, skip_collected=None) -> None:
        """Write ``work_dir/results.csv`` (or ``csv_path``) from the finished runs; ``skip_collected``: the results
        CSVs of earlier leases of the plan, e.g. ``'["docs/results/acdc_paper_length/results_calls_rows2b.csv.gz"]'``,
        whose runs (restored from ``.carry``) are left out, and whose names for renamed pre-trainings the new runs'
        ``init`` takes."""
        print(collect(work_dir, csv_path, skip_collected))

    def probe(self, run_dir: str, dataset_dir: str | None = None) -> None:
        """Run pretrain_bim's ``path_dependence.json`` on a finished pre-training of the runner (``runs/pre_*``) with
        the arguments it was trained with: writes ``path_dependence_validation.json`` there (``collect`` copies it
        into the CSV), logging to ``path_dependence.log``. ``dataset_dir``: if the data moved since."""
        cmd = probe_command(run_dir, dataset_dir)
        if cmd is None:
            print(f"{run_dir}: its variant trains no cluster head; nothing to probe")
            return
        log = Path(run_dir) / "path_dependence.log"
        with open(log, "w") as f:
            rc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT).returncode
        if rc != 0:
            raise ExperimentError(f"{run_dir}: the probe failed (exit {rc}); see {log}")
        print(Path(run_dir) / "path_dependence_validation.json")

    def progress(self, work_dir: str) -> None:
        """One line per unfinished run of ``work_dir``: its last epoch, seconds an epoch and seconds left (see
        :func:`run_progress`), so that a lease's next call can be narrowed to the runs that can end in it."""
        if not (Path(work_dir) / "runs").is_dir():
            raise ExperimentError(f"{work_dir}: no runs/ folder (expected a runner's work dir)")
        for p in run_progress(work_dir):
            print(f"{p['name']}: epoch {p['epoch']} of {p['epochs']}, {p['epoch_s']} s an epoch, {p['left_s']} s left")

    def rename_pretraining(self, csv_path: str, old: str, new: str) -> None:
        """Rename pre-training ``old`` to ``new`` in ``csv_path`` (its row and its fine-tunes' ``init``), e.g.
        ``pre_ours_mi_cc`` to ``pre_ours_mi_cc_rows2`` before reporting it beside another lease's CSV."""
        print(f"{csv_path}: {old} -> {new}, {rename_pretraining(csv_path, old, new)} runs fine-tuned from it")

    def table1(self, cells_paths, out: str = "docs/results/table1.md") -> None:
        """Merge reports' ``table_cells.json`` into Table 1 as far as it has been measured, our means beside the
        paper's at the paper's single LR and at each row's LR chosen on validation, with how many pairs of rows are
        in the paper's order, into ``out``."""
        from results_report import write_table1_status

        paths = [str(p) for p in _path_list(cells_paths)]
        print(write_table1_status(paths, out, "python tools/experiments.py table1 \"[" + ", ".join(paths) + "]\""))

    def weights(self, src: str, dst: str, dtype: str = "float16") -> None:
        """Copy a checkpoint's weights to ``dst`` with floating tensors in ``dtype`` (float16 to carry a
        pre-training's ``model.pt`` between GPU leases, float32 to restore it; see :func:`cast_weights`)."""
        print(cast_weights(src, dst, dtype))

    def panels(self, csv_paths, out_png: str, ablations: bool = False) -> None:
        """Draw the cluster panels of the pre-trainings in results CSV(s) side by side, as the report does (the
        paper's Figure 3; ``ablations``: the ablations' pre-trainings, a figure row per ablation) into ``out_png``:
        for figures of pre-trainings that a report's own figure leaves out, e.g. one lease's. The panels are read
        from ``runs/NAME/panels`` beside each CSV, as ``collect`` leaves them."""
        from results_report import plot_cluster_panels, read_rows

        if ablations not in (True, False):
            raise ExperimentError(f"ablations must be True or False, got {ablations!r} (write --ablations True)")
        paths = _path_list(csv_paths)
        pretrains = [r for r in read_rows(paths) if r.get("kind") == "pretrain"]
        png = plot_cluster_panels(pretrains, Path(out_png), ablations=ablations)
        if png is None:
            raise ExperimentError(f"{[str(p) for p in paths]}: none of their {len(pretrains)} pre-trainings has a "
                                  f"cluster panel to draw (expected runs/NAME/panels/*.png beside the CSV)")
        print(png)

    def report(self, csv_paths, out_dir: str = "docs/results", title: str = "Results", note: str = "",
               methods=None, relabel=None, paper_lr: float | None = None, per_scan=None, pair_with=None,
               groups: str | None = None, group_focus: str | None = None, panels_note: str = "",
               order_against: str | None = None, order_against_name: str = "", per_scan_methods=None,
               lr_pools=None) -> None:
        """Render results CSV(s) as the paper's tables (markdown) and plots (PNG) in ``out_dir`` (``note``: a
        paragraph placed under the title; ``methods``: only these rows, e.g. ``'["Baseline [long]"]'``;
        ``relabel``: rows that ran the same settings under another label, ``'{"Baseline [longaug]": "Baseline"}'``;
        ``paper_lr``: one LR for every row of the paper-protocol table, in place of each preset's; ``per_scan``:
        the ``*_per_scan.csv`` files ``collect`` writes, for a table of the hardest test scans; ``pair_with``: the
        reference(s) of a row in the run-for-run table, ``'{"Ours [pre10k]": "Baseline [long]"}'`` or
        ``'{"Contrast (Enc) + Ours (Dec)": ["Baseline", "Contrast (Enc)"]}'``; default Baseline;
        ``groups``: the data set's ``datalist.json``, for the test Dice by patient group, with ``group_focus`` a group
        to detail run by run, e.g. NOR; ``panels_note``: markdown closing the cluster maps' section;
        ``order_against``: another report's ``table_cells.json``, named ``order_against_name``, whose order of the
        untagged rows each table is also counted against, e.g. a fast protocol's against the full one's;
        ``per_scan_methods``: only these rows in the hardest-scans and patient-group tables, e.g. Table 1's;
        ``lr_pools``: lines of the LR-choice summary pooling several rows, ``'{"full method": ["A [x]", "A [y]"]}'``). Without
        the pre-training folders a cluster panel PNG already in ``out_dir`` is kept and linked. Besides README.md
        and the PNGs, it writes ``table_cells.json`` (each table's means and seed counts, for another report's
        ``order_against`` and for ``table1``)."""
        from results_report import write_report

        if relabel is not None and not isinstance(relabel, dict):
            raise ExperimentError(f"relabel must be a JSON object of labels, old -> new; got {relabel!r}")
        if lr_pools is not None and not (isinstance(lr_pools, dict) and all(isinstance(v, list) for v in lr_pools.values())):
            raise ExperimentError(f"lr_pools must be a JSON object, name -> [row labels]; got {lr_pools!r}")
        if pair_with is not None and not isinstance(pair_with, dict):
            raise ExperimentError(f"pair_with must be a JSON object of labels, method -> reference or [references]; "
                                  f"got {pair_with!r}")
        for p in write_report(_path_list(csv_paths), out_dir, title=title, note=note, methods=methods, relabel=relabel,
                              paper_lr=None if paper_lr is None else float(paper_lr),
                              per_scan=_path_list(per_scan) if per_scan else None, pair_with=pair_with,
                              groups=groups, group_focus=group_focus, panels_note=panels_note,
                              order_against=order_against, order_against_name=order_against_name,
                              per_scan_methods=per_scan_methods, lr_pools=lr_pools):
            print(p)


def _path_list(value) -> list:
    """A CLI list of paths: fire keeps "[a.csv, b.csv]" (names with dots) as one string."""
    if isinstance(value, str) and value.startswith("[") and value.endswith("]"):
        value = [x.strip().strip("'\"") for x in value[1:-1].split(",") if x.strip()]
    return [value] if isinstance(value, str) else list(value)


def main() -> None:
    import fire

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    try:
        fire.Fire(CLI)
    except ExperimentError as e:  # bad input: one line that names the file or key, not a traceback
        print(f"experiments.py: {e}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
