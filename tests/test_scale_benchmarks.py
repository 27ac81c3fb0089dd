"""The scaling and streaming benchmarks run on a CPU in a smoke mode: one JSON line each, with the fields that the
GPU runs report (their numbers are measured on GPUs, not here)."""

from __future__ import annotations

import json
import subprocess
import sys

from bundle_helpers import ROOT

TINY = ["--iterations", "2", "--warmup", "1", "--scans_per_batch", "1", "--crop_size", "64", "--num_subheads", "1"]


def _run(script: str, *args: str) -> dict:
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / script), *TINY, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])  # the last line of stdout, the bundle's log above it


def test_benchmark_pretrain_times_one_and_two_processes_with_the_same_per_process_batch(demo_dataset, tmp_path):
    result = _run("benchmark_pretrain.py", "--dataset_dir", str(demo_dataset), "--output_dir", str(tmp_path),
                  "--scaling", "1,2")
    rows = result["scaling"]
    assert [r["gpus"] for r in rows] == [1, 2] and rows[0]["speedup"] == 1.0
    for r in rows:
        assert r["images_per_s_total"] > 0 and r["images_per_s_per_gpu"] * r["gpus"] == r["images_per_s_total"]
        assert r["scaling_efficiency"] == r["speedup"] / r["gpus"] and len(r["gpu_busy"]) == r["gpus"]
    assert result["settings"]["scans_per_batch"] == 1 and result["device"] == "cpu"


def test_benchmark_streaming_trains_on_the_same_batches_from_the_host_and_from_the_device(demo_dataset):
    result = _run("benchmark_streaming.py", "--dataset_dir", str(demo_dataset), "--acdc_multiple", "0.01",
                  "--size", "64")
    corpus = result["corpus"]
    assert corpus["times_acdc"] >= 0.01 and corpus["scans"] > 34  # the demo's 34 training scans, repeated
    device, host = result["device_store"], result["host_stream"]
    assert device["final_loss"] == host["final_loss"]  # the same batches, the same computation on a CPU
    assert host["images_per_s"] > 0 and host["batch_gather_copy_ms"] > 0
    assert result["host_vs_device"] == host["images_per_s"] / device["images_per_s"]
