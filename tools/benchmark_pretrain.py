"""Throughput of the pre-training step, measured on the bundle's own trainer.

    python tools/benchmark_pretrain.py [--dataset_dir DIR] [--iterations 50] [--warmup 10] [--compile False]
        [--channels_last True|False] [--decoder_pad if_needed|always] [--cudnn_deterministic True|False]
        [--profile PATH --profile_steps 10]

Builds the pretrain_bim trainer from ``bundles/pretrain_bim/configs/train.json`` (data held on the device, GPU
augmentation, all three losses, bf16 autocast with the MI/CC losses in fp32) and times ``iterations`` full
steps after ``warmup`` steps; then, at the same batch (2 views x scans_per_batch x partitions images of
crop_size^2), the bare U-Net forward+backward in eager bf16 (and compiled with ``--compile_bare True``).
``--channels_last`` left out follows the bundle's default (channels-last on CUDA). ``--decoder_pad always`` puts
back MONAI's ``UpCat``, which pads the upsampled features even by zero pixels, to measure what
``bim.network.UpCatPadIfNeeded`` (the default) saves. ``--cudnn_deterministic False`` lets cuDNN autotune
its algorithms (the bundle's ``cudnn_deterministic`` key; left out, the bundle's default: deterministic).
Prints one JSON object: GPU, images/s (network images = both views), source slices/s, ms/step, peak memory.
``--profile PATH``: after the timed steps, ``profile_steps`` more under ``torch.profiler``; writes the operators
sorted by device time (CPU time on a CPU) to PATH and adds to the JSON the share of the profiled wall time during
which the GPU ran kernels (below 1: the step waits on the CPU, e.g. Python, launches or host syncs).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import fire
import torch

from bim.files import atomic_file

ROOT = Path(__file__).resolve().parents[1]


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _device_time_us(event) -> float:
    """An operator's own time on the device (attribute names differ between torch releases)."""
    for name in ("self_device_time_total", "self_cuda_time_total"):
        if hasattr(event, name):
            return float(getattr(event, name))
    return 0.0


def profile_summary(prof, wall_s: float, device, path: str, rows: int = 40) -> dict:
    """Write ``prof``'s operator table to ``path`` (temporary file, then rename) and return the device-busy share."""
    on_gpu = device.type == "cuda"
    table = prof.key_averages().table(sort_by="self_cuda_time_total" if on_gpu else "self_cpu_time_total", row_limit=rows)
    out = Path(path)
    with atomic_file(out) as tmp:
        Path(tmp).write_text(table + "\n")
    busy = sum(_device_time_us(e) for e in prof.key_averages()) / 1e6 if on_gpu else None
    return {"table": str(out), "wall_s": wall_s,
            "gpu_busy_share": round(busy / wall_s, 3) if busy is not None and wall_s > 0 else None}


def _time_trainer(overrides: dict, iterations: int, warmup: int, profile: str | None = None,
                  profile_steps: int = 0, decoder_pad: str = "if_needed") -> dict:
    from ignite.engine import Events
    from monai.bundle import ConfigWorkflow

    from bim.network import set_decoder_padding

    cfg = str(ROOT / "bundles" / "pretrain_bim" / "configs" / "train.json")
    wf = ConfigWorkflow(config_file=cfg, workflow_type="train", bundle_root=str(Path(cfg).parents[1]), **overrides)
    wf.initialize()
    trainer = wf.parser.get_parsed_content("train#trainer")
    set_decoder_padding(trainer.network, always=decoder_pad == "always")  # before the first step compiles it
    device = torch.device(trainer.state.device)
    marks = {}

    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else [])
    prof = torch.profiler.profile(activities=activities) if profile else None

    def mark(engine):
        if engine.state.iteration == warmup:
            _sync(device)
            marks["start"] = time.perf_counter()
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
        if engine.state.iteration == warmup + iterations:
            _sync(device)
            marks["stop"] = time.perf_counter()
            if prof is not None:
                prof.start()
        if prof is not None and engine.state.iteration == warmup + iterations + profile_steps:
            _sync(device)
            prof.stop()
            marks["profiled"] = time.perf_counter() - marks["stop"]

    trainer.add_event_handler(Events.ITERATION_COMPLETED, mark)
    trainer.run()
    seconds = (marks["stop"] - marks["start"]) / iterations
    batch = int(wf.parser.get_parsed_content("batch_size"))
    profiled = {"profile": profile_summary(prof, marks["profiled"], device, profile)} if prof is not None else {}
    return {**profiled,
        "channels_last": bool(wf.parser.get_parsed_content("channels_last")),
        "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
        "source_slices_per_step": batch,
        "network_images_per_step": 2 * batch,
        "ms_per_step": 1000 * seconds,
        "images_per_s": 2 * batch / seconds,
        "source_slices_per_s": batch / seconds,
        "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
        "final_loss": float(trainer.state.output["loss"]),
    }


def _time_bare_unet(batch: int, size: int, iterations: int, warmup: int, compiled: bool, device, channels_last=False,
                    decoder_pad: str = "if_needed") -> dict:
    from bim.engine import bf16_autocast
    from bim.network import build_unet, set_decoder_padding

    fmt = torch.channels_last if channels_last else torch.contiguous_format
    net = set_decoder_padding(build_unet(out_channels=2), always=decoder_pad == "always").to(device=device, memory_format=fmt)
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
    return {"batch": batch, "compiled": compiled, "channels_last": channels_last, "ms_per_step": 1000 * seconds, "images_per_s": batch / seconds,
            "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None}


def main(dataset_dir: str | None = None, iterations: int = 50, warmup: int = 10, compile: bool = False,
         compile_bare: bool = False, channels_last: bool | None = None, compile_mode: str | None = None, num_subheads: int = 3, scans_per_batch: int = 6, crop_size: int = 224, out: str | None = None,
         output_dir: str = "/tmp/bim_benchmark_pretrain", profile: str | None = None, profile_steps: int = 10,
         bare: bool = True, decoder_pad: str = "if_needed", cudnn_deterministic: bool | None = None) -> None:
    from bim.flags import require_flags

    # fire gives --compile false as the string 'false', which bool() takes for true: a bool or a clear error
    require_flags({"compile": compile, "compile_bare": compile_bare, "bare": bare,
                   **{k: v for k, v in (("channels_last", channels_last), ("cudnn_deterministic", cudnn_deterministic))
                      if v is not None}})
    if profile and int(profile_steps) < 1:
        raise ValueError(f"profile_steps must be >= 1 with --profile, got {profile_steps}")
    if decoder_pad not in ("if_needed", "always"):
        raise ValueError(f"decoder_pad: expected 'if_needed' or 'always', got {decoder_pad!r}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    extra = int(profile_steps) if profile else 0
    overrides = dict(dataset_dir=dataset_dir, output_dir=output_dir, epochs=1, iters_per_epoch=warmup + iterations + extra,
                     scans_per_batch=scans_per_batch, crop_size=crop_size, log_every=10**9, panel_every=10**9,
                     save_every=10**9, resume_from=None, progress_bar=False, compile=compile,
                     num_subheads=num_subheads, compile_mode=compile_mode)
    if channels_last is not None:  # left out: the bundle's default
        overrides["channels_last"] = bool(channels_last)
    if cudnn_deterministic is not None:
        overrides["cudnn_deterministic"] = bool(cudnn_deterministic)
    full_step = _time_trainer(overrides, iterations, warmup, profile, extra, decoder_pad)
    channels_last = full_step["channels_last"]
    result = {
        "settings": {"compile": compile, "compile_mode": compile_mode, "channels_last": channels_last,
                     "decoder_pad": decoder_pad, "cudnn_deterministic": full_step["cudnn_deterministic"],
                     "num_subheads": num_subheads,
                     "scans_per_batch": scans_per_batch, "crop_size": crop_size},
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "command": "python tools/benchmark_pretrain.py " + " ".join(sys.argv[1:]),
        "full_step": full_step,
    }
    batch = result["full_step"]["network_images_per_step"]
    if bare:  # the U-Net alone at the same batch: what the losses, augmentation and sampling add
        result["bare_unet_eager_bf16"] = _time_bare_unet(batch, crop_size, iterations, warmup, False, device, False, decoder_pad)
        if channels_last:
            result["bare_unet_eager_bf16_channels_last"] = _time_bare_unet(batch, crop_size, iterations, warmup, False, device, True,
                                                                           decoder_pad)
        if compile_bare:
            result["bare_unet_compiled_bf16"] = _time_bare_unet(batch, crop_size, iterations, warmup, True, device, channels_last,
                                                                decoder_pad)
    text = json.dumps(result, indent=2)
    print(text)
    if out:
        with atomic_file(out) as tmp:
            Path(tmp).write_text(text + "\n")


if __name__ == "__main__":
    fire.Fire(main)
