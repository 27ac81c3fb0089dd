"""Helpers for tests that run bundles: in-process ConfigWorkflow and the plain `monai.bundle run` command."""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUNDLES = ROOT / "bundles"


def purge_scripts_modules() -> None:
    """Each bundle has its own top-level ``scripts`` package: forget the one imported last."""
    for name in [m for m in sys.modules if m == "scripts" or m.startswith("scripts.")]:
        del sys.modules[name]


def workflow(bundle: str, config_files, workflow_type: str = "train", **overrides):
    """An initialised :class:`monai.bundle.ConfigWorkflow` of ``bundles/<bundle>``, with the bundle folder on
    ``sys.path`` as ``monai.bundle run`` (and MONAI Label) put it."""
    from monai.bundle import ConfigWorkflow

    purge_scripts_modules()
    root = str(BUNDLES / bundle)
    while root in sys.path:
        sys.path.remove(root)
    sys.path.insert(1, root)
    files = [str(BUNDLES / bundle / "configs" / f) for f in ([config_files] if isinstance(config_files, str) else config_files)]
    wf = ConfigWorkflow(config_file=files if len(files) > 1 else files[0], workflow_type=workflow_type, **overrides)
    wf.initialize()
    return wf


def run_workflow(bundle: str, config_files, workflow_type: str = "train", **overrides):
    """What ``monai.bundle run`` does with a bundle's configs (initialise, run, finalise), in this process: for runs
    whose point is the configs' work, not the command line, saving the start of a fresh interpreter. The bundle's
    ``scripts`` package is forgotten afterwards."""
    wf = workflow(bundle, config_files, workflow_type=workflow_type, **overrides)
    try:
        wf.run()
        wf.finalize()
    finally:
        purge_scripts_modules()
    return wf


def tool_in_process(script: str, *args) -> None:
    """``python tools/<script> args...`` in this process: its arguments parsed by fire as its ``__main__`` does (one
    start of python less; each tool's command line keeps a test of its own as a process)."""
    import importlib.util

    import fire

    tool = ROOT / "tools" / script
    spec = importlib.util.spec_from_file_location(f"_tool_{tool.stem}", tool)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fire.Fire(module.main, command=[str(a) for a in args], name=script)


@contextlib.contextmanager
def messages_of(logger_name: str):
    """The messages that the logger ``logger_name`` (and its children) handles meanwhile, as a list: what a run in this
    process logs, which pytest's ``caplog`` misses once a bundle's logging.conf has replaced the root's handlers."""
    said: list[str] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = lambda record: said.append(record.getMessage())
    logger = logging.getLogger(logger_name)
    logger.addHandler(handler)
    try:
        yield said
    finally:
        logger.removeHandler(handler)


def bundle_run_command(bundle: str, config_files, **overrides) -> list[str]:
    """The README's command line: ``python -m monai.bundle run --config_file ... --key value ...``."""
    files = [f"bundles/{bundle}/configs/{f}" for f in ([config_files] if isinstance(config_files, str) else config_files)]
    cfg = files[0] if len(files) == 1 else "[" + ",".join(f"'{f}'" for f in files) + "]"
    cmd = [sys.executable, "-m", "monai.bundle", "run", "--config_file", cfg]
    for k, v in overrides.items():
        cmd += [f"--{k}", str(v)]
    return cmd


def run_bundle(bundle: str, config_files, timeout: int = 900, **overrides) -> subprocess.CompletedProcess:
    """Run a bundle from the repository root in a fresh process; raise with its output if it fails."""
    proc = subprocess.run(
        bundle_run_command(bundle, config_files, **overrides), cwd=ROOT, capture_output=True, text=True,
        timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    if proc.returncode != 0:
        raise AssertionError(f"bundle {bundle} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc
