"""Shared pytest setup: the location of ../shared (real test data) and the demo data set."""

import functools
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.skip(f"real test data absent: {SHARED} not found (expected ../shared next to the repo)")
    return SHARED


@pytest.fixture(scope="session")
def demo_dataset(tmp_path_factory) -> Path:
    """The embedded synthetic demo data set (ACDC-like, 128 x 128), prepared once per test session."""
    from data_prep import ensure_demo_dataset

    return Path(ensure_demo_dataset(tmp_path_factory.mktemp("demo") / "demo_acdc"))


@pytest.fixture
def compile_without_codegen(monkeypatch):
    """``torch.compile`` traces as it does for a GPU run (TorchDynamo's graphs and guards, AOT autograd's forward and
    backward) and runs the traced graphs eagerly (backend ``aot_eager``, ``mode`` dropped), instead of spending a
    minute of a CPU on inductor's C++ code. What the tests that use it check is ours: that a step traces into graphs
    that give the eager numbers and are not re-traced when the LR changes; inductor's code generation is torch's."""
    import torch

    real = torch.compile

    def compile_graphs_only(model=None, *, mode=None, backend=None, **kwargs):
        return real(model, backend="aot_eager", **kwargs)

    monkeypatch.setattr(torch, "compile", compile_graphs_only)
    return compile_graphs_only
