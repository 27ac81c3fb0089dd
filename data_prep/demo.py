"""The project's embedded demo data set: synthetic phantoms (DST/raw) prepared with `acdc` (DST)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from .common import DataPrepError, atomic_output, finish_temp_dir, log, new_temp_dir, parse_bool, parse_int

DEMO_PATIENTS = 20
DEMO_SIZE = 128
DEMO_SEED = 0


def build_into(out: Path, final: Path, num_patients: int, size: int, seed: int = DEMO_SEED) -> dict:
    from . import acdc, synthetic

    raw = Path(out) / "raw"
    synthetic.generate_into(raw, num_patients, seed)
    return acdc.prepare_into(raw, out, size=size, workers=2, source_label=Path(final) / "raw")


def prepare(dst, num_patients: int = DEMO_PATIENTS, size: int = DEMO_SIZE, seed: int = DEMO_SEED, overwrite=False) -> dict:
    dst = Path(dst).absolute()
    num_patients, size = parse_int(num_patients, "num_patients", 1), parse_int(size, "size", 8)
    seed, overwrite = parse_int(seed, "seed", 0), parse_bool(overwrite, "overwrite")
    with atomic_output(dst, "synthetic-acdc", dst / "raw", overwrite) as tmp:
        dl = build_into(tmp, dst, num_patients, size, seed)
    log.info("demo: wrote %d training / %d validation / %d test scans to %s",
             len(dl["training"]), len(dl["validation"]), len(dl["test"]), dst)
    return dl


def default_demo_dir() -> Path:
    env = os.environ.get("BIM_DEMO_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "bim_bundles" / "demo_acdc"


def _is_ready(path: Path) -> bool:
    try:
        with open(path / "datalist.json") as f:
            return json.load(f).get("dataset") == "synthetic-acdc"
    except (OSError, ValueError, AttributeError):
        return False


def ensure_demo_dataset(path=None) -> Path:
    """Return the prepared demo folder, generating it on first use.

    Safe when several processes call it at once: each builds into its own temporary sibling and
    renames it into place; a process that loses the rename race removes its copy and uses the winner's.
    """
    path = Path(path).expanduser().absolute() if path is not None else default_demo_dir().absolute()
    if _is_ready(path):
        return path
    if path.exists() and path.is_dir() and any(path.iterdir()):
        raise DataPrepError(
            f"{path}: exists but holds no demo datalist.json; expected the demo data set or an empty/absent "
            "folder (remove it or set BIM_DEMO_DIR elsewhere)"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = new_temp_dir(path, unique=True)
    try:
        build_into(tmp, path, DEMO_PATIENTS, DEMO_SIZE, DEMO_SEED)
        try:
            if path.is_dir() and not any(path.iterdir()):
                path.rmdir()
            finish_temp_dir(tmp, path, replace=False)
            log.info("demo data set generated at %s", path)
        except OSError:
            if not _is_ready(path):
                raise
            log.info("demo data set: another process finished first; using %s", path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not _is_ready(path):
        raise DataPrepError(f"{path}: demo data set generation did not leave a datalist.json")
    return path
