"""The scaling and streaming benchmarks run on a CPU in a smoke mode: one JSON line each, with the fields that the
GPU runs report (their numbers are measured on GPUs, not here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from bundle_helpers import ROOT, tool_in_process

TINY = ["--iterations", "2", "--warmup", "1", "--scans_per_batch", "1", "--crop_size", "64", "--num_subheads", "1"]


sys.path.insert(0, str(ROOT / "tools"))
import benchmark_pretrain  # noqa: E402


def _run_process(script: str, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / script), *TINY, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _run(script: str, *args: str) -> dict:
    proc = _run_process(script, *args)
    return json.loads(proc.stdout.strip().splitlines()[-1])  # the last line of stdout, the bundle's log above it


def _json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_benchmark_pretrain_times_one_and_two_processes_with_the_same_per_process_batch(demo_dataset, tmp_path):
    proc = _run_process("benchmark_pretrain.py", "--dataset_dir", str(demo_dataset), "--output_dir", str(tmp_path),
                        "--scaling", "1,2", "--run_timeout_s", "800")
    *per_count, result = _json_lines(proc.stdout)
    rows = result["scaling"]
    assert per_count == rows and result["failed"] == []  # each count's line printed as it finished, then all
    assert [r["gpus"] for r in rows] == [1, 2] and rows[0]["speedup"] == 1.0
    for r in rows:
        assert r["images_per_s_total"] > 0 and r["images_per_s_per_gpu"] * r["gpus"] == r["images_per_s_total"]
        assert r["scaling_efficiency"] == r["speedup"] / r["gpus"] and len(r["gpu_busy"]) == r["gpus"]
    assert result["settings"]["scans_per_batch"] == 1 and result["device"] == "cpu"
    # the workers' progress, echoed with their rank: where a run that hangs stopped
    for rank in ("0/2", "1/2"):
        assert f"[benchmark rank {rank} " in proc.stderr
    assert "warm-up done (1 steps), timing 2 steps" in proc.stderr and "timed steps done" in proc.stderr


def test_a_scaling_run_that_times_out_is_ended_and_the_counts_that_finished_are_reported(monkeypatch, capsys):
    """The 1-process run writes its result; the 2-process one hangs (a stand-in for a worker stuck in a collective):
    it is ended after run_timeout_s, its last lines are printed, and the 1-process line is reported twice, as it
    finished and at the end."""
    step = {"images_per_s_total": 10.0, "images_per_s_per_gpu": 10.0, "ms_per_step_ranks": [5.0], "gpu_busy_ranks": [None]}
    run = {"full_step": step, "settings": {"scans_per_batch": 1}, "device": "cpu"}

    def command(n, argv, out):
        finish = f"import json, pathlib; pathlib.Path({str(out)!r}).write_text({json.dumps(json.dumps(run))})"
        hang = "import time; print('waiting for the other rank', flush=True); time.sleep(600)"
        return [sys.executable, "-c", finish if n == 1 else hang]

    monkeypatch.setattr(benchmark_pretrain, "torchrun_command", command)
    monkeypatch.setattr(sys, "argv", ["benchmark_pretrain.py", "--scaling", "1,2", "--run_timeout_s", "3"])
    started = time.perf_counter()
    with pytest.raises(SystemExit) as stop:
        benchmark_pretrain.scaling_run("1,2", None, run_timeout_s=3)
    assert stop.value.code == 1 and time.perf_counter() - started < 60
    out, err = capsys.readouterr()
    first, result = _json_lines(out)
    assert first == result["scaling"][0] and first["gpus"] == 1 and first["speedup"] == 1.0
    assert result["failed"] == [{"gpus": 2, "error": "timed out after 3 s"}] and result["settings"] == run["settings"]
    assert "the run on 2 processes timed out after 3 s" in err and "waiting for the other rank" in err


def test_run_with_timeout_ends_the_command_and_the_processes_it_started(tmp_path):
    pid_file = tmp_path / "child.pid"
    script = ("import subprocess, sys, time, pathlib; "
              "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
              f"pathlib.Path({str(pid_file)!r}).write_text(str(child.pid)); print('started', flush=True); "
              "time.sleep(600)")
    code, tail = benchmark_pretrain.run_with_timeout([sys.executable, "-c", script], dict(os.environ), timeout_s=5)
    assert code is None and tail == ["started"]
    child = int(pid_file.read_text())
    deadline = time.time() + 20  # the grandchild is a zombie of nobody's until init reaps it: wait until it is gone
    while time.time() < deadline and _alive(child):
        time.sleep(0.2)
    assert not _alive(child)
    assert benchmark_pretrain.run_with_timeout([sys.executable, "-c", "print('ok')"], dict(os.environ), 60) == (0, ["ok"])


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, ended but not yet reaped, counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def test_the_bare_unet_is_the_trainers(demo_dataset, tmp_path):
    # the default trainer builds the authors' U-Net at the paper's widths: the bare U-Net is built the same way
    result = _run("benchmark_pretrain.py", "--dataset_dir", str(demo_dataset), "--output_dir", str(tmp_path))
    assert result["settings"]["unet_style"] == "authors"
    assert result["settings"]["features"] == [32, 64, 128, 256, 512, 32]
    bare = result["bare_unet_eager_bf16"]
    assert (bare["unet_style"], bare["features"]) == ("authors", [32, 64, 128, 256, 512, 32])
    # read from the network's weights, whatever wraps it: another style and widths are reported as they are
    from bim.pretrain.model import BIMClusterNet, BIMPretrainNet

    features = [8, 8, 16, 16, 32, 8]
    net = BIMPretrainNet(BIMClusterNet(num_clusters=4, num_subheads=1, features=features, unet_style="monai"))
    assert benchmark_pretrain.trained_unet(torch.compile(net)) == {"unet_style": "monai", "features": features}


def test_benchmark_streaming_trains_on_the_same_batches_from_the_host_and_from_the_device(demo_dataset):
    result = _run("benchmark_streaming.py", "--dataset_dir", str(demo_dataset), "--acdc_multiple", "0.01",
                  "--size", "64")
    corpus = result["corpus"]
    assert corpus["times_acdc"] >= 0.01 and corpus["scans"] > 34  # the demo's 34 training scans, repeated
    device, host = result["device_store"], result["host_stream"]
    assert device["final_loss"] == host["final_loss"]  # the same batches, the same computation on a CPU
    assert host["images_per_s"] > 0 and host["batch_gather_copy_ms"] > 0
    parts = host["batch_parts_ms"]  # each part of a streamed batch on its own
    assert set(parts) == {"sample_indices", "host_gather", "host_gather_index_select", "host_to_device", "take"}
    assert all(ms >= 0 for ms in parts.values()) and parts["host_gather"] > 0 and parts["take"] > 0
    cpu = result["cpu"]
    assert cpu["torch_threads"] >= 1 and cpu["cpu_count"] >= cpu["usable_cores"] >= 1
    assert result["host_vs_device"] == host["images_per_s"] / device["images_per_s"]


@pytest.mark.parametrize("bundle", ["finetune_seg", "meanteacher_seg"])
def test_benchmark_finetune_times_the_bundles_own_iteration_with_the_same_losses_for_the_same_seed(demo_dataset, bundle,
                                                                                                  tmp_path):
    """tools/benchmark_finetune.py builds the bundle's train#trainer (meanteacher_seg: with its mean_teacher variant)
    and times iterations after the warm-up; two runs with the bundle's seed see the same first losses, so two
    versions of a bundle can be compared on one run; ``--profile`` profiles the ``profile_steps`` iterations after the
    timed ones, which run unprofiled without it (the second run: same losses), and writes the operator table."""
    import benchmark_finetune

    kwargs = dict(bundle=bundle, dataset_dir=str(demo_dataset), iterations=6, warmup=2, features=[4, 4, 8, 8, 16, 4],
                  crop_size=32, profile_steps=2)
    table = tmp_path / "profile.txt"
    first = benchmark_finetune.measure(**kwargs)
    second = benchmark_finetune.measure(**kwargs, profile=str(table))
    assert "profile" not in first and second["profile"]["steps"] == 2 and second["profile"]["wall_s"] > 0
    assert second["profile"]["table"] == str(table) and "sorted by self_cpu_time_total" in table.read_text()
    assert "convolution" in table.read_text()  # the profiled iterations ran the network
    assert first["ms_per_iteration"] > 0 and first["iterations"] == 6
    assert first["labelled_per_iteration"] == 5
    assert first["unlabelled_per_iteration"] == (5 if bundle == "meanteacher_seg" else 0)
    assert len(first["first_losses"]) == 5 and all(0 < x < 10 for x in first["first_losses"])
    assert first["first_losses"] == second["first_losses"]
    if bundle == "meanteacher_seg":
        assert first["variant"] == "mean_teacher"
    with pytest.raises(SystemExit, match="--bundle must be one of"):
        benchmark_finetune.measure(bundle="pretrain_bim")
    with pytest.raises(SystemExit, match="--profile_steps must be >= 1 with --profile"):
        benchmark_finetune.measure(bundle=bundle, profile=str(table), profile_steps=0)


@pytest.mark.parametrize("method, unlabelled", [("mean_teacher", 2), ("supervised", 0)])
def test_benchmark_meanteacher_times_the_methods_step_and_counts_its_student_images(method, unlabelled, tmp_path,
                                                                                   capsys):
    """tools/benchmark_meanteacher.py in a CPU smoke mode: one JSON line; the student images per step count the
    unlabelled batch only for a method that uses it; the teacher is compiled only with --compile (as the bundle);
    --profile writes the operator table of the profiled steps."""
    table = tmp_path / "profile.txt"
    args = ["--method", method, "--batch_size", "2", "--unlabelled_batch_size", str(unlabelled), "--size", "32",
            "--iterations", "2", "--warmup", "1", "--features", "4,4,8,8,16,4", "--profile", str(table),
            "--profile_steps", "2"]
    if method == "mean_teacher":  # the command line
        proc = subprocess.run([sys.executable, str(ROOT / "tools" / "benchmark_meanteacher.py"), *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        stdout = proc.stdout
    else:  # the same flags in this process
        capsys.readouterr()
        tool_in_process("benchmark_meanteacher.py", *args)
        stdout = capsys.readouterr().out
    result = json.loads(stdout.strip().splitlines()[-1])
    assert result["method"] == method and result["ms_per_step"] > 0
    assert result["student_images_per_step"] == 2 + unlabelled
    assert result["compile"] is False and result["compile_teacher"] is False
    assert result["profile"]["table"] == str(table) and result["profile"]["profiled_ms_per_step"] > 0
    assert "aten::" in table.read_text()


def test_kernel_time_counts_each_kernel_once_and_no_annotation():
    """The GPU-busy share of a profile sums the device's own events: a CPU operator's device time (its kernels'
    again) and a user annotation spanning kernels (``## Call CompiledFxGraph``) are not added a second time."""
    from types import SimpleNamespace

    cpu, cuda = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA
    events = [SimpleNamespace(device_type=cpu, is_user_annotation=False, self_device_time_total=700.0),
              SimpleNamespace(device_type=cuda, is_user_annotation=False, self_device_time_total=500.0),
              SimpleNamespace(device_type=cuda, is_user_annotation=False, self_device_time_total=200.0),
              SimpleNamespace(device_type=cuda, is_user_annotation=True, self_device_time_total=650.0)]
    assert benchmark_pretrain.kernel_time_s(events) == pytest.approx(700e-6)


def test_benchmark_variant_times_the_step_of_that_table_row(demo_dataset, tmp_path, monkeypatch):
    # --variant adds configs/variants/NAME.json: the timed trainer computes only that row's losses
    overrides = benchmark_pretrain.bench_overrides(str(demo_dataset), str(tmp_path), 2, 1, 64, False, None, 1)
    weights = {}
    for variant in (None, "ours_mi_cc", "contrast_enc"):
        wf, trainer = benchmark_pretrain.build_trainer(overrides, variant=variant)
        weights[variant] = {k for k, w in trainer.loss_weights.items() if w}
        wf.finalize()
    assert weights == {None: {"mi", "cc", "con"}, "ours_mi_cc": {"mi", "cc"}, "contrast_enc": {"con"}}
    with pytest.raises(ValueError, match=r"variant: expected the name of a file in .*variants.*ours_mi_cc.*got 'ours'"):
        benchmark_pretrain.main(dataset_dir=str(demo_dataset), variant="ours")
    seen = {}

    def fake_time_trainer(*args, variant=None, **kwargs):  # what main hands the timed trainer, without timing it
        seen["variant"] = variant
        return {"channels_last": False, "cudnn_deterministic": True, "unet_style": "authors", "features": []}

    monkeypatch.setattr(benchmark_pretrain, "_time_trainer", fake_time_trainer)
    benchmark_pretrain.main(dataset_dir=str(demo_dataset), bare=False, variant="ours_mi", out=str(tmp_path / "b.json"))
    assert seen == {"variant": "ours_mi"}
    assert json.loads((tmp_path / "b.json").read_text())["settings"]["variant"] == "ours_mi"
