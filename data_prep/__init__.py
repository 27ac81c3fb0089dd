"""data_prep: turn raw ACDC / PROMISE12 / NIfTI folders (or synthetic phantoms) into the prepared
2D-slice data sets the BIM bundles read (DST/images, DST/labels, DST/datalist.json).

Light to import (numpy + json only); heavy readers are imported where used.
"""

from __future__ import annotations

import json
from pathlib import Path

from .common import DataPrepError

__all__ = ["DataPrepError", "read_datalist", "ensure_demo_dataset", "LIST_KEYS"]

LIST_KEYS = ("training", "validation", "test")


def read_datalist(dataset_dir, key: str) -> list[dict]:
    """Items of list `key` of DST/datalist.json with absolute "image"/"label" paths.

    Raises FileNotFoundError when there is no datalist.json and DataPrepError (a ValueError) when
    it is unreadable or lacks `key`, naming the file and what was expected.
    """
    d = Path(dataset_dir).expanduser()
    path = d / "datalist.json" if d.suffix != ".json" else d
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: not found; expected a data set prepared by data_prep "
            "(python -m data_prep acdc|promise12|nifti|demo SRC DST) with DST/datalist.json"
        )
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise DataPrepError(f"{path}: cannot read ({e}); expected the JSON datalist written by data_prep") from None
    if not isinstance(data, dict):
        raise DataPrepError(f"{path}: expected a JSON object with lists {', '.join(LIST_KEYS)}")
    if key not in data or not isinstance(data[key], list):
        labelled = sorted((k for k in data if k.startswith("labelled_")), key=_lab_key)
        raise DataPrepError(
            f"{path} has no key {key!r}; available lists: "
            f"{', '.join(k for k in LIST_KEYS if k in data) or 'none'}; available labelled subsets: "
            f"{', '.join(labelled) or 'none'}"
        )
    base = path.parent.resolve()
    out = []
    for it in data[key]:
        it = dict(it)
        for k in ("image", "label"):
            if k in it:
                it[k] = str(base / it[k])
        out.append(it)
    return out


def _lab_key(k: str):
    try:
        s, n = k[len("labelled_seed"):].split("_")
        return (int(s), int(n))
    except ValueError:
        return (1 << 30, 0)


def ensure_demo_dataset(path=None):
    """Return the prepared demo data set folder, generating it on first use (see data_prep.demo)."""
    from .demo import ensure_demo_dataset as _ensure

    return _ensure(path)
