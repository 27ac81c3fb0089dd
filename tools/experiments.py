#!/usr/bin/env python
"""The experiment runner's command line: ``python tools/experiments.py COMMAND --help``. The code is the package
``tools/experiments/`` beside this file (a package wins over a module of the same name on the import path)."""
from experiments.cli import main

main()
