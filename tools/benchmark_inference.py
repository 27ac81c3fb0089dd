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
``gflop_per_scan``: the network's floating-point operations for the scan (torch's ``FlopCounterMode``, a multiply-add
counted as 2, padding included), and ``gflop_per_s`` that over the median time: what the CPU sustains, against its
peak (2 cores with AVX2 FMA at 3 GHz: 2 x 2 x 8 x 2 x 3 = 192 GFLOP/s in fp32).
"""

from __future__ import annotations

import copy
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
    gflop = scan_gflop(net, scan)
    result = {
        "ms_per_scan_median": round(statistics.median(times), 2),
        "gflop_per_scan": round(gflop, 1),
        "gflop_per_s": round(gflop / (statistics.median(times) / 1000.0), 1),
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


def scan_gflop(net: torch.nn.Module, scan: torch.Tensor) -> float:
    """GFLOP of ``net`` over the slices of ``scan`` [1, 1, H, W, D] as ``SliceBatchInferer`` runs them (padded to a
    multiple of 16; counted on one slice on the meta device, times the number of slices)."""
    from torch.utils.flop_counter import FlopCounterMode

    h, w, d = scan.shape[2:]
    pad = lambda n: -(-n // 16) * 16  # noqa: E731
    meta = copy.deepcopy(net).to("meta")
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        meta(torch.empty(1, 1, pad(h), pad(w), device="meta"))
    return counter.get_total_flops() * d / 1e9


def main(**kwargs) -> None:
    # fire hands --amp false over as the string 'false', which bool() takes for true: a bool or a clear error
    require_flags({k: kwargs[k] for k in ("amp", "channels_last", "cpu_bf16") if k in kwargs})
    benchmark(**kwargs)  # prints the JSON line; nothing else for fire to print


if __name__ == "__main__":
    fire.Fire(main)
