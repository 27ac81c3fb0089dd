"""CPU inference through ONNX Runtime (``SliceBatchInferer(cpu_backend=...)``, inference.json's ``cpu_backend``): the
same logits as torch's fp32 up to the rounding of a reordered sum, for every network the bundles infer with; a
network whose weights change is exported again; ``auto`` takes ONNX Runtime only where torch would run fp32."""

from __future__ import annotations

import logging

import pytest
import torch

import bim.inference
from bim.inference import SliceBatchInferer
from bim.network import build_unet
from bim.onnx_cpu import onnxruntime_available
from bim.pretrain.model import BIMClusterNet
from tolerance import assert_close_to_scale, conv_reduction_length

TINY = (8, 16, 16, 32, 32, 8)
needs_onnxruntime = pytest.mark.skipif(not onnxruntime_available(), reason="onnx and onnxruntime are not installed")


def _networks() -> dict:
    torch.manual_seed(0)
    return {"monai": build_unet(out_channels=3, features=TINY).eval(),
            "authors": build_unet(out_channels=3, features=TINY, unet_style="authors").eval(),
            "clusters": BIMClusterNet(num_clusters=5, num_subheads=2, features=TINY).eval()}


@needs_onnxruntime
@pytest.mark.parametrize("name", ["monai", "authors", "clusters"])
@pytest.mark.parametrize("shape", [(1, 1, 50, 70, 3), (1, 1, 96, 64, 2)])  # padded to 64 x 80; none padded
def test_onnxruntime_gives_torchs_fp32_logits(name, shape):
    net = _networks()[name]
    scan = torch.rand(*shape, generator=torch.Generator().manual_seed(1))
    inferer = SliceBatchInferer(max_slices=2, cpu_backend="onnxruntime")
    with torch.inference_mode():
        expected = SliceBatchInferer(max_slices=2)(scan, net)
        got = inferer(scan, net)
    assert inferer.runs_onnxruntime(net)
    assert got.dtype == torch.float32
    # both fp32; every output is a chain of convolution sums, each of up to conv_reduction_length terms, reordered
    assert_close_to_scale(got, expected, terms=conv_reduction_length(net), what=name)


@needs_onnxruntime
def test_a_network_whose_weights_change_is_exported_again():
    net = _networks()["monai"]
    scan = torch.rand(1, 1, 32, 32, 2)
    inferer = SliceBatchInferer(cpu_backend="onnxruntime")
    with torch.inference_mode():
        before = inferer(scan, net)
    with torch.no_grad():
        for p in net.parameters():
            p.mul_(1.5)
    with torch.inference_mode():
        after, expected = inferer(scan, net), SliceBatchInferer()(scan, net)
    assert not torch.allclose(after, before)
    assert_close_to_scale(after, expected, terms=conv_reduction_length(net))


@needs_onnxruntime
def test_an_inferer_keeps_the_onnx_copy_of_its_last_network_only():
    import gc
    import weakref

    inferer, scan = SliceBatchInferer(cpu_backend="onnxruntime"), torch.rand(1, 1, 32, 32, 1)
    first, second = _networks()["monai"], _networks()["authors"]
    with torch.inference_mode():
        inferer(scan, first)
        gone = weakref.ref(first)
        del first
        got, expected = inferer(scan, second), SliceBatchInferer()(scan, second)
    gc.collect()
    assert gone() is None  # a server that loads a new network frees the old one and its session
    assert inferer.runs_onnxruntime(second)
    assert_close_to_scale(got, expected, terms=conv_reduction_length(second))


@pytest.mark.parametrize("bf16, installed, expected", [(False, True, True), (True, True, False), (False, False, False)])
def test_auto_takes_onnxruntime_only_where_torch_would_run_fp32_and_it_is_installed(monkeypatch, bf16, installed,
                                                                                     expected):
    if installed and not onnxruntime_available():
        pytest.skip("onnx and onnxruntime are not installed")
    monkeypatch.setattr(bim.inference, "cpu_has_native_bf16", lambda: bf16)
    monkeypatch.setattr(bim.inference, "onnxruntime_available", lambda: installed)
    net = _networks()["monai"]
    inferer = SliceBatchInferer(cpu_bf16=True, cpu_backend="auto")
    if bf16:  # this CPU may have no bf16: the torch path must not run bf16 kernels here
        monkeypatch.setattr(bim.inference, "inference_autocast", lambda *a, **k: torch.autocast("cpu", enabled=False))
    with torch.inference_mode():
        inferer(torch.rand(1, 1, 32, 32, 2), net)
    assert inferer.runs_onnxruntime(net) is expected


@needs_onnxruntime
def test_auto_falls_back_to_torch_naming_the_cause_and_an_explicit_choice_raises(monkeypatch, caplog):
    def broken(self):
        raise RuntimeError("export refused")

    monkeypatch.setattr(bim.inference.OnnxRuntimeNetwork, "_export", broken)
    monkeypatch.setattr(bim.inference, "cpu_has_native_bf16", lambda: False)
    net, scan = _networks()["monai"], torch.rand(1, 1, 32, 32, 3)
    with torch.inference_mode():
        expected = SliceBatchInferer(max_slices=2)(scan, net)
        with caplog.at_level(logging.WARNING, logger="bim"):
            got = SliceBatchInferer(max_slices=2, cpu_backend="auto")(scan, net)
        with pytest.raises(RuntimeError, match="export refused"):
            SliceBatchInferer(cpu_backend="onnxruntime")(scan, net)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    warnings = [r.getMessage() for r in caplog.records if "ONNX Runtime could not run" in r.getMessage()]
    assert len(warnings) == 1 and "export refused" in warnings[0]  # once, though two chunks ran


def test_bad_backend_settings_are_refused_naming_the_key():
    with pytest.raises(ValueError, match="cpu_backend must be one of torch, onnxruntime, auto, got 'ort'"):
        SliceBatchInferer(cpu_backend="ort")
    with pytest.raises(ValueError, match="cpu_backend 'onnxruntime' needs divisor a multiple of 16, got 8"):
        SliceBatchInferer(divisor=8, cpu_backend="onnxruntime")
    if onnxruntime_available():
        with pytest.raises(ValueError, match="runs a torch.nn.Module called with the slices alone"):
            SliceBatchInferer(cpu_backend="onnxruntime")(torch.rand(1, 1, 16, 16, 1), lambda x: x)


def test_onnxruntime_asked_for_but_not_installed_names_the_packages(monkeypatch):
    import bim.onnx_cpu

    monkeypatch.setattr(bim.onnx_cpu, "onnxruntime_available", lambda: False)
    with pytest.raises(RuntimeError, match=r"cpu_backend 'onnxruntime' needs the packages onnx and onnxruntime"):
        with torch.inference_mode():
            SliceBatchInferer(cpu_backend="onnxruntime")(torch.rand(1, 1, 16, 16, 1), _networks()["monai"])


def test_a_bad_cpu_backend_on_the_command_line_names_the_choices():
    from bim.options import check_value

    assert check_value("cpu_backend", "ort", "auto") == (
        "cpu_backend must be one of 'torch', 'onnxruntime', 'auto' (default 'auto'), got 'ort'")
    assert check_value("cpu_backend", "onnxruntime", "auto") is None


def test_the_inference_benchmark_reports_the_backend_that_ran_and_the_first_run_apart(capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "tools" / "benchmark_inference.py"
    spec = importlib.util.spec_from_file_location("benchmark_inference", path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    tiny = dict(device="cpu", slices=2, size=32, warmup=1, runs=2, features=TINY, max_slices=2)
    for backend in ("torch", "auto"):
        result = tool.benchmark(cpu_backend=backend, **tiny)
        assert result["cpu_backend"] == backend and len(result["ms_all"]) == 2 and result["first_run_ms"] > 0
        # cpu_bf16 is off here, so torch would run fp32 on any CPU: auto takes ONNX Runtime wherever it is installed
        assert result["onnxruntime"] is (backend == "auto" and onnxruntime_available())
    with pytest.raises(ValueError, match="warmup must be >= 1"):
        tool.benchmark(cpu_backend="torch", **{**tiny, "warmup": 0})
    assert result["gflop_per_scan"] >= 0 and result["gflop_per_s"] >= 0
    # the count: a 3 x 3 convolution, 1 -> 4 channels, on 3 slices of 30 x 30 padded to 32 x 32, 2 FLOP a multiply-add
    conv = torch.nn.Conv2d(1, 4, 3, padding=1, bias=False)
    assert tool.scan_gflop(conv, torch.zeros(1, 1, 30, 30, 3)) == pytest.approx(2 * 32 * 32 * 4 * 9 * 3 / 1e9)
    capsys.readouterr()
