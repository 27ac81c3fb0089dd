"""Shared pytest setup: the repo root on sys.path and the location of ../shared (real test data)."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SHARED = Path(__file__).resolve().parents[2] / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.skip(f"real test data absent: {SHARED} not found (expected ../shared next to the repo)")
    return SHARED
