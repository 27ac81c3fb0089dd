"""A bundle's options: their checks before anything is built, and their list with defaults and meanings.

Every bundle config's ``initialize`` list starts with ``@check_options`` (:func:`check_options`): it reads the merged
config (the config files and the command line's ``--key value`` pairs) and stops with one ``ValueError`` that names
each bad key, what it expects and what it got:

- a key that no config of the bundle knows (``--epoch 1``) names the closest known key (``--epochs``);
- a boolean key must be a bool (``--amp False``; ``monai.bundle run`` hands a lowercase ``false`` over as a
  string), an integer key an integer, a number key a number; the ranges of :data:`OPTIONS` hold;
- ``--help True`` (also what ``--help`` alone becomes) prints the options and exits 0 without running anything.

``python -m bim.options CONFIG [CONFIG ...]`` prints the same list: each option, its default in those configs and
its meaning.
"""

from __future__ import annotations

import difflib
import inspect
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from .flags import require_flags


@dataclass(frozen=True)
class Option:
    """``kind``: ``"bool"``, ``"int"``, ``"counts"`` (an integer or a list of them), ``"number"`` or ``""`` (any
    value); ``low`` / ``high`` bounds (``low_open``: strictly above ``low``); ``choices``: the words it takes (besides
    a number of ``kind``, when it has one). Values with their own check where they are used (``task``:
    :func:`bim.tasks.get_task`, ``method``: the semi-supervised step) have no kind here."""

    meaning: str
    kind: str = ""
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    choices: tuple[str, ...] = ()


def _positive(meaning: str) -> Option:
    return Option(meaning, "number", 0, low_open=True)


def _count(meaning: str, low: int = 1) -> Option:
    return Option(meaning, "int", low)


def _fraction(meaning: str) -> Option:
    return Option(meaning, "number", 0, 1)


def _weight(meaning: str) -> Option:
    return Option(meaning, "number", 0)


# what may run the network in CPU inference (bim.inference.SliceBatchInferer's cpu_backend)
CPU_BACKENDS = ("torch", "onnxruntime", "auto")

OPTIONS: dict[str, Option] = {
    # where
    "dataset_dir": Option("prepared data set (python -m data_prep ...); null: the synthetic demo set"),
    "output_dir": Option("where model.pt, checkpoints, tensorboard/ and eval/ (inference: the predictions) go"),
    "pretrained": Option("a pretrain_bim model.pt (or bundle checkpoint) to start from; null: random initialisation"),
    "checkpoint": Option("the weights evaluate.json scores (default: output_dir's model.pt)"),
    "ckpt_path": Option("the weights inference.json uses"),
    "resume_from": Option("auto: continue output_dir/checkpoint_last.pt when it exists; a checkpoint path; null: start afresh"),
    "allow_unfinished": Option("evaluate a model.pt whose training did not finish (no checkpoint_final.pt)", "bool"),
    "device": Option("torch device (default: cuda when available)"),
    "data_store": Option("where the training slices live: auto (device when they fit data_memory_budget_gb, else "
                         "host memory, streamed), device or host", choices=("auto", "device", "host")),
    "data_memory_budget_gb": Option("device memory the slices may take, GB; auto: half the free GPU memory", "number",
                                    0, low_open=True, choices=("auto",)),
    "compile_mode": Option("torch.compile's mode (null: its default)"),
    "edge": Option("edge map of the boundary loss: sobel or gradient_power"),
    # run length and schedule
    "epochs": _count("epochs (x iters_per_epoch = iterations)"),
    "iters_per_epoch": _count("iterations per epoch (slices drawn with replacement)"),
    "warmup_epochs": _count("epochs of linear LR warm-up before the cosine decay", 0),
    "warmup_start_ratio": Option("warm-up starts at learning_rate x this ratio", "number", 0, 1, low_open=True),
    "learning_rate": _positive("peak learning rate"),
    "discriminator_lr": _positive("learning rate of the adversarial method's discriminator"),
    "weight_decay": _weight("optimiser weight decay"),
    "batch_size": _count("images per iteration"),
    "unlabelled_batch_size": _count("unlabelled slices per iteration", 0),
    "scans_per_batch": _count("scans per pre-training batch (one slice of each partition of each)"),
    "seed": _count("seed of sampling, augmentation and initialisation", 0),
    "split_seed": _count("which labelled subset: labelled_seed{split_seed}_{labelled_scans}", 0),
    "labelled_scans": _count("labelled scans to train from"),
    "task": Option("segmentation task: lv, rv, myo, acdc or prostate"),
    "method": Option("semi-supervised method (checked with the variant config that builds it)"),
    "crop_size": _count("training crop side in pixels (the U-Net needs at least 16)", 16),
    "val_interval": _count("validate every N epochs (and after the last)"),
    "early_stop_patience": _count("stop after this many validations in a row without a better val_mean_dice (model.pt keeps the best); null: train all epochs (finetune_seg: 5 by default when pretrained is set)"),
    "record_early_stop": Option("train all epochs, and record where early stopping with this patience (or each of a list, such as [5, 10]) would have stopped: model_patience{N}.pt (its best weights) and early_stop_record.json; null: off", "counts", 1),
    "log_every": _count("log the loss every N iterations"),
    "save_every": _count("write checkpoint_last.pt every N iterations"),
    "panel_every": _count("write a cluster panel every N iterations"),
    "panel_scans": _count("scans shown in the evaluation's prediction panel"),
    "rampup_epochs": _count("epochs of the sigmoid ramp-up of the unsupervised weight", 0),
    # augmentation
    "flip_prob": _fraction("probability of each of the horizontal and vertical flips"),
    "brightness": _weight("brightness jitter amplitude"),
    "contrast": _weight("contrast jitter amplitude"),
    "max_rotation_deg": _weight("random rotation range, +-degrees (default: the task's)"),
    "scale_range": Option("random zoom range [low, high] (default: the task's)"),
    "gamma_range": Option("random gamma range [low, high]; null: off (default: the task's)"),
    "view_flip_prob": _fraction("flip probability of the semi-supervised views"),
    "view_rotation_deg": _weight("rotation range of the semi-supervised views"),
    "view_scale_range": Option("zoom range of the semi-supervised views"),
    # semi-supervised weights
    "consistency_weight": _weight("weight of the Mean Teacher / UA-MT consistency"),
    "ict_weight": _weight("weight of ICT's consistency"),
    "entropy_weight": _weight("weight of entropy minimisation"),
    "mixup_weight": _weight("weight of the MixUp loss"),
    "adversarial_weight": _weight("weight of the adversarial loss"),
    "ema_decay": _fraction("EMA decay of the teacher"),
    "ict_alpha": _positive("Beta(alpha, alpha) of ICT's mixing"),
    "mixup_alpha": _positive("Beta(alpha, alpha) of MixUp's mixing"),
    "uncertainty_passes": _count("UA-MT's stochastic teacher passes"),
    "uncertainty_noise": _weight("UA-MT's input noise"),
    # pre-training
    "num_clusters": Option("K, clusters of the dense head", "int", 2),
    "num_subheads": _count("sub-heads averaged in L_MI"),
    "dense_level": _count("decoder level of the dense head", 0),
    "alpha": _fraction("alpha of the pseudo-diagonal joint (0: IIC)"),
    "lambda_cc": _weight("weight of the boundary cross-correlation loss"),
    "temperature": _positive("temperature of the contrastive loss"),
    "edge_power": _positive("power of the gradient edge map"),
    "cc_window": _count("window of the local cross-correlation"),
    # network and run
    "features": Option("U-Net widths, 6 numbers (must match the weights loaded); auto (finetune_seg, meanteacher_seg): "
                       "those of the weights the run starts from, else [32, 64, 128, 256, 512, 32]"),
    "unet_style": Option("U-Net style: monai (MONAI BasicUNet) or authors (the authors' code's decoder: nearest upsampling "
                         "+ conv, ReLU, no bias); auto (finetune_seg, meanteacher_seg): the style of the weights the run "
                         "starts from (pretrained; evaluate: checkpoint; inference: ckpt_path), else monai",
                         choices=("auto", "monai", "authors")),
    "bn_momentum": Option("BatchNorm momentum; null: the U-Net style's (monai 0.1, authors 0.01; runs of a few hundred "
                          "iterations need 0.1 for usable running statistics)"),
    "amp": Option("bf16 autocast on CUDA", "bool"),
    "cpu_bf16": Option("inference on a CPU with native bf16 (AVX512-BF16 or AMX): bf16 autocast, channels-last", "bool"),
    "cpu_backend": Option("what runs the network in CPU inference: torch, onnxruntime (fp32, needs onnx and "
                          "onnxruntime) or auto (onnxruntime where torch would run fp32 and it is installed)",
                          choices=CPU_BACKENDS),
    "compile": Option("torch.compile the training step (default: on CUDA)", "bool"),
    "compile_teacher": Option("torch.compile the teacher too", "bool"),
    "compile_step": Option("torch.compile a Mean Teacher step's views, forwards and losses as one function", "bool"),
    "compile_optimizer": Option("torch.compile the optimiser's step (default: as compile)", "bool"),
    "channels_last": Option("channels-last memory format", "bool"),
    "cudnn_deterministic": Option("deterministic cuDNN algorithms (false: autotune)", "bool"),
    "progress_bar": Option("tqdm progress bar on a terminal", "bool"),
    "cluster_quality": Option("score the clusters against labelled scans at the end", "bool"),
}

# keys of a config that are its machinery, not options
_MACHINERY = {"imports", "initialize", "run", "finalize", "bundle_root", "check_options", "determinism"}
_EXPRESSION = ("$", "@", "%")


def _is_expression(value) -> bool:
    return isinstance(value, str) and value.startswith(_EXPRESSION)


def bundle_configs(configs_dir: str | Path) -> list[Path]:
    """The config files of a bundle's ``configs`` folder (variants included, metadata.json not)."""
    return sorted(p for p in Path(configs_dir).rglob("*.json") if p.name != "metadata.json")


def known_defaults(configs_dir: str | Path) -> dict:
    """Every top-level key of the bundle's configs -> its first literal default (None when it is only an
    expression or a component)."""
    out: dict = {}
    for path in bundle_configs(configs_dir):
        for key, value in json.loads(path.read_text()).items():
            top = key.split("#")[0]
            literal = None if isinstance(value, dict) or _is_expression(value) or "#" in key else value
            if out.get(top) is None:
                out[top] = literal
    return out


def _kind(key: str, default) -> str:
    option = OPTIONS.get(key)
    if option is not None and option.kind:
        return option.kind
    if isinstance(default, bool):
        return "bool"
    if isinstance(default, int):
        return "int"
    if isinstance(default, float):
        return "number"
    return ""


def check_value(key: str, value, default=None, kind: str | None = None) -> str | None:
    """What is wrong with ``value`` for ``key`` (its rule in :data:`OPTIONS`, or the type of its ``default``), or
    None; ``kind`` in place of the option's (one element of a ``"counts"`` list is checked as ``"int"``). Expressions
    (``$...``, ``@...``) are not checked."""
    if _is_expression(value) or value is None and default is None:
        return None
    kind, option = kind or _kind(key, default), OPTIONS.get(key)
    if kind == "bool":
        try:
            require_flags({key: value})
        except ValueError as e:
            return str(e)
        return None
    shown = f" (default {default!r})" if default is not None else ""
    choices = option.choices if option is not None else ()
    if value in choices:
        return None
    if choices and not kind:
        return f"{key} must be one of {', '.join(repr(c) for c in choices)}{shown}, got {value!r}"
    words = " or ".join(repr(c) for c in choices)
    if kind == "counts":  # an integer or a list of them, each >= low
        values = list(value) if isinstance(value, (list, tuple)) and value else [value]  # fire reads 3,5 as a tuple
        if any(check_value(key, v, default, "int") for v in values):
            return f"{key} must be an integer >= {option.low:g} or a list of them (such as [5, 10]){shown}, got {value!r}"
        return None
    if kind in ("int", "number"):
        ok = isinstance(value, int) if kind == "int" else isinstance(value, (int, float))
        if isinstance(value, bool) or not ok or value != value or value in (float("inf"), float("-inf")):
            what = "an integer" if kind == "int" else "a number"
            return f"{key} must be {words + ' or ' if words else ''}{what}{shown}, got {value!r}"
        if option is not None and option.low is not None:
            if value < option.low or option.low_open and value == option.low:
                return f"{key} must be {'>' if option.low_open else '>='} {option.low}{shown}, got {value!r}"
        if option is not None and option.high is not None and value > option.high:
            return f"{key} must be <= {option.high}{shown}, got {value!r}"
    return None


def record_patiences(patience) -> tuple[int, ...]:
    """``record_early_stop`` as the patiences it records, ascending: None gives none, a number one, a list each of
    its numbers once; anything else (a number below 1, a bool, an empty list) is a ``ValueError``."""
    if patience is None:
        return ()
    values = list(patience) if isinstance(patience, (list, tuple)) else [patience]
    if not values or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values):
        raise ValueError("record_early_stop must be a number of validations >= 1, a list of them (such as [5, 10]) "
                         f"or null, got {patience!r}")
    return tuple(sorted(set(values)))


def config_problems(config: dict, defaults: dict) -> list[str]:
    """The problems of a merged config's top-level values: unknown keys (with the closest known key) and values
    that fail :func:`check_value`."""
    problems = []
    known = sorted(defaults)
    for key, value in config.items():
        if key.startswith("_"):
            continue
        if key not in defaults:
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            hint = f"did you mean --{close[0]}? " if close else ""
            problems.append(f"--{key} is not an option of this bundle ({hint}--help True lists them)")
            continue
        problem = check_value(key, value, defaults[key])
        if problem:
            problems.append(problem)
    return problems


def describe(config: dict) -> str:
    """The options of a merged config, one a line: key, value in the config, meaning."""
    rows = []
    for key, value in config.items():
        if key.startswith("_") or key in _MACHINERY or key == "help" or "#" in key or isinstance(value, dict):
            continue
        if isinstance(value, list) and any(isinstance(v, dict) or _is_expression(v) for v in value):
            continue
        option = OPTIONS.get(key)
        if option is None and _is_expression(value):
            continue  # derived from other keys
        rows.append((key, json.dumps(value), option.meaning if option else ""))
    width = max(len(r[0]) for r in rows) + 2
    dwidth = min(40, max(len(r[1]) for r in rows))
    lines = [f"--{k:<{width}}{d:<{dwidth}}  {m}".rstrip() for k, d, m in rows]
    return "options (--key value on the command line; booleans as True / False):\n" + "\n".join(lines)


def _on_stack(cls):
    """The nearest ``self`` of type ``cls`` on the call stack (the MONAI object resolving this component), or None."""
    frame = inspect.currentframe()
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, cls):
            return candidate
        frame = frame.f_back
    return None


def check_options() -> bool:
    """The first step of a bundle's ``initialize``: check the merged config of the MONAI ``ConfigWorkflow`` that runs
    it against the bundle's configs (see the module's docstring). ``help`` prints the options and exits 0."""
    from monai.bundle import ConfigWorkflow

    workflow = _on_stack(ConfigWorkflow)
    if workflow is None:  # built outside a workflow (e.g. MONAI Label's own parser): nothing to compare with
        return True
    configs = Path(workflow.config_root_path)
    if not (configs / "metadata.json").is_file() and (configs.parent / "metadata.json").is_file():
        configs = configs.parent  # the first config file was a variant
    config = workflow.parser.get()
    defaults = known_defaults(configs)
    if "help" in config and "help" not in defaults:
        print(describe(config))
        raise SystemExit(0)
    problems = config_problems(config, defaults)
    if problems:
        raise ValueError("; ".join(problems))
    return True


def main(argv: list[str] | None = None) -> int:
    """``python -m bim.options CONFIG [CONFIG ...]``: the options of the merged configs."""
    from monai.bundle import ConfigParser

    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m bim.options CONFIG [CONFIG ...]  (e.g. bundles/finetune_seg/configs/train.json)")
        return 0 if argv else 2
    missing = [f for f in argv if not Path(f).is_file()]
    if missing:
        print(f"error: config file {missing[0]} does not exist", file=sys.stderr)
        return 2
    parser = ConfigParser()
    parser.read_config(argv if len(argv) > 1 else argv[0])
    print(describe(parser.get()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
