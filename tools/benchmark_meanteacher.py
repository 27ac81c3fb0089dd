"""Throughput of the Mean Teacher training step of the meanteacher_seg bundle.

    python tools/benchmark_meanteacher.py [--batch_size 12] [--unlabelled_batch_size 12] [--size 224]
                                          [--iterations 50] [--warmup 10] [--method mean_teacher]
                                          [--features 32,64,128,256,512,32] [--channels_last True] [--bf16 True]
                                          [--compile False] [--compile_mode None] [--cudnn_deterministic None]
                                          [--compile_teacher True] [--compile_optimizer None] [--compile_step None]
                                          [--profile PATH --profile_steps 10]

Times the bundle's own step (the ``--method``'s class of ``bim.semi_supervised.METHODS``: augmentation of both
batches on the device, student forward/backward on labelled + unlabelled views, teacher forward under ``no_grad``,
losses in fp32, RAdam step, EMA update of the teacher, the bundle's LR schedule stepped every iteration) on random
slices already on the device (``size`` x ``size``, the crop size too). Student images per step =
``batch_size + unlabelled_batch_size``. Prints one JSON object: device, ms/step, student images/s, peak memory, the
losses of the warm-up steps (same seeds in every run: two runs that differ only in how the step is compiled agree to
bf16 rounding and cuDNN's choice of algorithms), ``cudagraph_skips`` (compiled graphs that run without the CUDA
graphs ``--compile_mode reduce-overhead`` asks for; ``TORCH_LOGS=cudagraphs`` says why). For comparison, SSL4MIS
Mean Teacher runs ~400 student images/s on an H200; the target is >= 1,500 on one H100/H200 with the paper's U-Net
(32-512) at 224 x 224.

``--method supervised --batch_size 5 --unlabelled_batch_size 0`` times the labelled step alone, at the fine-tuning
batch of the paper (finetune_seg's step has the same work). ``--compile True --compile_mode reduce-overhead``
tries CUDA graphs, which the bundles take as ``--compile_mode reduce-overhead``. ``--cudnn_deterministic True``
pins cuDNN to deterministic algorithms; ``False`` lets it autotune. The default (None) times what the bundle runs: deterministic for
``--method supervised`` (``finetune_seg``), autotuned for the semi-supervised methods (``meanteacher_seg`` since 0.7.1,
as ``pretrain_bim`` since 0.2.6). Before this option the benchmark always autotuned, so its earlier numbers are those
of autotuned cuDNN. With ``--compile True`` the teacher's forwards are compiled too, as meanteacher_seg does by default
(its ``compile_teacher``, which also needs its ``compile``); ``--compile_teacher False`` leaves them eager (the default
of this benchmark before the bundle's). ``--compile_optimizer`` runs the RAdam step through ``torch.compile``
(``bim.engine.compile_optimizer_step``); its default (None) follows ``--compile``, as the bundles' key does.
``--compile_step True`` (with ``--compile True``) compiles the Mean Teacher step's views, forwards and losses as one
function (meanteacher_seg's ``compile_step``); its default (None) is what the bundle runs: on with ``--compile`` for
``--method mean_teacher``, off for the methods that cannot compile their step as one function.

``--profile PATH``: after the timed steps, ``profile_steps`` more under ``torch.profiler``; the operators sorted by
device time (on a GPU) and by host time go to PATH, and the JSON gains ``profile``: the device time per profiled step against
the wall time per step (``gpu_busy_share``, kernels only; below 1 the step waits on the host: launches, Python, synchronisations).
The profiler slows the host, so the step time is the timed figure above, not the profiled one.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(batch_size: int = 12, unlabelled_batch_size: int = 12, size: int = 224, iterations: int = 50,
         warmup: int = 10, method: str = "mean_teacher", features=(32, 64, 128, 256, 512, 32),
         channels_last: bool = True, bf16: bool = True, num_classes: int = 2, device: str | None = None,
         compile: bool = False, compile_mode: str | None = None, cudnn_deterministic: bool | None = None,
         compile_teacher: bool = True, profile: str | None = None, profile_steps: int = 10,
         compile_optimizer: bool | None = None, compile_step: bool | None = None) -> None:
    from bim import semi_supervised as ss
    from bim.engine import compile_optimizer_step, cudagraph_skips, warmup_cosine_scheduler
    from bim.flags import require_flags
    from bim.network import build_unet, to_channels_last
    from bim.segmentation import SegmentationAugment

    if cudnn_deterministic is None:  # what the bundle that runs this step sets (its cudnn_deterministic default)
        cudnn_deterministic = method == "supervised"
    if profile and int(profile_steps) < 1:
        raise ValueError(f"profile_steps must be >= 1 with --profile, got {profile_steps}")
    require_flags({"channels_last": channels_last, "bf16": bf16, "compile": compile,
                   "cudnn_deterministic": cudnn_deterministic, "compile_teacher": compile_teacher,
                   **({} if compile_optimizer is None else {"compile_optimizer": compile_optimizer}),
                   **({} if compile_step is None else {"compile_step": compile_step})})  # fire gives --compile false as the string 'false'
    compile_optimizer = compile if compile_optimizer is None else compile_optimizer  # the bundles' default
    if compile_step is None:  # meanteacher_seg's default: the variants of methods that cannot set it false
        compile_step = getattr(ss.METHODS.get(method), "compiles_as_one_step", False)
    if isinstance(features, str):
        features = [int(f) for f in features.split(",")]
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    # as the bundles' initialize does with their cudnn_deterministic key
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn_deterministic, not cudnn_deterministic
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    net = to_channels_last(build_unet(out_channels=num_classes, features=tuple(features)).to(dev), channels_last)
    teacher = ss.ema_teacher(net, 0.99)
    optimizer = compile_optimizer_step(torch.optim.RAdam(net.parameters(), lr=2e-5), compile_optimizer)
    # meanteacher_seg's schedule (its defaults): the LR changes at every iteration, as in a training run
    scheduler = warmup_cosine_scheduler(optimizer, epochs=50, iters_per_epoch=200, warmup_epochs=10, start_ratio=0.005)
    settings = ss.StepSettings(SegmentationAugment(crop_size=size, generator=generator), optimizer, num_classes,
                               teacher=teacher, rampup_iterations=100, bf16=bf16, channels_last=channels_last,
                               compile_teacher=compile and compile_teacher, compile_mode=compile_mode,
                               compile_step=compile and compile_step)
    step = _method(ss, method, settings, dev)
    student = torch.compile(net, mode=compile_mode) if compile else net
    g = torch.Generator(device="cpu").manual_seed(1)
    pool_l = torch.rand(64, 1, size, size, generator=g).to(dev)
    labels = torch.randint(0, num_classes, (64, 1, size, size), generator=g).to(torch.uint8).to(dev)
    pool_u = torch.rand(256, 1, size, size, generator=g).to(dev)

    def batch():
        i = torch.randint(0, 64, (batch_size,), generator=g).to(dev)
        j = torch.randint(0, 256, (max(1, unlabelled_batch_size),), generator=g).to(dev)
        return {"image": pool_l[i], "label": labels[i], "unlabelled": pool_u[j]}

    def scheduled_step(batch_, it):
        out = step(student, batch_, it)
        scheduler.step()
        return out

    warmup_losses = [round(float(scheduled_step(batch(), it)["loss"]), 5) for it in range(warmup)]
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    batches = [batch() for _ in range(min(iterations, 8))]
    start = time.perf_counter()
    for it in range(iterations):
        scheduled_step(batches[it % len(batches)], warmup + it)
    _sync(dev)
    seconds = (time.perf_counter() - start) / iterations
    profiled = {}
    if profile:
        profiled = {"profile": _profile_steps(lambda it: scheduled_step(batches[it % len(batches)], it), dev,
                                              warmup + iterations, int(profile_steps), profile)}
    images = batch_size + (unlabelled_batch_size if step.uses_unlabelled else 0)
    result = {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)",
        "method": method, "features": list(features), "size": size,
        "labelled_batch": batch_size, "unlabelled_batch": unlabelled_batch_size,
        "student_images_per_step": images,
        "ms_per_step": round(1000 * seconds, 3),
        "student_images_per_s": round(images / seconds, 1),
        "peak_memory_gib": round(torch.cuda.max_memory_allocated(dev) / 2**30, 3) if dev.type == "cuda" else None,
        "bf16": bool(bf16 and dev.type == "cuda"), "channels_last": bool(channels_last and dev.type == "cuda"), "compile": bool(compile), "compile_mode": compile_mode,
        "cudnn_deterministic": bool(cudnn_deterministic),
        "compile_teacher": bool(compile and compile_teacher),
        "compile_optimizer": bool(compile_optimizer),
        "compile_step": bool(compile and compile_step),
        "cudagraph_skips": cudagraph_skips(),
        "warmup_losses": warmup_losses,
        "torch": torch.__version__,
        **profiled,
    }
    print(json.dumps(result))


def _profile_steps(run_step, dev: torch.device, first: int, steps: int, path: str) -> dict:
    """``steps`` calls of ``run_step(iteration)`` from ``first`` on under ``torch.profiler``; the operator tables go
    to ``path`` (the pre-training benchmark's writer); returns its dict plus the device time per step in ms (on a GPU)."""
    from benchmark_pretrain import device_profiler, profile_summary

    with device_profiler(dev) as prof:
        start = time.perf_counter()
        for it in range(first, first + steps):
            run_step(it)
        _sync(dev)
        wall = time.perf_counter() - start
    summary = profile_summary(prof, wall, dev, path)
    if summary["gpu_busy_share"] is not None:
        summary["device_ms_per_step"] = round(1000 * summary["gpu_busy_share"] * wall / steps, 3)
    summary["profiled_ms_per_step"] = round(1000 * wall / steps, 3)
    return summary


def _method(ss, method: str, settings, dev: torch.device):
    """``method``'s class from the registry (an unknown one: the registry's error), weight 1 (none for supervised),
    UA-MT paced over 1,000 iterations, the adversarial method with the bundle's discriminator."""
    cls = ss.method_class(method)
    if cls is ss.Supervised:
        return cls(settings)
    if cls is ss.UncertaintyAwareMeanTeacher:
        return cls(settings, 1.0, total_iterations=1000)
    if cls is ss.Adversarial:
        disc = ss.PredictionDiscriminator(settings.num_classes).to(dev)
        return cls(settings, 1.0, disc, torch.optim.Adam(disc.parameters(), lr=1e-4))
    return cls(settings, 1.0)


def _cli(argv: list[str]) -> dict:
    """``--key value`` pairs as keyword arguments (used where ``fire`` is not installed)."""
    import ast

    kwargs, it = {}, iter(argv)
    for arg in it:
        if not arg.startswith("--"):
            raise SystemExit(f"unexpected argument {arg!r}: use --key value")
        key, _, value = arg[2:].partition("=")
        value = value or next(it)
        try:
            kwargs[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            kwargs[key] = value
    return kwargs


if __name__ == "__main__":
    try:
        import fire
    except ImportError:  # a bare GPU machine: same flags, parsed here
        main(**_cli(sys.argv[1:]))
    else:
        fire.Fire(main)
