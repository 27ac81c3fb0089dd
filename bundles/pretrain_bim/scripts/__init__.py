"""The pretrain_bim bundle's scripts: its folder, so the configs resolve paths relative to the bundle.

The bundle's code is the `bim` package (`pip install -e .` from the repository root); a bundle exported with
`python -m bim.export_bundle pretrain_bim` carries a copy of it in `scripts/bim`.
"""

from pathlib import Path


def bundle_root() -> str:
    """This bundle's folder (`monai.bundle run` puts it on the import path, which makes this package importable)."""
    return Path(__file__).resolve().parents[1].as_posix()
