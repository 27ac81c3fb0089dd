"""Training utilities shared by the bundles: LR schedule, random state, atomic saving, resume, progress."""

from __future__ import annotations

import json
import logging
import math
import os
import types
from pathlib import Path

import torch
from ignite.engine import Engine, Events
from monai.optimizers import WarmupCosineSchedule

from .files import atomic_file
from .flags import as_flag  # noqa: F401  (re-exported; the configs check their options with bim.options)

logger = logging.getLogger("bim")


def warmup_cosine_scheduler(optimizer, epochs: int, iters_per_epoch: int, warmup_epochs: int, start_ratio: float):
    r"""The paper's schedule, stepped once per iteration (MONAI's :class:`~monai.optimizers.WarmupCosineSchedule`),
    with ``T = epochs * iters_per_epoch`` iterations, ``T_w = min(warmup_epochs * iters_per_epoch, T)`` of warm-up and
    ``r = start_ratio``:

    .. math:: lr_t = lr_{peak} \cdot \begin{cases} r + (1 - r)\, t / T_w & t < T_w \\
              \tfrac12 \big(1 + \cos(\pi\, (t - T_w) / (T - T_w))\big) & t \ge T_w \end{cases}

    a linear warm-up from ``r * lr_peak`` (the paper: lr_peak / N, N = 400 for pre-training, 200 for fine-tuning)
    to ``lr_peak``, then a cosine decay to 0 at ``T``. A ``ValueError`` names a schedule of no iterations or a
    ``start_ratio`` outside (0, 1]."""
    total, warmup = int(epochs) * int(iters_per_epoch), int(warmup_epochs) * int(iters_per_epoch)
    if total < 1:
        raise ValueError(f"the schedule needs >= 1 iteration, got epochs x iters_per_epoch = {epochs} x {iters_per_epoch}")
    if not 0 < start_ratio <= 1:
        raise ValueError(f"warmup_start_ratio must be in (0, 1], got {start_ratio}")
    return WarmupCosineSchedule(optimizer, warmup_steps=max(warmup, 0), t_total=total, warmup_multiplier=float(start_ratio))


class RandomState:
    """The random state a run depends on (the sampling/augmentation generator and torch's global RNGs),
    with ``state_dict``/``load_state_dict`` so checkpoints resume the exact random stream."""

    def __init__(self, generator: torch.Generator):
        self.generator = generator

    def state_dict(self) -> dict:
        state = {"generator": self.generator.get_state(), "torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"].cpu())
        torch.set_rng_state(state["torch"].cpu())
        if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def bf16_autocast(device: torch.device | str, enabled: bool = True):
    """bf16 autocast where it pays: on CUDA devices. On the CPU it is a no-op (bf16 convolutions without
    hardware support run ~50x slower than fp32; measured 18 s vs 0.4 s for a U-Net forward on 2 cores). For the
    iterations of their own (pre-training, semi-supervised); the fine-tuning step takes MONAI's ``amp``."""
    device_type = torch.device(device).type
    return torch.autocast(device_type=device_type, dtype=torch.bfloat16, enabled=bool(enabled) and device_type == "cuda")


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 convolutions in hardware (AVX512-BF16 or AMX, through oneDNN)."""
    return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def inference_autocast(device: torch.device | str, enabled: bool = True, cpu_bf16: bool = False):
    """bf16 autocast for inference: on CUDA when ``enabled``; on the CPU when also ``cpu_bf16`` and the CPU has
    native bf16 (:func:`cpu_has_native_bf16`), where a U-Net forward runs about 3x faster than in fp32."""
    device_type = torch.device(device).type
    on = bool(enabled) and (device_type == "cuda" or (device_type == "cpu" and bool(cpu_bf16) and cpu_has_native_bf16()))
    return torch.autocast(device_type=device_type, dtype=torch.bfloat16, enabled=on)


def unwrap(network: torch.nn.Module) -> torch.nn.Module:
    """The module inside ``network``'s wrappers: ``DistributedDataParallel``'s ``module`` and ``torch.compile``'s
    ``_orig_mod`` (either order: a compiled module passes ``module`` on to what it wraps), and an
    :class:`~torch.optim.swa_utils.AveragedModel`'s ``module``; ``network`` itself when it has none."""
    network = getattr(network, "module", network)  # DistributedDataParallel, AveragedModel
    return getattr(network, "_orig_mod", network)  # torch.compile


def ensure_train_mode(network: torch.nn.Module) -> None:
    """``network.train()`` where ``network`` or the module inside its wrappers is in eval mode (after a validation, a
    panel): ``train()`` walks every module and sets each flag through ``nn.Module.__setattr__``, host time that a
    training step would otherwise spend at every iteration (~0.4 ms for the U-Net's 140 modules on one CPU core)."""
    if not (network.training and unwrap(network).training):
        network.train()


def uncompiled(network: torch.nn.Module) -> torch.nn.Module:
    """``network`` without ``torch.compile``'s wrapper (``_orig_mod``), any other wrapper kept (DistributedDataParallel's
    gradient hooks must run): what a function compiled as a whole calls."""
    return getattr(network, "_orig_mod", network)


def make_generator(seed: int) -> torch.Generator:
    """A CPU generator for sampling and augmentation parameters (identical streams on every device)."""
    return torch.Generator().manual_seed(int(seed))


def atomic_save(obj, path: str | os.PathLike) -> Path:
    """``torch.save`` through :func:`atomic_file`: never a half-written file, mode 0644. Kept rather than Ignite's
    ``DiskSaver(atomic=True)``, whose temporary files (``tmpXXXX``) a killed save leaves are never removed."""
    with atomic_file(path) as tmp:
        torch.save(obj, tmp)
    return Path(path)


def load_weights(path: str | os.PathLike, what: str, hint: str, map_location="cpu"):
    """``torch.load(path, weights_only=True)``; a file it cannot read is a ``ValueError`` naming ``what`` (the option
    or role of the file, e.g. ``--pretrained``) and ``path``, saying it is not a valid weights file and what to do
    (``hint``). torch's own advice to retry with ``weights_only=False`` (which would execute the file's code) is not
    passed on."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # noqa: BLE001 - zip, pickle and EOF errors come in many types
        reason = str(e).strip().splitlines()[-1] if str(e).strip() else ""
        reason = f": {reason}" if reason and "weights_only" not in str(e) else ""
        raise ValueError(f"{what} {path}: not a valid weights file ({type(e).__name__}{reason}); it is truncated, "
                         f"corrupt or not a PyTorch weights file: {hint}") from None


def _is_main_process() -> bool:
    return not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0


def settings_fingerprint(**settings) -> str:
    """The settings that shape a training run (data, task, network, schedule, augmentation, seeds) as canonical JSON
    text (keys sorted; ``str`` for other objects): :class:`CheckpointEveryN` stores it in each checkpoint and
    :class:`ResumeFromCheckpoint` resumes only a checkpoint of the same settings, naming those that differ."""
    return json.dumps(settings, sort_keys=True, default=str)


def changed_settings(stored, current: str) -> str:
    """``key: stored -> current`` for each setting that differs between two :func:`settings_fingerprint` texts
    (a checkpoint without a readable one: ``unrecorded settings``)."""
    try:
        old, new = json.loads(stored), json.loads(current)
    except (TypeError, ValueError):
        return "unrecorded settings"
    if not isinstance(old, dict):
        return "unrecorded settings"
    keys = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    return ", ".join(f"{k}: {json.dumps(old.get(k))} -> {json.dumps(new.get(k))}" for k in keys)


class CheckpointEveryN:
    """Saves the engine (as ``trainer``) and ``save_dict`` (objects with ``state_dict``) atomically to ``save_dir/checkpoint_last.pt`` every
    ``interval`` iterations (the previous one is replaced), and to ``checkpoint_final.pt`` at the end; with
    ``fingerprint`` (:func:`settings_fingerprint`) each checkpoint records it under ``"fingerprint"``.

    Kept rather than MONAI's ``CheckpointSaver(save_interval=..., save_final=True)``: that names interval checkpoints
    by step and deletes the previous one before writing the next, not atomically (``DiskSaver(atomic=False)``), and
    also writes the final checkpoint when an error (a NaN loss) stops training, marking a failed run finished."""

    def __init__(self, save_dir: str, save_dict: dict, interval: int = 200, final: bool = True,
                 fingerprint: str | None = None):
        if interval < 1:
            raise ValueError(f"checkpoint interval must be >= 1, got {interval}")
        self.save_dir, self.save_dict, self.interval, self.final = Path(save_dir), save_dict, interval, final
        self.fingerprint = fingerprint

    def attach(self, engine: Engine) -> None:
        self.save_dict = {"trainer": engine, **self.save_dict}
        engine.add_event_handler(Events.ITERATION_COMPLETED(every=self.interval), self.save, "checkpoint_last.pt")
        if self.final:
            engine.add_event_handler(Events.COMPLETED, self.save, "checkpoint_final.pt")

    def save(self, engine: Engine, name: str) -> None:
        if not _is_main_process():
            return
        state = {k: v.state_dict() for k, v in self.save_dict.items()}
        if self.fingerprint is not None:
            state["fingerprint"] = self.fingerprint
        atomic_save(state, self.save_dir / name)


class NonFiniteLossError(FloatingPointError):
    """Training stopped on a NaN or infinite loss (see :class:`StopOnNonFiniteLoss`)."""


def first_on_any_rank(first: int, device=None) -> int:
    """The smallest non-negative ``first`` of all ranks (-1 when every rank has -1), so that all ranks of a
    multi-GPU run stop at the same check (one that stopped alone would leave the others waiting in DDP)."""
    never = torch.iinfo(torch.long).max
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.distributed.get_backend() == "nccl" else "cpu"
    t = torch.tensor(first if first >= 0 else never, dtype=torch.long, device=device)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN)
    return int(t) if int(t) != never else -1


class EarlyStoppingOnValidation:
    """A train handler that connects ``handler`` (MONAI's ``EarlyStopHandler``, its ``patience`` counted in
    validations) to ``validator`` and to the trainer it is attached to; a ``patience`` of None leaves it off. Built
    here rather than among the evaluator's handlers: the evaluator exists before the trainer that runs it (the config
    cannot name the trainer there without a cycle), and an evaluator run on its own must not need a trainer.
    ``recorder`` (:class:`~bim.inference.EarlyStopRecord`, optional) is attached to the trainer too: it records
    where early stopping would end the run without ending it."""

    def __init__(self, handler, validator, recorder=None) -> None:
        self.handler, self.validator, self.recorder = handler, validator, recorder

    def attach(self, engine: Engine) -> None:
        if self.recorder is not None:
            self.recorder.attach(engine)
        if self.handler.patience is None:
            return
        self.handler.set_trainer(engine)
        self.handler.attach(self.validator)


class StopOnNonFiniteLoss:
    """Stops training with a :class:`NonFiniteLossError` when the loss (``engine.state.output["loss"]``) is NaN or
    infinite, naming the first such iteration and what to check. The test stays on the device (no synchronisation
    per step): the first bad iteration is recorded there and read every ``gcd(every, save_every)`` iterations and
    at the end. Attached before :class:`CheckpointEveryN` (of interval ``save_every``), it stops the run before a
    checkpoint of a run gone non-finite is written. In a multi-GPU run every rank stops at the same check, naming
    the first bad iteration of any rank."""

    def __init__(self, every: int = 20, save_every: int | None = None) -> None:
        if int(every) < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.every = math.gcd(int(every), int(save_every)) if save_every else int(every)
        self.first = None

    def attach(self, engine: Engine) -> None:
        engine.add_event_handler(Events.ITERATION_COMPLETED, self.record)
        engine.add_event_handler(Events.ITERATION_COMPLETED(every=self.every), self.check)
        engine.add_event_handler(Events.COMPLETED, self.check)

    def record(self, engine: Engine) -> None:
        loss = engine.state.output["loss"] if isinstance(engine.state.output, dict) else engine.state.output
        loss = torch.as_tensor(loss).detach()
        if self.first is None:
            self.first = torch.full((), -1, dtype=torch.long, device=loss.device)
        bad = ~torch.isfinite(loss).all() & (self.first < 0)
        self.first = torch.where(bad, torch.full_like(self.first, engine.state.iteration), self.first)

    def check(self, engine: Engine) -> None:
        first = -1 if self.first is None else int(self.first)
        if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            first = first_on_any_rank(first, self.first.device if self.first is not None else None)
        if first >= 0:
            raise NonFiniteLossError(
                f"the training loss is NaN or infinite from iteration {first} on (checked at iteration "
                f"{engine.state.iteration}); training stopped. Check the learning_rate (too high?), the data "
                f"(NaN or extreme intensities in a scan) and any loss_function override; checkpoints written before "
                f"iteration {first} are kept"
            )


CUDA_GRAPH_COMPILE_MODES = ("reduce-overhead", "max-autotune")
"""The ``torch.compile`` modes that run the compiled graphs as CUDA graphs."""


def cudagraph_skips() -> int:
    """How many compiled graphs of this process ``torch.compile`` has run without the CUDA graphs its mode asked for
    (Inductor's ``cudagraph_skips`` counter)."""
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["cudagraph_skips"])


class CudaGraphsCheck:
    """Warns once when a training whose ``compile_mode`` asks for CUDA graphs on a CUDA ``device`` runs compiled graphs
    without them (``torch.compile`` falls back to plain launches, e.g. for a CPU tensor or an input mutated in place,
    and only says so where ``TORCH_LOGS=cudagraphs`` is set): checked ``after`` iterations, when the step's graphs are
    compiled. The run goes on; it is slower than the mode promises."""

    def __init__(self, compile_mode: str | None, device, compiled: bool = True, after: int = 3) -> None:
        self.enabled = bool(compiled) and compile_mode in CUDA_GRAPH_COMPILE_MODES and torch.device(device).type == "cuda"
        self.compile_mode, self.after, self.before = compile_mode, int(after), 0

    def attach(self, engine: Engine) -> None:
        if self.enabled:
            engine.add_event_handler(Events.STARTED, self._count_before)
            engine.add_event_handler(Events.ITERATION_COMPLETED(once=self.after), self.check)

    def _count_before(self, _engine: Engine) -> None:
        self.before = cudagraph_skips()

    def check(self, engine: Engine) -> int:
        skipped = cudagraph_skips() - self.before
        if skipped > 0:
            logger.warning(
                f"compile_mode {self.compile_mode!r} asks for CUDA graphs, but {skipped} compiled graph(s) of this "
                f"training run without them (as of iteration {engine.state.iteration}): each step launches its kernels "
                f"one by one. Run with the environment variable TORCH_LOGS=cudagraphs to see why")
        return skipped


def compile_optimizer_step(optimizer: torch.optim.Optimizer, enabled=True) -> torch.optim.Optimizer:
    """``optimizer`` itself, its ``step`` run through ``torch.compile`` (default mode) when ``enabled``: the foreach
    updates of every parameter fused into a few kernels, with no per-parameter arithmetic on the host (RAdam has no
    ``fused`` implementation in torch). Same arithmetic as the eager step up to float rounding. Each group's learning
    rate is held as a 0-dim tensor (also after ``load_state_dict``), which an LR scheduler updates in place, so the
    LR may change every iteration without a recompilation: torch's recipe for a compiled optimizer under a scheduler
    (with a Python float, some torch versions make the LR a constant of the graph and recompile at every change, up
    to the recompile limit, after which the step runs eagerly). Works before or after an LR scheduler wraps the
    step (the scheduler's record of the call is kept); CUDA graphs are not used for it (the step updates its inputs
    in place, which CUDA graphs refuse)."""
    if not as_flag(enabled, "compile_optimizer"):
        return optimizer
    step = optimizer.step
    if getattr(step, "_compiled_optimizer_step", False):
        return optimizer
    _lr_as_tensor(optimizer)
    optimizer.register_load_state_dict_post_hook(_lr_as_tensor)
    if isinstance(step, types.MethodType):  # no scheduler yet: keep a bound method, which a scheduler can wrap
        compiled = types.MethodType(torch.compile(step.__func__), optimizer)
    else:  # a scheduler's wrapper: compiled as is (functools.wraps keeps its marker, so the scheduler still sees it)
        compiled = torch.compile(step)
    try:
        compiled._compiled_optimizer_step = True
    except AttributeError:  # a bound method takes no attributes: mark its function
        compiled.__func__._compiled_optimizer_step = True
    optimizer.step = compiled
    return optimizer


def _lr_as_tensor(optimizer: torch.optim.Optimizer) -> None:
    """Every param group's ``lr`` as a 0-dim float32 tensor on the CPU (a tensor already stays as it is)."""
    for group in optimizer.param_groups:
        if not isinstance(group["lr"], torch.Tensor):
            group["lr"] = torch.tensor(float(group["lr"]))


class ResumeFromCheckpoint:
    """Resumes a run from ``path`` (a ``checkpoint_*.pt`` written by :class:`CheckpointEveryN`; ``None`` does
    nothing). Loads with ``weights_only=True`` through MONAI's :class:`CheckpointLoader` (trainer iteration/epoch,
    network, optimiser, LR scheduler, random state); the engine it is attached to is restored as ``trainer``.

    ``"auto"`` resumes ``save_dir/checkpoint_last.pt`` only when it is an interrupted run of the same settings: with
    ``fingerprint`` (:func:`settings_fingerprint`) a checkpoint of other settings is not resumed, and a checkpoint
    whose run had finished (its iteration reached ``max_epochs * epoch_length``) is not either; either way training
    starts again from the beginning, and the log says why."""

    def __init__(self, path: str | None, load_dict: dict, save_dir: str | None = None, map_location=None,
                 fingerprint: str | None = None):
        self.path, self.load_dict, self.save_dir, self.map_location = path, load_dict, save_dir, map_location
        self.fingerprint = fingerprint

    def resolve(self) -> Path | None:
        if self.path in (None, "", "None", "null", False):
            return None
        if self.path == "auto":
            candidate = Path(self.save_dir or ".") / "checkpoint_last.pt"
            return candidate if candidate.is_file() else None
        path = Path(self.path)
        if not path.is_file():
            raise FileNotFoundError(f"resume_from: checkpoint {path} does not exist")
        return path

    def resumable(self, path: Path, engine: Engine) -> bool:
        """Whether the ``"auto"`` checkpoint ``path`` is an interrupted run of this run's settings."""
        checkpoint = load_weights(path, "checkpoint", "delete it to start afresh, or choose another output_dir (or "
                                  "pass --resume_from None)")
        if self.fingerprint is not None and checkpoint.get("fingerprint") != self.fingerprint:
            changed = changed_settings(checkpoint.get("fingerprint"), self.fingerprint)
            logger.warning(f"{path} is of a run with other settings ({changed}): not resuming it, training from the "
                           f"start with this run's settings "
                           f"(--resume_from {path} resumes it anyway; another output_dir keeps both runs)")
            return False
        done = int(checkpoint.get("trainer", {}).get("iteration", 0))
        total = int(engine.state.max_epochs or 0) * int(engine.state.epoch_length or 0)
        if total and done >= total:
            logger.info(f"{path} is of a finished run ({done} of {total} iterations): training again from the start")
            return False
        return True

    def attach(self, engine: Engine) -> None:
        path = self.resolve()
        if path is None or (self.path == "auto" and not self.resumable(path, engine)):
            return
        from monai.handlers import CheckpointLoader

        if self.path != "auto":  # "auto" was read by resumable()
            load_weights(path, "--resume_from", "pass the checkpoint_last.pt of a run, or --resume_from None to start "
                         "afresh")
        logger.info(f"resuming from {path}")
        load_dict = {"trainer": engine, **self.load_dict}
        CheckpointLoader(str(path), load_dict, map_location=self.map_location).attach(engine)


class IterationProgressBar:
    """A tqdm progress bar over iterations (Ignite's :class:`ProgressBar`) that stays quiet when stdout is not
    a terminal and never synchronises the GPU (it shows no loss)."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled

    def attach(self, engine: Engine) -> None:
        import sys

        if not self.enabled or not sys.stderr.isatty() or not _is_main_process():
            return
        from ignite.handlers import ProgressBar

        ProgressBar(persist=False).attach(engine)


def handlers_for_rank(handlers: list, rank0_only, rank: int | None = None) -> list:
    """``handlers`` for this process of a multi-GPU run: all on rank 0; on the other ranks all but those whose class
    is named in ``rank0_only`` (logging, panels, checkpoint files: work one process does for all). A handler added
    later runs on every rank unless named here, and a name that matches no handler is a ``ValueError`` (a renamed
    class cannot slip back onto every rank). ``rank``: ``torch.distributed``'s rank when None."""
    names = {type(h).__name__ for h in handlers}
    unknown = sorted(set(rank0_only) - names)
    if unknown:
        raise ValueError(f"rank0_only names {unknown}, which are not among the handlers {sorted(names)}")
    if rank is None:
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    return list(handlers) if rank == 0 else [h for h in handlers if type(h).__name__ not in set(rank0_only)]
