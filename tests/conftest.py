"""Shared pytest setup: the location of ../shared (real test data) and the demo data set."""

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
