"""Grids: a preset (``vocabulary.PRESETS``), narrowed on the command line, as a list of bundle runs.

A *run* is one bundle job: a ``pretrain_bim`` variant, a ``finetune_seg`` fine-tune (train, then evaluate on the test
scans) or a ``meanteacher_seg`` run (train, then evaluate). Its commands are plain ``python -m monai.bundle run``
command lines; fine-tunes name the pre-training they start from in ``depends``.
"""

from __future__ import annotations

import ast
import fnmatch
import json
import math
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from bim.options import record_patiences

from .vocabulary import (ABLATIONS, AUTHORS_OPTION_GROUPS, EARLIER_DEFAULTS, EARLY_STOP_EVAL_PREFIX, FINETUNE_EVAL,
                         FINETUNE_TRAIN, METHODS, MT_EVAL, MT_TRAIN, PRESETS, PRETRAIN_TRAIN, ROOT, ExperimentError,
                         Protocol, fmt_lr, pretrain_seed_name)


@dataclass(frozen=True)
class Run:
    """One bundle job of a grid. ``meta`` holds what the results table is indexed by (method, task, labelled
    scans, seed, lr, ablation ...); ``depends`` names the pre-training run it starts from."""

    name: str
    kind: str  # pretrain | finetune | meanteacher
    commands: tuple[tuple[str, ...], ...]
    meta: dict = field(default_factory=dict, hash=False, compare=False)
    depends: tuple[str, ...] = ()


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
                 tag: str = "", seed: int | None = None, left_out: str | None = None) -> Run:
    """Pre-training with the ``variant`` of ``pretrain_bim`` (plus ``extra`` overrides, e.g. an ablation's alpha).
    ``seed``: the pre-training's own seed, named ``_ps<seed>`` (None: the bundle's default, not named).
    ``left_out``: the group of the authors' options (``AUTHORS_OPTION_GROUPS``) that ``extra`` sets back, labelled
    ``[without GROUP]`` in the tables instead of an ablation."""
    name = f"pre_{variant}{tag}{pretrain_seed_name(seed)}{proto.pretrain_suffix}"
    out = work / "runs" / name
    overrides = {"dataset_dir": dataset_dir, "output_dir": str(out), "epochs": proto.pretrain_epochs,
                 "iters_per_epoch": proto.pretrain_iters, "warmup_epochs": proto.pretrain_warmup,
                 "progress_bar": False, **(extra or {}), **({} if seed is None else {"seed": seed})}
    cmd = _merge_args(_cmd([PRETRAIN_TRAIN, _variant(variant)], overrides), proto.pretrain_overrides)
    meta = {"variant": variant, "ablation": "" if left_out else tag.lstrip("_"), **(extra or {})}
    if seed is not None:
        meta["pretrain_seed"] = seed
    tags = [t for t in (proto.pretrain_suffix.lstrip("_"), left_out and f"without {left_out}") if t]
    if tags:
        meta["tag"] = ", ".join(tags)
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
    name = f"{prefix}_{init_name}_{task}_n{n}_s{seed}_lr{fmt_lr(lr)}{cw}{proto.name_suffix}"
    out = work / "runs" / name
    common = {"dataset_dir": dataset_dir, "output_dir": str(out), "task": task, "labelled_scans": n,
              "split_seed": seed, "seed": seed}
    train = {**common, "pretrained": str(work / "runs" / init.name / "model.pt") if init else "None",
             "learning_rate": lr, "epochs": proto.finetune_epochs, "iters_per_epoch": proto.finetune_iters,
             "warmup_epochs": proto.finetune_warmup, "progress_bar": False}
    if kind == "meanteacher":
        train["rampup_epochs"] = proto.rampup_epochs
        if proto.unlabelled_batch_size is not None:
            train["unlabelled_batch_size"] = proto.unlabelled_batch_size
        if consistency_weight is not None:
            train["consistency_weight"] = consistency_weight
    train_cfg, eval_cfg = (FINETUNE_TRAIN, FINETUNE_EVAL) if kind == "finetune" else (MT_TRAIN, MT_EVAL)
    commands = (_merge_args(_cmd([train_cfg], train), proto.finetune_overrides),
                _merge_args(_cmd([train_cfg, eval_cfg], common), proto.finetune_overrides))
    for patience in recorded_patiences(proto.finetune_overrides):  # also score each model early stopping would keep
        early = {**common, "checkpoint": str(out / f"model_patience{patience}.pt"),
                 "eval_prefix": f"{EARLY_STOP_EVAL_PREFIX}{patience}"}
        commands += (_merge_args(_cmd([train_cfg, eval_cfg], early), proto.finetune_overrides),)
    meta = {"method": method, "init": init_name, "task": task, "labelled_scans": n, "seed": seed, "lr": lr,
            "paper_lr": proto.paper_lr, **(extra_meta or {})}
    if consistency_weight is not None:
        meta["consistency_weight"] = consistency_weight
    return Run(name, kind, commands, meta, (init.name,) if init else ())


def recorded_patiences(overrides: tuple[str, ...]) -> tuple[int, ...]:
    """The patiences of ``--record_early_stop`` (``10`` or ``[5, 10]``) among command-line ``overrides``, ascending
    (none: not recorded)."""
    value = dict(zip(overrides[::2], overrides[1::2])).get("--record_early_stop")
    try:
        return record_patiences(None if value in (None, "None", "null") else ast.literal_eval(value))
    except (ValueError, SyntaxError):  # not a Python literal, or not patiences
        raise ExperimentError("overrides: record_early_stop must be a number of validations >= 1 or a list of them "
                              f"such as [5, 10], got {value!r}") from None


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


SELECT_KEYS = ("tasks", "counts", "seeds", "lrs", "methods", "only", "mt_weights", "pretrain_per_seed")


def _read_select(select) -> dict:
    """``select``: a dict narrowing a preset, keys among ``SELECT_KEYS`` (``{"tasks": "lv", "seeds": [0, 1]}``)."""
    select = _json_literals(select or {})
    if not isinstance(select, dict) or set(select) - set(SELECT_KEYS):
        raise ExperimentError(f"select must be a dict with keys among {list(SELECT_KEYS)}, got {select!r}")
    return select


def _tagged(proto: Protocol, tag, overrides, pretrain_overrides) -> tuple[Protocol, dict]:
    """The protocol with a tag's overrides applied, and the meta that records the tag's meaning in each run."""
    overrides, pretrain_overrides = _json_literals(overrides), _json_literals(pretrain_overrides)
    seg_extra = _overrides_args(overrides, "overrides")
    pre_extra = _overrides_args(pretrain_overrides, "pretrain_overrides")
    if (seg_extra or pre_extra) and not tag:
        raise ExperimentError("overrides / pretrain_overrides change the protocol: give them a --tag (a short name "
                              "such as adam) that keeps their runs apart from the preset's")
    if tag is not None and (not str(tag) or not all(c.isalnum() or c in "-." for c in str(tag))):
        raise ExperimentError(f"tag must be letters, digits, '-' or '.', got {tag!r}")
    if not tag:
        return proto, {}
    proto = replace(proto, finetune_overrides=proto.finetune_overrides + seg_extra,
                    pretrain_overrides=proto.pretrain_overrides + pre_extra, name_suffix=f"_{tag}",
                    pretrain_suffix=f"_{tag}" if pre_extra else "")
    meta = {"tag": tag, **{k: json.dumps(v, sort_keys=True) for k, v in
                           (("overrides", overrides), ("pretrain_overrides", pretrain_overrides)) if v}}
    meta.setdefault("overrides", "{}")  # a tag without overrides: the preset's settings in a row of its own
    return proto, meta


def _rows(preset: str, methods) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(segmentation rows, rows whose pre-training an ablation preset varies) of ``preset`` under ``methods``."""
    p = PRESETS[preset]
    rows = _as_tuple(methods, str, names=True) if methods is not None else p.methods
    for m in rows:
        if m not in METHODS:
            raise ExperimentError(f"unknown method {m!r}; choose among {list(METHODS)}")
    if not (p.ablation or p.leave_one_out):
        return rows, ()
    ablated = rows if methods is not None else p.ablated
    pretrained = [m for m, (v, kind) in METHODS.items() if v is not None and kind == "finetune"]
    for m in ablated:
        if m not in pretrained:
            raise ExperimentError(f"{preset} varies a pre-training: method {m!r} has none to vary; choose among "
                                  f"{pretrained}")
    return (), ablated


def left_out_points() -> list[tuple[str, dict]]:
    """(group, the overrides that set it back) for each group of ``AUTHORS_OPTION_GROUPS``, the earlier values read
    from pretrain_bim's ``configs/earlier_defaults.json``."""
    earlier = json.loads((ROOT / EARLIER_DEFAULTS).read_text())
    points = []
    for group, keys in AUTHORS_OPTION_GROUPS.items():
        missing = [k for k in keys if k not in earlier]
        if missing:
            raise ExperimentError(f"{EARLIER_DEFAULTS}: no earlier value for {missing} (group {group!r}); expected "
                                  f"every key of {list(keys)}")
        points.append((group, {k: earlier[k] for k in keys}))
    return points


def _ablation_points(variant: str):
    """(key, value) of each ablation pre-training of ``variant``; the point the three ablations share runs once."""
    defaults, shared_done = ablation_defaults(variant), False
    for key, values in ABLATIONS.items():
        for value in values:
            if float(value) == defaults[key]:
                if shared_done:
                    continue
                shared_done = True
            yield key, value


def build_grid(preset: str, dataset_dir: str, work_dir: str, select=None, tag: str | None = None,
               overrides: dict | None = None, pretrain_overrides: dict | None = None) -> list[Run]:
    """The runs of ``preset`` (see ``PRESETS``), pre-training runs first.

    ``select`` narrows the preset (keys ``SELECT_KEYS``: ``tasks``, ``counts``, ``seeds``, ``lrs``, ``methods``;
    ``only``, run-name patterns; ``mt_weights``, Mean Teacher consistency weights to search, each run once per weight,
    named ``..._cw0.1``; ``pretrain_per_seed`` true: one pre-training per seed, and the runs of split seed s start from
    the pre-training of seed s, named ``..._ps<s>``, so that a row's seeds spread over pre-trainings as well as
    labelled subsets). ``overrides`` / ``pretrain_overrides``: extra bundle overrides for every fine-tune and Mean
    Teacher run / every pre-training. They need a ``tag``, appended to the names of the runs they change and to the
    method labels (``Baseline [tag]``), so that they neither collide with nor mix into the preset's own runs; a
    tagged grid reuses the untagged pre-trainings unless ``pretrain_overrides``."""
    if preset not in PRESETS:
        raise ExperimentError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
    p, sel = PRESETS[preset], _read_select(select)
    proto, tag_meta = _tagged(p.protocol, tag, overrides, pretrain_overrides)
    rows, ablated = _rows(preset, sel.get("methods"))
    tasks, counts = _as_tuple(sel.get("tasks"), str) or p.tasks, _as_tuple(sel.get("counts"), int) or p.counts
    seeds, lrs = _as_tuple(sel.get("seeds"), int) or p.seeds, _as_tuple(sel.get("lrs"), float) or proto.lrs
    weights = _as_tuple(sel.get("mt_weights"), float) or ()
    if any(not math.isfinite(w) or w < 0 for w in weights):
        raise ExperimentError(f"mt_weights must be consistency weights >= 0, got {sel.get('mt_weights')!r}")
    per_seed = sel.get("pretrain_per_seed", False)
    if not isinstance(per_seed, bool):
        raise ExperimentError(f"pretrain_per_seed must be true or false, got {per_seed!r}")
    if per_seed and "seed" in (pretrain_overrides or {}):
        raise ExperimentError("pretrain_per_seed sets each pre-training's seed; leave \"seed\" out of pretrain_overrides")
    work = Path(work_dir).resolve()
    dataset_dir = str(Path(dataset_dir).resolve()) if dataset_dir not in (None, "None") else "None"
    pre: dict[tuple, Run] = {}  # (variant, ablation tag, pre-training seed or None) -> its run

    def init_run(variant, extra=None, ablation_tag="", seed=None, left_out=None):
        """The pre-training a cell of split seed ``seed`` starts from (None: random init)."""
        if variant is None:
            return None
        seed = seed if per_seed else None
        key = (variant, ablation_tag, seed)
        if key not in pre:
            pre[key] = pretrain_run(variant, dataset_dir, work, proto, extra, ablation_tag, seed, left_out)
        return pre[key]

    def cells(kind, label, variant, meta, cell_weights=(None,), extra=None, ablation_tag="", left_out=None):
        return [segmentation_run(kind, label, init_run(variant, extra, ablation_tag, s, left_out), t, n, s, lr,
                                 dataset_dir, work, proto, meta, consistency_weight=w)
                for t in tasks for n in counts for s in seeds for lr in lrs for w in cell_weights]

    label = (lambda m: f"{m} [{tag}]") if tag else (lambda m: m)
    runs = []
    for method in rows:
        variant, kind = METHODS[method]
        runs += cells(kind, label(method), variant, tag_meta, weights if kind == "meanteacher" and weights else (None,))
    for method in ablated if p.leave_one_out else ():
        runs += cells("finetune", label(method), METHODS[method][0], tag_meta)  # every option on: the reference
        for group, extra in left_out_points():
            runs += cells("finetune", f"{method} [{tag + ', ' if tag else ''}without {group}]", METHODS[method][0],
                          {"left_out": group, **tag_meta}, extra=extra, ablation_tag=f"_without_{group}",
                          left_out=group)
    for method in ablated if p.ablation else ():
        variant = METHODS[method][0]
        for key, value in _ablation_points(variant):
            runs += cells("finetune", label(method), variant, {"ablation": key, "ablation_value": value, **tag_meta},
                          extra={key: value}, ablation_tag=f"_{key}{value:g}")
    grid = list(pre.values()) + runs
    for r in grid:  # into result.json and the CSV: the report refuses one run name from two presets
        r.meta.setdefault("preset", preset)
    return narrow_runs(grid, sel.get("only"))
