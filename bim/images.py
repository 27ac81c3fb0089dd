"""Small PNG helpers shared by the bundles' figure handlers (cluster panels, prediction panels)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .files import atomic_file


def gray_rgb(x: np.ndarray) -> np.ndarray:
    """A 2D array min-max scaled to an RGB uint8 grey image [H, W, 3]."""
    x = x.astype(np.float32)
    lo, hi = float(x.min()), float(x.max())
    x = (x - lo) / (hi - lo + 1e-8)
    return np.repeat((x * 255).astype(np.uint8)[..., None], 3, axis=-1)


def mask_outline(mask: np.ndarray) -> np.ndarray:
    """The pixels of a boolean 2D ``mask`` that touch a pixel outside it (4-neighbourhood): its outline."""
    m = np.pad(mask.astype(bool), 1)
    inner = m[1:-1, 1:-1] & m[:-2, 1:-1] & m[2:, 1:-1] & m[1:-1, :-2] & m[1:-1, 2:]
    return mask.astype(bool) & ~inner


def tile_rows(rows: list[list[np.ndarray]], frame: int = 2) -> np.ndarray:
    """RGB tiles [h, w, 3] of equal size as one image: a row of tiles per list, each tile framed by ``frame``
    black pixels."""
    return np.concatenate([
        np.concatenate([np.pad(t, ((frame, frame), (frame, frame), (0, 0))) for t in tiles], axis=1) for tiles in rows
    ], axis=0)


def save_png(rgb: np.ndarray, path: Path) -> Path:
    """Write an RGB uint8 array as PNG through :func:`~bim.files.atomic_file` (never half-written, mode 0644)."""
    from PIL import Image

    with atomic_file(path) as tmp:
        Image.fromarray(rgb).save(tmp, format="PNG")
    return Path(path)
