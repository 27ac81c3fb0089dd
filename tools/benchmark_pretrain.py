"""Throughput of the pre-training step, measured on the bundle's own trainer.

    python tools/benchmark_pretrain.py [--dataset_dir DIR] [--iterations 50] [--warmup 10] [--compile False]
        [--channels_last True|False] [--decoder_pad if_needed|always] [--cudnn_deterministic True|False] [--compile_optimizer True|False]
        [--profile PATH --profile_steps 10] [--scaling 1,2,4 --run_timeout_s 600] [--num_subheads 3] [--variant NAME]

Builds the pretrain_bim trainer from ``bundles/pretrain_bim/configs/train.json`` (data held on the device, GPU
augmentation, all three losses, bf16 autocast with the MI/CC losses in fp32; ``--variant NAME`` adds
``configs/variants/NAME.json``, a Table 1 row, so the step computes only that row's losses: ``ours_mi_cc`` leaves out
L_con, ``ours_mi`` also L_CC, ``contrast_enc`` keeps only L_con and runs the encoder alone) and times ``iterations`` full
steps after ``warmup`` steps; then, at the same batch (2 views x scans_per_batch x partitions images of
crop_size^2), the bare U-Net forward+backward in eager bf16 (and compiled with ``--compile_bare True``). The bare
U-Net is the one the trainer trains: its ``unet_style`` ("authors" by default: nearest-neighbour x2 then a 3x3 conv in
each decoder block) and ``features`` are read from the trainer's network, and the JSON reports them, in
``settings`` and with each bare timing (with a 2-class 1x1 convolution as its head where pre-training has the
cluster heads).
``--channels_last`` left out follows the bundle's default (channels-last on CUDA). ``--decoder_pad always`` puts
back MONAI's ``UpCat``, which pads the upsampled features even by zero pixels, to measure what
``bim.network.UpCatPadIfNeeded`` (the default) saves. ``--cudnn_deterministic False`` lets cuDNN autotune
its algorithms (the bundle's ``cudnn_deterministic`` key; left out, the bundle's default: deterministic).
Prints one JSON line: GPU, images/s (network images = both views), source slices/s, ms/step, peak memory and
``gpu_busy`` (the share of the GPU's time spent inside the timed steps, from CUDA events: :class:`StepTimer`).
``--profile PATH``: after the timed steps, ``profile_steps`` more under ``torch.profiler``; writes the operators
sorted by device time (on a GPU) and by host time to PATH and adds to the JSON the share of the profiled wall time
during which the GPU ran kernels (below 1: the step waits on the CPU, e.g. Python, launches or host syncs; the
profiler itself slows the host).

Several GPUs, the same batch on each GPU (``scans_per_batch`` x partitions slices; each rank draws from its own
share of the training scans, ``bim.distributed``)::

    torchrun --standalone --nproc_per_node 2 tools/benchmark_pretrain.py --dataset_dir DIR --compile True
    python tools/benchmark_pretrain.py --dataset_dir DIR --compile True --scaling 1,2,4

Under ``torchrun`` with N > 1 processes the trainer comes from ``train.json`` + ``multi_gpu_train.json`` (DDP) and
rank 0 prints the line; ``full_step`` adds ``gpus``, each rank's ms/step and GPU busy share,
``images_per_s_total`` (N x a step's images over the slowest rank's step time) and ``images_per_s_per_gpu``; the
bare U-Net is left out unless ``--bare True``. ``--scaling 1,2,4`` runs the same command under ``torchrun`` once per
count (one process: ``train.json`` alone, the one-GPU baseline; every process gets OMP_NUM_THREADS = CPU cores /
the largest count unless it is set), each run at most ``--run_timeout_s`` seconds (600), its output echoed to
stderr. As each count finishes, a JSON line of its own: images/s in total and per GPU, the speed-up over the first
count that finished and the scaling efficiency (speed-up x that count / count). A run that fails or runs past the
timeout is ended with all its processes, its last lines are printed, and the next count runs. At the end one JSON
line with the finished counts and ``failed`` (the others and why; exit status 1 when there are any). On a CPU the
processes use gloo (a smoke test; the figures mean nothing there).

Each process prints progress lines on stderr, with its rank: trainer built, first step done (compilation
included), warm-up done, timed steps done, results gathered; a run that hangs stops after the last of them.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import fire
import torch

from bim.files import atomic_file

ROOT = Path(__file__).resolve().parents[1]


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def progress(message: str) -> None:
    """One line on stderr, flushed, naming this process's rank (torchrun's environment): where a run that hangs
    stopped (a ``--scaling`` run shows the last lines of a count that timed out)."""
    rank, world = os.environ.get("RANK", "0"), os.environ.get("WORLD_SIZE", "1")
    sys.stderr.write(f"[benchmark rank {rank}/{world} {time.strftime('%H:%M:%S')}] {message}\n")
    sys.stderr.flush()


def _device_time_us(event) -> float:
    """An operator's own time on the device (attribute names differ between torch releases)."""
    for name in ("self_device_time_total", "self_cuda_time_total"):
        if hasattr(event, name):
            return float(getattr(event, name))
    return 0.0


def kernel_time_s(events) -> float:
    """Seconds the device spent in kernels and copies among profiler ``events`` (``key_averages()``): the device's
    own events only, as torch's table totals them. A CPU operator's device time repeats its kernels', and a user
    annotation (``## Call CompiledFxGraph``, ``Optimizer.step``) spans kernels counted already."""
    cpu = torch.autograd.DeviceType.CPU
    return sum(_device_time_us(e) for e in events
               if getattr(e, "device_type", cpu) != cpu and not getattr(e, "is_user_annotation", False)) / 1e6


def device_profiler(device):
    """A ``torch.profiler.profile`` of the host, and of ``device``'s kernels on CUDA (not started)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.device(device).type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(activities=activities)


def profile_summary(prof, wall_s: float, device, path: str, rows: int = 40) -> dict:
    """Write ``prof``'s operator tables to ``path`` (temporary file, then rename): sorted by device time (on a GPU),
    then by host time; return the share of ``wall_s`` the device spent in kernels (``gpu_busy_share``)."""
    on_gpu = device.type == "cuda"
    events = prof.key_averages()
    sorts = (["self_cuda_time_total"] if on_gpu else []) + ["self_cpu_time_total"]
    tables = [f"sorted by {key}\n" + events.table(sort_by=key, row_limit=rows) for key in sorts]
    out = Path(path)
    with atomic_file(out) as tmp:
        Path(tmp).write_text("\n".join(tables) + "\n")
    busy = kernel_time_s(events) if on_gpu else None
    return {"table": str(out), "wall_s": wall_s,
            "gpu_busy_share": round(busy / wall_s, 3) if busy is not None and wall_s > 0 else None}


def pretrain_configs(variant: str | None = None) -> list[str]:
    """``train.json``, then ``configs/variants/<variant>.json`` when ``variant`` is given (a Table 1 row: which losses
    the step computes), plus ``multi_gpu_train.json`` when ``torchrun`` started more than one process."""
    configs_dir = ROOT / "bundles" / "pretrain_bim" / "configs"
    configs = [str(configs_dir / "train.json")]
    if variant is not None:
        path = configs_dir / "variants" / f"{variant}.json"
        if not path.is_file():
            names = ", ".join(sorted(f.stem for f in (configs_dir / "variants").glob("*.json")))
            raise ValueError(f"variant: expected the name of a file in {configs_dir / 'variants'} ({names}), "
                             f"got {variant!r}")
        configs.append(str(path))
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        configs.append(str(configs_dir / "multi_gpu_train.json"))
    return configs


def build_trainer(overrides: dict, store=None, variant: str | None = None):
    """The pretrain_bim workflow (initialised) and its trainer; ``store``: a slice store that replaces the one the
    bundle would read from ``dataset_dir``; ``variant``: see :func:`pretrain_configs`."""
    from monai.bundle import ConfigWorkflow

    configs = pretrain_configs(variant)
    replaced = {} if store is None else {"train#store": store}
    wf = ConfigWorkflow(config_file=configs if len(configs) > 1 else configs[0], workflow_type="train",
                        bundle_root=str(ROOT / "bundles" / "pretrain_bim"), **overrides, **replaced)
    wf.initialize()
    return wf, wf.parser.get_parsed_content("train#trainer")


class StepTimer:
    """Wall time of iterations ``warmup + 1`` ... ``warmup + iterations`` (the device synchronised at both ends), and
    on CUDA how busy the GPU was: each step's span on the current stream (events recorded when the step starts,
    after its batch is in, and when it ends) summed, over the span from the first timed step's start to the last
    one's end. Time the GPU waits between steps (for the CPU, or for a batch copy) is what brings it below 1; gaps
    inside a step are not seen. ``prof``: a ``torch.profiler.profile`` run over the ``profile_steps`` after them."""

    def __init__(self, device, warmup: int, iterations: int, prof=None, profile_steps: int = 0):
        self.device, self.warmup, self.iterations = device, int(warmup), int(iterations)
        self.prof, self.profile_steps, self.marks, self.spans = prof, int(profile_steps), {}, []
        self.created = time.perf_counter()

    def attach(self, engine) -> None:
        from ignite.engine import Events

        engine.add_event_handler(Events.ITERATION_STARTED, self.started)
        engine.add_event_handler(Events.ITERATION_COMPLETED, self.completed)

    def _timed(self, it: int) -> bool:
        return self.device.type == "cuda" and self.warmup < it <= self.warmup + self.iterations

    def started(self, engine) -> None:
        if self._timed(engine.state.iteration):
            self.spans.append([torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)])
            self.spans[-1][0].record()

    def completed(self, engine) -> None:
        it, end = engine.state.iteration, self.warmup + self.iterations
        if self._timed(it):
            self.spans[-1][1].record()
        if it == 1:
            progress(f"step 1 done {time.perf_counter() - self.created:.1f} s after the start (compilation included)")
        if it in (self.warmup, end):
            _sync(self.device)
            self.marks["start" if it == self.warmup else "stop"] = time.perf_counter()
            progress(f"warm-up done ({it} steps), timing {self.iterations} steps" if it == self.warmup else
                     f"timed steps done: {self.seconds_per_step() * 1000:.1f} ms/step")
            if it == self.warmup and self.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(self.device)
            if it == end and self.prof is not None:
                self.prof.start()
        if self.prof is not None and it == end + self.profile_steps:
            _sync(self.device)
            self.prof.stop()
            self.marks["profiled"] = time.perf_counter() - self.marks["stop"]

    def seconds_per_step(self) -> float:
        return (self.marks["stop"] - self.marks["start"]) / self.iterations

    def gpu_busy(self) -> float | None:
        if not self.spans:
            return None
        busy = sum(a.elapsed_time(b) for a, b in self.spans)
        return round(busy / self.spans[0][0].elapsed_time(self.spans[-1][1]), 4)


def _time_trainer(overrides: dict, iterations: int, warmup: int, profile: str | None = None,
                  profile_steps: int = 0, decoder_pad: str = "if_needed", store=None, variant: str | None = None) -> dict:
    from bim.distributed import rank_and_world
    from bim.engine import cudagraph_skips
    from bim.network import set_decoder_padding

    progress("building the trainer")
    wf, trainer = build_trainer(overrides, store, variant)
    progress("trainer built, starting the steps")
    set_decoder_padding(trainer.network, always=decoder_pad == "always")  # before the first step compiles it
    device = torch.device(trainer.state.device)
    profile = profile if rank_and_world()[0] == 0 else None  # every rank runs the profiled steps, rank 0 records them
    prof = device_profiler(device) if profile else None
    timer = StepTimer(device, warmup, iterations, prof, profile_steps)
    timer.attach(trainer)
    trainer.run()
    seconds = timer.seconds_per_step()
    batch = int(wf.parser.get_parsed_content("batch_size"))
    profiled = {"profile": profile_summary(prof, timer.marks["profiled"], device, profile)} if prof is not None else {}
    step = {**profiled, **trained_unet(trainer.network),
        "channels_last": bool(wf.parser.get_parsed_content("channels_last")),
        "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
        "source_slices_per_step": batch,
        "network_images_per_step": 2 * batch,
        "ms_per_step": 1000 * seconds,
        "images_per_s": 2 * batch / seconds,
        "source_slices_per_s": batch / seconds,
        "gpu_busy": timer.gpu_busy(),
        "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
        "final_loss": float(trainer.state.output["loss"]),
        "cudagraph_skips": cudagraph_skips(),
    }
    step = combine_ranks(step)
    progress("results gathered from every rank, finalising")
    wf.finalize()  # multi_gpu_train.json: barrier, then the process group ends
    return step


def trained_unet(network: torch.nn.Module) -> dict:
    """The U-Net inside the trainer's ``network`` (compiled, DDP-wrapped or not): its ``unet_style`` and
    ``features``, read from its weights as inference reads them from a checkpoint (:func:`bim.network.unet_style_of`),
    so the bare U-Net the step is compared with is the one the step trains."""
    from bim.network import unet_features_of, unet_style_of

    state = network.state_dict()
    return {"unet_style": unet_style_of(state), "features": unet_features_of(state)}


def combine_ranks(step: dict) -> dict:
    """``step`` with the throughput of all ranks: ``gpus``, each rank's ms per step, ``images_per_s_total`` (every
    rank's images of a step over the slowest rank's step time; ranks wait for each other in DDP's all-reduce)
    and ``images_per_s_per_gpu``. One process: its own figures."""
    from bim.distributed import all_gather_objects

    ranks = all_gather_objects({k: step[k] for k in ("ms_per_step", "gpu_busy", "peak_memory_gib")})
    slowest = max(r["ms_per_step"] for r in ranks)
    total = len(ranks) * step["network_images_per_step"] / (slowest / 1000)
    return {**step, "gpus": len(ranks), "ms_per_step_ranks": [r["ms_per_step"] for r in ranks],
            "gpu_busy_ranks": [r["gpu_busy"] for r in ranks], "images_per_s_total": total,
            "images_per_s_per_gpu": total / len(ranks)}


def _time_bare_unet(batch: int, size: int, iterations: int, warmup: int, compiled: bool, device, unet: dict,
                    channels_last=False, decoder_pad: str = "if_needed") -> dict:
    """Forward + backward + RAdam step of the U-Net alone (``unet``: the trainer's ``unet_style`` and ``features``,
    :func:`trained_unet`; a 1x1 convolution to 2 classes as its head, where pre-training has its cluster heads) on
    ``batch`` images of ``size``^2, bf16 autocast on CUDA."""
    from bim.engine import bf16_autocast
    from bim.network import build_unet, set_decoder_padding

    fmt = torch.channels_last if channels_last else torch.contiguous_format
    net = build_unet(out_channels=2, features=unet["features"], unet_style=unet["unet_style"])
    net = set_decoder_padding(net, always=decoder_pad == "always").to(device=device, memory_format=fmt)
    opt = torch.optim.RAdam(net.parameters(), lr=1e-4)
    step_net = torch.compile(net) if compiled else net
    x = torch.rand(batch, 1, size, size, device=device).contiguous(memory_format=fmt)
    for i in range(warmup + iterations):
        if i == warmup:
            _sync(device)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with bf16_autocast(device):
            loss = step_net(x).float().mean()
        loss.backward()
        opt.step()
    _sync(device)
    seconds = (time.perf_counter() - t0) / iterations
    return {"batch": batch, "compiled": compiled, "channels_last": channels_last, "unet_style": unet["unet_style"],
            "features": list(unet["features"]), "ms_per_step": 1000 * seconds, "images_per_s": batch / seconds,
            "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None}


def bench_overrides(dataset_dir, output_dir: str, steps: int, scans_per_batch: int, crop_size: int, compile: bool,
                    compile_mode, num_subheads: int, channels_last=None, cudnn_deterministic=None,
                    compile_optimizer: bool | None = None) -> dict:
    """The bundle settings of a timed run: one epoch of ``steps`` iterations, nothing logged, drawn or scored on the
    way; ``channels_last`` / ``cudnn_deterministic`` / ``compile_optimizer`` None: the bundle's defaults."""
    overrides = dict(dataset_dir=dataset_dir, output_dir=output_dir, epochs=1, iters_per_epoch=steps,
                     scans_per_batch=scans_per_batch, crop_size=crop_size, log_every=10**9, panel_every=10**9,
                     save_every=10**9, resume_from=None, progress_bar=False, compile=compile, cluster_quality=False,
                     num_subheads=num_subheads, compile_mode=compile_mode)
    if channels_last is not None:
        overrides["channels_last"] = bool(channels_last)
    if cudnn_deterministic is not None:
        overrides["cudnn_deterministic"] = bool(cudnn_deterministic)
    if compile_optimizer is not None:
        overrides["compile_optimizer"] = bool(compile_optimizer)
    return overrides


def report(result: dict, out: str | None) -> None:
    """Print ``result`` as one JSON line; with ``out`` also write it there (temporary file, then rename)."""
    print(json.dumps(result))
    if out:
        with atomic_file(out) as tmp:
            Path(tmp).write_text(json.dumps(result, indent=2) + "\n")


def main(dataset_dir: str | None = None, iterations: int = 50, warmup: int = 10, compile: bool = False,
         compile_bare: bool = False, channels_last: bool | None = None, compile_mode: str | None = None, num_subheads: int = 3, scans_per_batch: int = 6, crop_size: int = 224, out: str | None = None,
         output_dir: str = "/tmp/bim_benchmark_pretrain", profile: str | None = None, profile_steps: int = 10,
         bare: bool | None = None, decoder_pad: str = "if_needed", cudnn_deterministic: bool | None = None,
         scaling=None, run_timeout_s: float = 600, compile_optimizer: bool | None = None,
         variant: str | None = None) -> None:
    from bim.flags import require_flags

    if scaling is not None:
        return scaling_run(scaling, out, run_timeout_s)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    bare = world == 1 if bare is None else bare
    # fire gives --compile false as the string 'false', which bool() takes for true: a bool or a clear error
    require_flags({"compile": compile, "compile_bare": compile_bare, "bare": bare,
                   **{k: v for k, v in (("channels_last", channels_last), ("cudnn_deterministic", cudnn_deterministic),
                                        ("compile_optimizer", compile_optimizer))
                      if v is not None}})
    if profile and int(profile_steps) < 1:
        raise ValueError(f"profile_steps must be >= 1 with --profile, got {profile_steps}")
    if decoder_pad not in ("if_needed", "always"):
        raise ValueError(f"decoder_pad: expected 'if_needed' or 'always', got {decoder_pad!r}")
    pretrain_configs(variant)  # an unknown variant stops here, before any work
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    extra = int(profile_steps) if profile else 0
    overrides = bench_overrides(dataset_dir, output_dir, warmup + iterations + extra, scans_per_batch, crop_size, compile,
                                compile_mode, num_subheads, channels_last, cudnn_deterministic, compile_optimizer)
    full_step = _time_trainer(overrides, iterations, warmup, profile, extra, decoder_pad, variant=variant)
    if int(os.environ.get("RANK", "0")) != 0:
        return
    channels_last = full_step["channels_last"]
    result = {
        "settings": {"compile": compile, "compile_mode": compile_mode,
                     "compile_optimizer": compile if compile_optimizer is None else compile_optimizer,
                     "channels_last": channels_last,
                     "decoder_pad": decoder_pad, "cudnn_deterministic": full_step["cudnn_deterministic"],
                     "num_subheads": num_subheads, "variant": variant, "unet_style": full_step["unet_style"],
                     "features": full_step["features"],
                     "scans_per_batch": scans_per_batch, "crop_size": crop_size},
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "command": ("torchrun ... " if world > 1 else "python ") + "tools/benchmark_pretrain.py " + " ".join(sys.argv[1:]),
        "full_step": full_step,
    }
    if bare:  # the U-Net alone at the same batch: what the losses, augmentation and sampling add
        result.update(time_bare_unets(full_step, crop_size, iterations, warmup, device, compile_bare, decoder_pad))
    report(result, out)


def time_bare_unets(full_step: dict, crop_size: int, iterations: int, warmup: int, device, compile_bare: bool,
                    decoder_pad: str) -> dict:
    """The bare U-Net timings of :func:`main`, at the full step's batch, of the trainer's U-Net (style and widths),
    in eager mode (and channels-last where the step is), and compiled with ``compile_bare``."""
    batch, channels_last = full_step["network_images_per_step"], full_step["channels_last"]
    unet = {"unet_style": full_step["unet_style"], "features": full_step["features"]}
    timed = {"bare_unet_eager_bf16": _time_bare_unet(batch, crop_size, iterations, warmup, False, device, unet, False,
                                                     decoder_pad)}
    if channels_last:
        timed["bare_unet_eager_bf16_channels_last"] = _time_bare_unet(batch, crop_size, iterations, warmup, False,
                                                                      device, unet, True, decoder_pad)
    if compile_bare:
        timed["bare_unet_compiled_bf16"] = _time_bare_unet(batch, crop_size, iterations, warmup, True, device, unet,
                                                           channels_last, decoder_pad)
    return timed


def _argv_without(argv: list[str], names: tuple[str, ...]) -> list[str]:
    """``argv`` without the options ``--name value`` / ``--name=value`` of ``names``."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg[2:].split("=", 1)[0] if arg.startswith("--") else None
        if name in names:
            skip = "=" not in arg
            continue
        kept.append(arg)
    return kept


def scaling_counts(scaling) -> list[int]:
    """``--scaling`` as a list of process counts (``1,2,4``, a tuple or a list), each >= 1, no more than the GPUs."""
    counts = [int(n) for n in (str(scaling).strip("()[] ").split(",") if not isinstance(scaling, (tuple, list))
                                else scaling)]
    if not counts or min(counts) < 1:
        raise ValueError(f"scaling: expected process counts such as 1,2,4, got {scaling!r}")
    if torch.cuda.is_available() and max(counts) > torch.cuda.device_count():
        raise ValueError(f"scaling: {max(counts)} processes need {max(counts)} GPUs, this machine has "
                         f"{torch.cuda.device_count()}")
    return counts


def torchrun_command(n: int, argv: list[str], out: Path) -> list[str]:
    """This benchmark under ``torchrun`` on ``n`` processes, its JSON written to ``out``."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(n),
            str(Path(__file__).resolve()), *argv, "--bare", "False", "--out", str(out)]


def _kill_group(proc: subprocess.Popen) -> None:
    """End ``proc``'s process group (``torchrun`` and its workers): SIGTERM, then SIGKILL after 10 s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            continue


def run_with_timeout(cmd: list[str], env: dict, timeout_s: float, keep_lines: int = 40) -> tuple[int | None, list[str]]:
    """Run ``cmd`` in a process group of its own, its output (stdout and stderr) echoed to stderr as it comes.
    Returns its exit status, or None when it ran past ``timeout_s`` and was ended with every process of its group
    (also when this process is interrupted), and its last ``keep_lines`` lines."""
    tail = collections.deque(maxlen=keep_lines)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)

    def echo():
        for line in proc.stdout:
            tail.append(line.rstrip("\n"))
            sys.stderr.write(line)
            sys.stderr.flush()

    reader = threading.Thread(target=echo, daemon=True)
    reader.start()
    code = None
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pass
    finally:
        if proc.poll() is None:
            _kill_group(proc)
    reader.join(timeout=10)
    return code, list(tail)


def scaling_row(n: int, run: dict, baseline: dict | None) -> dict:
    """One count's line: images/s in total and per GPU, the slowest rank's ms/step, each rank's GPU busy share, and
    the speed-up and scaling efficiency over ``baseline`` (the first count that finished; None: this is it)."""
    step = run["full_step"]
    first = baseline or {"gpus": n, "images_per_s_total": step["images_per_s_total"]}
    speedup = step["images_per_s_total"] / first["images_per_s_total"]
    return {"gpus": n, "images_per_s_total": step["images_per_s_total"],
            "images_per_s_per_gpu": step["images_per_s_per_gpu"], "ms_per_step": max(step["ms_per_step_ranks"]),
            "gpu_busy": step["gpu_busy_ranks"], "speedup": speedup,
            "scaling_efficiency": speedup * first["gpus"] / n}


def scaling_run(scaling, out: str | None, run_timeout_s: float = 600) -> None:
    """``--scaling 1,2,4``: this benchmark under ``torchrun --standalone --nproc_per_node N`` for each N in turn (the
    other options passed on, the bare U-Net left out), each run at most ``run_timeout_s`` seconds. As each N
    finishes, its line (:func:`scaling_row`) is printed; a run that fails or times out is ended with its
    processes, its last lines go to stderr, and the next N runs. At the end one JSON line: the lines of the Ns that
    finished (speed-up and efficiency over the first of them) and ``failed``, the Ns that did not and why; the exit
    status is 1 when any did not finish."""
    counts = scaling_counts(scaling)
    if isinstance(run_timeout_s, bool) or not isinstance(run_timeout_s, (int, float)) or not run_timeout_s > 0:
        raise ValueError(f"run_timeout_s must be a positive number of seconds, got {run_timeout_s!r}")
    argv = _argv_without(sys.argv[1:], ("scaling", "out", "bare", "run_timeout_s"))
    # every process the same CPU threads whatever N (torchrun would give 1 to each of several, all to one alone)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // max(counts))))}
    rows, failed, first_run = [], [], None
    for n in counts:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "run.json"
            cmd = torchrun_command(n, argv, path)
            code, tail = run_with_timeout(cmd, env, run_timeout_s)
            if code != 0 or not path.is_file():
                why = f"timed out after {run_timeout_s} s" if code is None else f"failed (exit {code})"
                sys.stderr.write(f"error: the run on {n} processes {why}: {' '.join(cmd)}\nits last lines:\n"
                                 + "\n".join(tail) + "\n")
                failed.append({"gpus": n, "error": why})
                continue
            run = json.loads(path.read_text())
        first_run = first_run or run
        rows.append(scaling_row(n, run, rows[0] if rows else None))
        print(json.dumps(rows[-1]), flush=True)
    report({"scaling": rows, "failed": failed, "settings": first_run["settings"] if first_run else None,
            "device": first_run["device"] if first_run else None, "torch": torch.__version__,
            "command": "python tools/benchmark_pretrain.py " + " ".join(sys.argv[1:])}, out)
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    fire.Fire(main)
