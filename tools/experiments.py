#!/usr/bin/env python
"""The experiment runner's command line: ``python tools/experiments.py COMMAND`` (see tools/experiments/cli.py)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from experiments.cli import main  # noqa: E402  (the package tools/experiments/)

main()
