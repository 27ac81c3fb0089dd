"""Inference speed of the finetune_seg network: milliseconds per scan (slices x size x size), printed as JSON.

    python tools/benchmark_inference.py --device cpu --threads 2
    python tools/benchmark_inference.py --device cpu --threads 2 --cpu_bf16 True   # as inference.json runs on a CPU with native bf16
    python tools/benchmark_inference.py --device cuda            # bf16 autocast on CUDA
    python tools/benchmark_inference.py --device cpu --threads 2 --cpu_bf16 True --max_slices 2 --cpu_backend auto
                                                                 # as inference.json runs on this CPU
    python tools/benchmark_inference.py --device cpu --threads 2 --max_slices 2 --cpu_backend onnxruntime

Each timed run segments one scan the way the bundle does (``SliceBatchInferer``: all slices as one batch, or
``max_slices`` at a time, padded to a multiple of 16, then softmax + argmax), after ``warmup`` untimed runs.
``first_run_ms`` is the first untimed run, which with ONNX Runtime includes the network's export (once a process).
"""

from __future__ import annotations

import json
import platform
import statistics
import time

import fire
import torch


from bim.flags import require_flags  # noqa: E402
from bim.inference import SliceBatchInferer  # noqa: E402
from bim.engine import cpu_has_native_bf16  # noqa: E402
from bim.network import PAPER_FEATURES, build_unet  # noqa: E402


def benchmark(
    device: str = "cpu",
    slices: int = 10,
    size: int = 384,
    num_classes: int = 2,
    warmup: int = 2,
    runs: int = 5,
    threads: int | None = None,
    amp: bool = True,
    channels_last: bool = False,
    max_slices: int | None = None,
    features: tuple = PAPER_FEATURES,
    cpu_bf16: bool = False,
    cpu_backend: str = "torch",
) -> dict:
    """Time ``runs`` inferences of one [1, 1, size, size, slices] scan on ``device`` (``threads``: torch threads
    on the CPU; ``amp``: bf16 autocast on CUDA, and on the CPU with ``cpu_bf16`` where it has native bf16; ``max_slices``:
    slices per forward pass, None = all; ``cpu_backend``: torch, onnxruntime or auto, as inference.json's key).
    Returns and prints the numbers as JSON."""
    if warmup < 1:
        raise ValueError(f"warmup must be >= 1 (the first run, timed apart as first_run_ms), got {warmup}")
    if threads:
        torch.set_num_threads(int(threads))
    dev = torch.device(device)
    net = build_unet(out_channels=num_classes, features=tuple(features)).to(dev).eval()
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    net = net.to(memory_format=memory_format)
    inferer = SliceBatchInferer(divisor=16, max_slices=max_slices, amp=amp, cpu_bf16=cpu_bf16, cpu_backend=cpu_backend)
    scan = torch.rand(1, 1, size, size, slices, device=dev)

    def once() -> float:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        start = time.perf_counter()
        with torch.inference_mode():
            mask = inferer(scan, net).softmax(1).argmax(1)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        else:
            mask.sum().item()
        return (time.perf_counter() - start) * 1000.0

    first = once()
    for _ in range(warmup - 1):
        once()
    times = [once() for _ in range(runs)]
    result = {
        "ms_per_scan_median": round(statistics.median(times), 2),
        "ms_per_scan_min": round(min(times), 2),
        "ms_all": [round(t, 2) for t in times],
        "device": str(dev),
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or platform.machine(),
        "torch_threads": torch.get_num_threads(),
        "bf16_autocast": bool(amp and (dev.type == "cuda" or (cpu_bf16 and cpu_has_native_bf16()))),
        "scan": [slices, size, size],
        "features": list(features),
        "num_classes": num_classes,
        "max_slices": max_slices,
        "channels_last": bool(channels_last),
        "cpu_backend": cpu_backend,
        "onnxruntime": inferer.runs_onnxruntime(net),
        "first_run_ms": round(first, 2),
        "torch": torch.__version__,
    }
    print(json.dumps(result))
    return result


def main(**kwargs) -> None:
    # fire hands --amp false over as the string 'false', which bool() takes for true: a bool or a clear error
    require_flags({k: kwargs[k] for k in ("amp", "channels_last", "cpu_bf16") if k in kwargs})
    benchmark(**kwargs)  # prints the JSON line; nothing else for fire to print


if __name__ == "__main__":
    fire.Fire(main)
