"""Pre-training throughput with the slices on the GPU and with the slices in pinned host memory, streamed batch by
batch (``data_store host``), on a generated corpus at least 20 times the size of ACDC's training set.

    python tools/benchmark_streaming.py [--dataset_dir DIR] [--acdc_multiple 20] [--size 384] [--iterations 200]
        [--warmup 30] [--compile True] [--scans_per_batch 6] [--crop_size 224] [--device_store True] [--out PATH]

On a GPU (the corpus takes about 22 GB of host memory, and as much again on the GPU for the in-memory run)::

    python tools/benchmark_streaming.py --dataset_dir /data/acdc_prepared --compile True   # ACDC x 20
    python tools/benchmark_streaming.py --compile True                                    # demo phantoms, 384 x 384

The corpus: the training scans of ``--dataset_dir`` (default: the demo set) resampled in-plane to ``--size`` and
repeated, each copy with its own gamma (and every other copy mirrored), each copy's scans new scans, until it holds
``--acdc_multiple`` times the pixels of ACDC's prepared training set (about 1,900 slices of 384 x 384; 20 times:
about 38,000 slices, 22 GB in float32). It is built once in host memory (pinned on CUDA).

The pretrain_bim trainer then runs twice with the same seed, so on the same batches: ``device_store``, the corpus
copied to the GPU (what the bundle does when it fits ``data_memory_budget_gb``), and ``host_stream``, the corpus left
in pinned host memory with each batch gathered there and copied on a side stream (:mod:`bim.streaming`). For each:
images/s, ms/step and ``gpu_busy`` (the share of the GPU time spent inside steps, see
``benchmark_pretrain.StepTimer``); for the host path also ``batch_gather_copy_ms``, one batch's gather and copy on
its own, synchronised (the work the CPU adds per step and the GPU's copy engine overlaps), and ``batch_parts_ms``,
its parts each on its own (:func:`stream_parts_ms`: index sampling, host gather into the pinned buffer, the same
gather by ``torch.index_select``, host-to-device copy, the whole ``take``); ``cpu`` gives the process's threads,
cores and CPU quota (:func:`cpu_threads`), which the host gather's time depends on. Prints one JSON line with
``host_vs_device`` = host images/s / device images/s. ``--device_store False`` skips the in-memory run (a GPU that
cannot hold the corpus). On a CPU both runs compute the same thing: their ``final_loss`` are equal (tests/ run
this in a small smoke mode: ``--acdc_multiple 0.002 --size 64``).
"""

from __future__ import annotations

import gc
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import fire
import torch

from benchmark_pretrain import _sync, _time_trainer, bench_overrides, report

ACDC_TRAINING_PIXELS = 1900 * 384 * 384  # ACDC's prepared training set: about 1,900 slices of 384 x 384


def base_store(dataset_dir, size: int):
    """The training scans of ``dataset_dir`` as a CPU slice store, resampled in-plane to ``size`` x ``size``."""
    from monai.data import Dataset

    from bim.data import SliceStore, dataset_summary, volume_loader

    summary = dataset_summary(dataset_dir)
    dataset = Dataset(data=summary["training"], transform=volume_loader(with_label=False))
    store = SliceStore.from_dataset(dataset, num_partitions=summary["num_partitions"])
    if store.spatial_size != (size, size):
        store.image = torch.nn.functional.interpolate(store.image, size=(size, size), mode="bilinear",
                                                      align_corners=False)
    return store


def tile_corpus(base, acdc_multiple: float, seed: int = 0):
    """``base`` repeated until the corpus holds ``acdc_multiple`` x ACDC's training pixels; copy c is ``base ** gamma_c``
    (gamma_c log-uniform in [0.7, 1.4]), mirrored left-right when c is odd, its scans numbered after copy c - 1's.
    The image tensor is allocated once (pinned when CUDA is available)."""
    from dataclasses import replace

    copies = max(1, math.ceil(acdc_multiple * ACDC_TRAINING_PIXELS / base.image[:, 0].numel()))
    s, n = base.num_slices, len(base.scans)
    image = torch.empty((copies * s, *base.image.shape[1:]), dtype=torch.float32,
                        pin_memory=torch.cuda.is_available())
    g = torch.Generator().manual_seed(seed)
    gammas = torch.exp(torch.empty(copies).uniform_(math.log(0.7), math.log(1.4), generator=g))
    source = base.image.clamp_min(0)
    for c in range(copies):
        copy = source ** float(gammas[c])
        image[c * s:(c + 1) * s] = copy.flip(-1) if c % 2 else copy
    offsets = torch.arange(copies).repeat_interleave(s) * n
    return replace(base, image=image, label=None, scan_index=base.scan_index.repeat(copies) + offsets,
                   slice_index=base.slice_index.repeat(copies), partition=base.partition.repeat(copies),
                   scans=[f"{name}#{c}" for c in range(copies) for name in base.scans], items=[], stream=None)


def gather_copy_ms(store, scans_per_batch: int, repeats: int = 20) -> float:
    """One batch's gather and copy on its own (synchronised), as the sampler asks for it, in ms."""
    from bim.data import PartitionBatchSampler

    batches = iter(PartitionBatchSampler(store, scans_per_batch, torch.Generator().manual_seed(1)))
    device = store.stream.device
    next(batches)
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        next(batches)
        _sync(device)
    return 1000 * (time.perf_counter() - t0) / repeats


def _timed_ms(fn, device):
    """``fn()`` and its wall time in ms, the device synchronised before and after."""
    _sync(device)
    t0 = time.perf_counter()
    value = fn()
    _sync(device)
    return value, 1000 * (time.perf_counter() - t0)


def stream_parts_ms(store, scans_per_batch: int, repeats: int = 20) -> dict:
    """Each part of one streamed batch on its own, synchronised, in ms (mean over ``repeats`` batches):
    ``sample_indices`` (the sampler's draw, CPU), ``host_gather`` (:meth:`bim.streaming.HostToDevice.gather`: the rows
    copied into the pinned staging buffers), ``host_gather_index_select`` (the same gather by ``torch.index_select``
    into the same buffers, as it was done before: its time grows with the OpenMP threads, see
    :func:`bim.streaming.gather_rows`), ``host_to_device`` (the staged batch copied to the GPU) and ``take`` (the
    whole :meth:`bim.data.SliceStore.take`: gather, copy on the side stream, stream wait)."""
    from bim.data import PartitionBatchSampler

    sampler = PartitionBatchSampler(store, scans_per_batch, torch.Generator().manual_seed(2))
    fields = {"image": "image", "partition": "partition", "scan": "scan_index"}
    sources = {key: getattr(store, name) for key, name in fields.items()}
    stream, device = store.stream, store.stream.device
    totals = dict.fromkeys(("sample_indices", "host_gather", "host_gather_index_select", "host_to_device", "take"), 0.0)
    for i in range(repeats + 1):  # the first batch allocates the buffers: not counted
        idx, t_sample = _timed_ms(sampler.sample_indices, device)
        staged, t_gather = _timed_ms(lambda: stream.gather(sources, idx), device)
        _, t_select = _timed_ms(lambda: [torch.index_select(sources[k], 0, idx, out=b) for k, b in staged.items()],
                                device)
        _, t_copy = _timed_ms(lambda: [b.to(device, non_blocking=True) for b in staged.values()], device)
        _, t_take = _timed_ms(lambda: store.take(idx, fields), device)
        if i:
            for key, ms in zip(totals, (t_sample, t_gather, t_select, t_copy, t_take)):
                totals[key] += ms / repeats
    return totals


def cpu_threads() -> dict:
    """What bounds this process's CPU work: PyTorch's intra-op threads, the cores the OS reports and those this
    process may run on, OMP_NUM_THREADS, and the container's CPU quota in cores (cgroup v2 ``cpu.max`` or v1
    ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``; None: no quota, or none readable)."""
    return {"torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
            "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "cpu_quota_cores": cpu_quota_cores()}


def cpu_quota_cores() -> float | None:
    """The cgroup CPU quota of this process in cores (quota / period), or None (no quota, or no cgroup files)."""
    v2, v1 = Path("/sys/fs/cgroup/cpu.max"), Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")
    try:
        if v2.is_file():
            quota, period = v2.read_text().split()[:2]
        elif v1.is_file():
            quota, period = v1.read_text().strip(), (v1.parent / "cpu.cfs_period_us").read_text().strip()
        else:
            return None
        return None if quota in ("max", "-1") else int(quota) / int(period)
    except (OSError, ValueError):
        return None


def main(dataset_dir: str | None = None, acdc_multiple: float = 20.0, size: int = 384, iterations: int = 200,
         warmup: int = 30, compile: bool = False, compile_mode: str | None = None, scans_per_batch: int = 6,
         crop_size: int = 224, num_subheads: int = 3, device_store: bool = True, out: str | None = None) -> None:
    from bim.flags import require_flags

    require_flags({"compile": compile, "device_store": device_store})
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    t0 = time.perf_counter()
    corpus = tile_corpus(base_store(dataset_dir, int(size)), float(acdc_multiple))
    built_s = time.perf_counter() - t0
    result = {"corpus": {"slices": corpus.num_slices, "scans": len(corpus.scans), "size": int(size),
                         "gb": corpus.nbytes / 1e9, "times_acdc": corpus.image[:, 0].numel() / ACDC_TRAINING_PIXELS,
                         "built_s": built_s},
              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "cpu": cpu_threads(),
              "torch": torch.__version__, "command": "python tools/benchmark_streaming.py " + " ".join(sys.argv[1:])}
    with tempfile.TemporaryDirectory() as work:
        overrides = bench_overrides(dataset_dir, work, warmup + iterations, scans_per_batch, crop_size, compile,
                                    compile_mode, num_subheads)
        if device_store:
            result["device_store"] = _time_trainer(overrides, iterations, warmup, store=corpus.to(device))
            gc.collect()  # the trainer and its store on the GPU go
            if device.type == "cuda":
                torch.cuda.empty_cache()
        streamed = corpus.placed(device, "host")
        result["host_stream"] = {**_time_trainer(overrides, iterations, warmup, store=streamed),
                                 "batch_gather_copy_ms": gather_copy_ms(streamed, scans_per_batch),
                                 "batch_parts_ms": stream_parts_ms(streamed, scans_per_batch)}
    if device_store:
        result["host_vs_device"] = result["host_stream"]["images_per_s"] / result["device_store"]["images_per_s"]
    report(result, out)


if __name__ == "__main__":
    fire.Fire(main)
