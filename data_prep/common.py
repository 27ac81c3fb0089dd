"""Shared helpers of data_prep: reading/validating volumes, resampling, normalisation, splits,
the datalist contract and the atomic output folder.

Only numpy and nibabel are imported here (no torch, no itk), so worker processes start fast.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

log = logging.getLogger("data_prep")

CREATED_BY = "data_prep"
# gzip level 1: on float32 slices level 1 is ~3x faster to write than nibabel's old default (9)
# and only a few percent larger (level 6/9 gain < 10 % on noisy float data).
GZIP_LEVEL = 1


class DataPrepError(ValueError):
    """One clear error about bad input (names the file and what was expected)."""


# ----------------------------------------------------------------------------------------- logging
def setup_logging(level: int = logging.INFO) -> None:
    if not log.handlers:
        h = logging.StreamHandler()
        h.setFormatter(logging.Formatter("[data_prep] %(message)s"))
        log.addHandler(h)
    log.setLevel(level)


# ----------------------------------------------------------------------------------------- reading
def nifti_stem(path: Path) -> str:
    name = Path(path).name
    for ext in (".nii.gz", ".nii", ".mhd"):
        if name.endswith(ext):
            return name[: -len(ext)]
    return Path(name).stem


def read_nifti(path: Path, what: str = "image") -> tuple[np.ndarray, tuple[float, ...], np.ndarray | None]:
    """Read a NIfTI file fully; returns (array, zooms, 4x4 voxel-to-world affine, None when the header
    has no world geometry: sform and qform codes 0). Raises DataPrepError when unreadable."""
    import nibabel as nib

    path = Path(path)
    if not path.is_file():
        raise DataPrepError(f"{path}: file not found; expected a NIfTI {what} (.nii or .nii.gz)")
    try:
        img = nib.load(str(path))
        arr = np.asanyarray(img.dataobj)
        zooms = tuple(float(z) for z in img.header.get_zooms())
        hdr = img.header
        placed = int(hdr["sform_code"]) > 0 or int(hdr["qform_code"]) > 0
        affine = np.asarray(img.affine, dtype=np.float64) if placed else None
    except Exception as e:  # nibabel raises many kinds (ImageFileError, EOFError, zlib.error, ...)
        raise DataPrepError(
            f"{path}: cannot read as NIfTI ({type(e).__name__}: {e}); expected a readable 3D NIfTI {what}"
        ) from None
    return np.asarray(arr), zooms, affine


def read_metaimage(path: Path, what: str = "image") -> tuple[np.ndarray, tuple[float, ...], np.ndarray]:
    """Read a MetaImage (.mhd) with itk; returns the array as (x, y, z), the spacing (x, y, z) and the
    4x4 index-to-world affine (direction x spacing, origin; itk's LPS world).

    itk is imported here only: the GPU machine has no itk.
    """
    path = Path(path)
    if not path.is_file():
        raise DataPrepError(f"{path}: file not found; expected a MetaImage {what} (.mhd + data file)")
    try:
        import itk  # noqa: PLC0415  (deliberately local)
    except ImportError as e:
        raise DataPrepError(f"{path}: reading MetaImage needs the 'itk' package ({e})") from None
    try:
        img = itk.imread(str(path))
        arr = np.asarray(itk.array_from_image(img))  # (z, y, x)
        spacing = tuple(float(s) for s in img.GetSpacing())  # (x, y, z)
        affine = np.eye(4)
        affine[:3, :3] = np.asarray(itk.array_from_matrix(img.GetDirection()), dtype=np.float64) @ np.diag(spacing)
        affine[:3, 3] = [float(o) for o in img.GetOrigin()]
    except Exception as e:
        raise DataPrepError(
            f"{path}: cannot read as MetaImage ({type(e).__name__}: {str(e).strip()[:300]}); "
            f"expected a readable 3D MetaImage {what}"
        ) from None
    if arr.ndim != 3:
        raise DataPrepError(f"{path}: {what} has {arr.ndim} dimensions {arr.shape}; expected a 3D volume")
    return np.ascontiguousarray(arr.transpose(2, 1, 0)), spacing, affine


def read_volume(path: Path, what: str = "image") -> tuple[np.ndarray, tuple[float, float, float], np.ndarray | None]:
    """Read .nii/.nii.gz/.mhd, check it is 3D; returns ((x, y, z) array, 3 spacings, 4x4 affine or None)."""
    path = Path(path)
    if path.name.endswith(".mhd"):
        arr, zooms, affine = read_metaimage(path, what)
    else:
        arr, zooms, affine = read_nifti(path, what)
    # drop trailing singleton dims (x, y, z, 1) but nothing else
    while arr.ndim > 3 and arr.shape[-1] == 1:
        arr = arr[..., 0]
    if arr.ndim != 3:
        raise DataPrepError(
            f"{path}: {what} has {arr.ndim} dimensions, shape {tuple(arr.shape)}; expected a 3D volume "
            "(x, y, slices)"
        )
    if min(arr.shape) < 1:
        raise DataPrepError(f"{path}: {what} is empty, shape {tuple(arr.shape)}; expected a 3D volume")
    zooms = tuple(zooms[:3]) + (1.0,) * max(0, 3 - len(zooms))
    zooms = tuple(z if np.isfinite(z) and z > 0 else 1.0 for z in zooms)
    return arr, zooms, affine  # type: ignore[return-value]


def check_image(arr: np.ndarray, path: Path) -> np.ndarray:
    if not np.issubdtype(arr.dtype, np.number) or np.iscomplexobj(arr):
        raise DataPrepError(f"{path}: image has dtype {arr.dtype}; expected real numbers")
    a = arr.astype(np.float32, copy=False)
    if not np.isfinite(a).all():
        n = int((~np.isfinite(a)).sum())
        raise DataPrepError(f"{path}: image contains {n} NaN/inf voxels; expected finite intensities")
    return a


def check_label(arr: np.ndarray, path: Path, allowed: Sequence[int]) -> np.ndarray:
    if not np.issubdtype(arr.dtype, np.number):
        raise DataPrepError(f"{path}: label has dtype {arr.dtype}; expected integer class values")
    if not np.issubdtype(arr.dtype, np.integer):
        if not np.isfinite(arr).all() or not np.all(arr == np.round(arr)):
            raise DataPrepError(f"{path}: label has non-integer values; expected integers in {list(allowed)}")
    values = np.unique(arr)
    bad = [v for v in values.tolist() if int(v) not in set(allowed)]
    if bad:
        raise DataPrepError(
            f"{path}: label values {sorted(int(b) if float(b).is_integer() else b for b in bad)[:10]} "
            f"outside the expected set {list(allowed)}"
        )
    return arr.astype(np.uint8)


# Two grids are "the same" when every image voxel centre lands within GRID_TOL voxels of a label voxel
# centre (NIfTI stores affines as float32: ~1e-7 relative, far below this).
GRID_TOL = 1e-3


def _grid(shape, affine) -> str:
    from nibabel.orientations import aff2axcodes

    zooms = np.sqrt((np.asarray(affine)[:3, :3] ** 2).sum(0))
    axes = "".join(aff2axcodes(affine))
    return (f"shape {tuple(int(n) for n in shape)}, voxel {tuple(round(float(z), 4) for z in zooms)} mm, "
            f"origin {tuple(round(float(o), 2) for o in np.asarray(affine)[:3, 3])} mm, axes {axes}")


def label_on_image_grid(lab: np.ndarray, lab_affine: np.ndarray | None, lab_path: Path,
                        img_shape: Sequence[int], img_affine: np.ndarray | None, img_path: Path) -> np.ndarray:
    """The label in the image's voxel grid, matched through both files' world geometry (affines).

    Same grid: as is. The same grid stored in another axis order or mirrored (a flipped axis with its
    affine flipped too): reoriented exactly. Another grid covering the image (other voxel size,
    shift, rotation): resampled nearest-neighbour. A label that does not cover every image voxel, or
    another shape where a file has no usable world geometry (affine None or singular): DataPrepError
    naming both files and both grids.
    """
    img_shape = tuple(int(n) for n in img_shape)
    vox = None
    if lab_affine is not None and img_affine is not None:
        with np.errstate(all="ignore"):
            try:
                vox = np.linalg.inv(np.asarray(lab_affine, np.float64)) @ np.asarray(img_affine, np.float64)
            except np.linalg.LinAlgError:
                pass
    if vox is None or not np.isfinite(vox).all():
        if tuple(lab.shape) == img_shape:
            log.info("%s: label or image %s has no usable world geometry (affine); the label is taken on the "
                     "image's voxel grid (same shape)", lab_path, img_path)
            return lab
        raise DataPrepError(
            f"{lab_path}: label shape {tuple(lab.shape)} does not match image shape {img_shape} of {img_path}, "
            "and the label or the image has no usable world geometry (NIfTI sform/qform codes 0, or a singular "
            "affine) to place one on the other; expected the same voxel grid"
        )
    if tuple(lab.shape) == img_shape and np.abs(vox - np.eye(4)).max() <= GRID_TOL:
        return lab
    rot, shift = vox[:3, :3], vox[:3, 3]
    # label voxel coordinates of the image voxel centres, one image slice (last axis) at a time
    ii, jj = np.meshgrid(np.arange(img_shape[0]), np.arange(img_shape[1]), indexing="ij")
    plane = rot[:, :2] @ np.stack([ii.ravel(), jj.ravel()]).astype(np.float64)
    out = np.empty(img_shape, dtype=lab.dtype)
    outside = 0
    hi = np.asarray(lab.shape, np.float64)[:, None] - 0.5
    for k in range(img_shape[2]):
        c = plane + (rot[:, 2] * k + shift)[:, None]
        inside = ((c >= -0.5 - GRID_TOL) & (c <= hi + GRID_TOL)).all(0)
        outside += int((~inside).sum())
        idx = np.clip(np.floor(c + 0.5).astype(np.intp), 0, np.asarray(lab.shape)[:, None] - 1)
        out[:, :, k] = lab[idx[0], idx[1], idx[2]].reshape(img_shape[:2])
    if outside:
        raise DataPrepError(
            f"{lab_path}: label grid ({_grid(lab.shape, lab_affine)}) does not cover the image {img_path} "
            f"({_grid(img_shape, img_affine)}): {outside} of {int(np.prod(img_shape))} image voxels lie outside "
            "the label; expected a label on the image's voxel grid (or the same grid in another axis order "
            "or mirrored, or a grid covering the whole image)"
        )
    exact = np.abs(rot - np.round(rot)).max() <= GRID_TOL and np.abs(shift - np.round(shift)).max() <= GRID_TOL
    if exact and (np.abs(np.round(rot)).sum(0) == 1).all() and (np.abs(np.round(rot)).sum(1) == 1).all():
        log.info("%s: label stored in another axis order or mirrored (%s); reoriented exactly onto %s (%s)",
                 lab_path, _grid(lab.shape, lab_affine), img_path, _grid(img_shape, img_affine))
    else:
        log.info("%s: label on another grid (%s); resampled nearest-neighbour onto %s (%s)",
                 lab_path, _grid(lab.shape, lab_affine), img_path, _grid(img_shape, img_affine))
    return out


# ------------------------------------------------------------------------------------- processing
def percentile_normalise(img: np.ndarray, path: Path, lo: float = 1.0, hi: float = 99.0) -> np.ndarray:
    """Map the scan's own 1 % / 99 % percentiles to [0, 1] and clip."""
    p_lo, p_hi = np.percentile(img, [lo, hi])
    if not p_hi > p_lo:
        if float(img.max()) == float(img.min()):
            raise DataPrepError(f"{path}: image is constant ({float(img.min())}); expected varying intensities")
        p_lo, p_hi = float(img.min()), float(img.max())  # very sparse images: fall back to min/max
    out = (img.astype(np.float32) - np.float32(p_lo)) / np.float32(p_hi - p_lo)
    np.clip(out, 0.0, 1.0, out=out)
    return out


def _axis_coords(n_in: int, n_out: int, scale: float):
    """Source coordinates for output pixel centres (pixel-centre aligned); scale = out step / in step."""
    src = (np.arange(n_out, dtype=np.float64) + 0.5) * scale - 0.5
    return src


def resample_inplane(vol: np.ndarray, out_shape: tuple[int, int], scale: tuple[float, float], order: int) -> np.ndarray:
    """Resample the first two axes of (X, Y, Z) `vol` to `out_shape`.

    `scale[i]` = output pixel size / input pixel size along axis i (pixel centres aligned at the
    volume's corner convention of align_corners=False). order 0: nearest, 1: bilinear. Vectorised
    numpy (separable linear interpolation), slices kept.
    """
    if order == 0:
        ix = np.clip(np.floor(_axis_coords(vol.shape[0], out_shape[0], scale[0]) + 0.5).astype(np.intp), 0, vol.shape[0] - 1)
        iy = np.clip(np.floor(_axis_coords(vol.shape[1], out_shape[1], scale[1]) + 0.5).astype(np.intp), 0, vol.shape[1] - 1)
        return vol[ix][:, iy]
    out = vol.astype(np.float32, copy=False)
    for axis in (0, 1):
        n_in = out.shape[axis]
        src = np.clip(_axis_coords(n_in, out_shape[axis], scale[axis]), 0, n_in - 1)
        i0 = np.floor(src).astype(np.intp)
        i1 = np.minimum(i0 + 1, n_in - 1)
        w = (src - i0).astype(np.float32)
        a0 = np.take(out, i0, axis=axis)
        a1 = np.take(out, i1, axis=axis)
        shape = [1, 1, 1]
        shape[axis] = -1
        w = w.reshape(shape)
        out = a0 + (a1 - a0) * w
    return out


def crop_or_pad(vol: np.ndarray, centre: tuple[float, float], size: int, fill=0) -> np.ndarray:
    """Take a size x size window (first two axes) centred (coarsely) on `centre`, padding with fill."""
    out = np.full((size, size) + vol.shape[2:], fill, dtype=vol.dtype)
    starts = [int(round(c - size / 2.0)) for c in centre]
    src_sl, dst_sl = [], []
    for ax, s in enumerate(starts):
        n = vol.shape[ax]
        a, b = max(s, 0), min(s + size, n)
        if b <= a:  # window completely outside (cannot happen with centres inside the volume)
            a, b = 0, 0
        src_sl.append(slice(a, b))
        dst_sl.append(slice(a - s, a - s + (b - a)))
    out[dst_sl[0], dst_sl[1]] = vol[src_sl[0], src_sl[1]]
    return out


def label_centre(label: np.ndarray | None, shape: tuple[int, ...]) -> tuple[float, float]:
    if label is not None:
        fg = np.nonzero(label > 0)
        if fg[0].size:
            return float(fg[0].mean()), float(fg[1].mean())
    return (shape[0] - 1) / 2.0 + 0.5, (shape[1] - 1) / 2.0 + 0.5


def slice_partition(num_slices: int, num_partitions: int) -> list[int]:
    return [int(i * num_partitions // num_slices) for i in range(num_slices)]


def save_nifti(arr: np.ndarray, spacing: Sequence[float], path: Path) -> None:
    import nibabel as nib

    nib.openers.Opener.default_compresslevel = GZIP_LEVEL
    affine = np.diag([float(spacing[0]), float(spacing[1]), float(spacing[2]), 1.0])
    img = nib.Nifti1Image(arr, affine)
    img.header.set_xyzt_units("mm")
    img.header.set_sform(affine, code=1)
    img.header.set_qform(affine, code=1)
    nib.save(img, str(path))


# ------------------------------------------------------------------------------------------ splits
def split_counts(n: int, val_frac: float, test_frac: float) -> tuple[int, int, int]:
    """(train, val, test) counts: proportional, >= 1 val and >= 1 test when n >= 3."""
    n_val = int(round(n * val_frac))
    n_test = int(round(n * test_frac))
    if n >= 3:
        n_val, n_test = max(1, n_val), max(1, n_test)
    else:
        n_val, n_test = 0, 0
    while n - n_val - n_test < 1 and n_test + n_val > 0:  # keep at least one training patient
        if n_test >= n_val and n_test > 1:
            n_test -= 1
        elif n_val > 1:
            n_val -= 1
        else:
            break
    return n - n_val - n_test, n_val, n_test


def stratified_split(groups: dict[str, str], val_frac: float, test_frac: float, seed: int) -> dict[str, list[str]]:
    """Split ids (keys of `groups`) into training/validation/test, stratified by group, seeded.

    Each id gets a position (k + u) / n_group inside its shuffled group (u uniform), ids are ordered
    by it, so any prefix holds the groups in proportion; test takes the first ids, validation the next.
    """
    ids = sorted(groups)
    _, n_val, n_test = split_counts(len(ids), val_frac, test_frac)
    rng = np.random.default_rng([int(seed), 20240611])
    by_group: dict[str, list[str]] = {}
    for i in ids:
        by_group.setdefault(str(groups[i]), []).append(i)
    keyed = []
    for g in sorted(by_group):
        members = list(by_group[g])
        perm = rng.permutation(len(members))
        offs = rng.uniform(0, 1)
        for k, j in enumerate(perm):
            keyed.append(((k + offs) / len(members), rng.uniform(), members[j]))
    order = [k[2] for k in sorted(keyed)]
    test = sorted(order[:n_test])
    val = sorted(order[n_test : n_test + n_val])
    train = sorted(order[n_test + n_val :])
    return {"training": train, "validation": val, "test": test}


def nested_draw(candidates: Sequence[str], count: int, seed: int, salt: int = 0) -> list[str]:
    """Seeded ordered draw of `count` distinct candidates (nested: prefixes are the smaller sets)."""
    rng = np.random.default_rng([int(seed), 7919, int(salt)])
    cand = sorted(candidates)
    perm = rng.permutation(len(cand))[:count]
    return [cand[i] for i in perm]


def _at_least(minimum) -> str:
    return "" if minimum is None else f" >= {minimum}"


def parse_int(value, name: str, minimum: int | None = None) -> int:
    """An integer option (fire hands over ints, floats or strings); DataPrepError naming --name otherwise."""
    v = None
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        v = int(value)
    elif isinstance(value, (float, np.floating)) and float(value).is_integer():
        v = int(value)
    elif isinstance(value, str):
        try:
            v = int(value.strip())
        except ValueError:
            pass
    if v is None or (minimum is not None and v < minimum):
        raise DataPrepError(f"--{name}: expected an integer{_at_least(minimum)}, got {value!r}")
    return v


def parse_int_list(value, name: str, minimum: int | None = None) -> list[int]:
    """fire gives '0,1,2' as a tuple, an int, or a string: accept all."""
    if value is None:
        return []
    if isinstance(value, str):
        parts = [p for p in value.replace(" ", "").split(",") if p]
    elif isinstance(value, (list, tuple)):
        parts = list(value)
    else:
        parts = [value]
    try:
        return [parse_int(p, name, minimum) for p in parts]
    except DataPrepError:
        raise DataPrepError(
            f"--{name}: expected comma-separated integers{_at_least(minimum)}, got {value!r}"
        ) from None


_TRUE, _FALSE = ("true", "yes", "1"), ("false", "no", "0")


def parse_bool(value, name: str) -> bool:
    """A boolean option: True/False, or the strings true/false, yes/no, 1/0 (any case)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)) and int(value) in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise DataPrepError(f"--{name}: expected true or false, got {value!r}")


def parse_prepare_options(seeds, size, split_seed, workers, overwrite) -> tuple[list[int], int, int, int, bool]:
    """The options every challenge layout's ``prepare`` takes, checked: (seeds >= 0, size >= 8, split_seed >= 0,
    workers >= 1, overwrite); DataPrepError naming the option otherwise."""
    return (parse_int_list(seeds, "seeds", 0), parse_int(size, "size", 8), parse_int(split_seed, "split_seed", 0),
            parse_int(workers, "workers", 1), parse_bool(overwrite, "overwrite"))


# ---------------------------------------------------------------------------------------- datalist
def make_datalist(
    *,
    dataset: str,
    source: Path,
    num_partitions: int,
    size: int,
    labels: dict[str, str],
    split_name: str,
    items: dict[str, dict],
    split: dict[str, list[str]],
    labelled: dict[str, list[str]],
    key_of: Callable[[dict], str] = lambda it: it["scan"],
    extra: dict | None = None,
) -> dict:
    """Assemble the datalist. `split` maps training/validation/test to lists of item keys (usually
    patients: all scans of a patient go together); `labelled` maps labelled_seedS_K to scan ids."""
    by_patient: dict[str, list[dict]] = {}
    for it in items.values():
        by_patient.setdefault(it["patient"], []).append(it)
    out = {
        "dataset": dataset,
        "created_by": CREATED_BY,
        "source": str(Path(source).resolve()),
        "num_partitions": int(num_partitions),
        "spatial_size": [int(size), int(size)],
        "labels": labels,
        "split": split_name,
    }
    if extra:
        out.update(extra)
    for key in ("training", "validation", "test"):
        lst = []
        for p in split.get(key, []):
            lst.extend(sorted(by_patient.get(p, []), key=lambda it: it["scan"]))
        out[key] = [dict(it) for it in lst]
    for key in sorted(labelled, key=_labelled_sort_key):
        out[key] = [dict(items[s]) for s in labelled[key]]
    return out


def _labelled_sort_key(k: str):
    try:
        s, n = k[len("labelled_seed") :].split("_")
        return (int(s), int(n))
    except ValueError:
        return (1 << 30, 0)


def labelled_key(seed: int, count: int) -> str:
    return f"labelled_seed{int(seed)}_{int(count)}"


def write_json(obj, path: Path) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")


# ---------------------------------------------------------------------------------- atomic output
def _existing_dataset(dst: Path) -> dict | None:
    p = dst / "datalist.json"
    if not p.is_file():
        return None
    try:
        with open(p) as f:
            d = json.load(f)
        return d if isinstance(d, dict) else {}
    except (OSError, ValueError):
        return {}


def check_destination(dst: Path, dataset: str, source: Path | None, overwrite: bool) -> None:
    dst = Path(dst)
    if not dst.exists() or overwrite:
        return
    if not dst.is_dir():
        raise DataPrepError(f"{dst}: exists and is not a folder; expected a new or data_prep output folder")
    if not any(dst.iterdir()):
        return
    old = _existing_dataset(dst)
    if old is None:
        raise DataPrepError(
            f"{dst}: folder is not empty and holds no datalist.json (not a data_prep output); "
            "refusing to write into it (pass --overwrite to replace it)"
        )
    want_src = str(Path(source).resolve()) if source is not None else None
    if old.get("dataset") != dataset or (want_src is not None and old.get("source") != want_src):
        raise DataPrepError(
            f"{dst / 'datalist.json'}: holds dataset {old.get('dataset')!r} from {old.get('source')!r}; "
            f"expected {dataset!r} from {want_src!r} (pass --overwrite to replace it)"
        )


def check_inputs_kept(dst: Path, inputs: Sequence, overwrite: bool) -> None:
    """Refuse a DST whose replacement would delete input data: DST is an input, contains one, or (with
    --overwrite) is an existing folder inside one that is no data_prep output."""
    d = Path(dst).absolute().resolve()
    for given in inputs:
        if given is None:
            continue
        src = Path(given).absolute().resolve()
        if d == src:
            raise DataPrepError(
                f"{dst}: the destination is the input {given}; writing the prepared set there would delete the "
                "raw data; expected a DST outside the input"
            )
        if d in src.parents:
            raise DataPrepError(
                f"{dst}: the destination contains the input {given}; replacing it would delete the raw data; "
                "expected a DST outside the input"
            )
        ours = (_existing_dataset(d) or {}).get("created_by") == CREATED_BY
        if overwrite and src in d.parents and d.exists() and not ours:
            raise DataPrepError(
                f"{dst}: lies inside the input {given} and is no data_prep output; --overwrite would delete it "
                f"with whatever raw data it holds; expected a DST outside the input (or remove {dst} yourself first)"
            )


TEMP_OWNER = ".data_prep_owner"  # inside a temporary folder: the host whose process <pid> writes it


def _process_start(pid: int) -> float | None:
    """Start time (epoch seconds, rounded down by up to 1 s) of process `pid`, or None where unknown."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        if fields[0] == "Z":  # a zombie: finished
            return float("inf")
        btime = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                     if line.startswith("btime "))
        return btime + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def _may_own(pid: int, since: float) -> bool:
    """Whether process `pid` of this host runs and could have written something last modified at
    `since` (it started before; a later start means the pid was reused)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: it exists (another user's)
        pass
    start = _process_start(pid)
    return start is None or start <= since + 1.0


def remove_stale_temps(dst: Path) -> None:
    """Remove DST.tmp-<pid>[-...] (and DST.old-<pid> while DST exists) left by killed runs: folders of
    this host whose process no longer runs. Never one of a running process or of another host."""
    dst = Path(dst).absolute()
    if not dst.parent.is_dir():
        return
    pattern = re.compile(rf"^{re.escape(dst.name)}\.(tmp|old)-(\d+)(-[^/]*)?$")
    host = socket.gethostname()
    for p in dst.parent.iterdir():
        m = pattern.match(p.name)
        if not m or p.is_symlink() or not p.is_dir() or int(m.group(2)) == os.getpid():
            continue
        try:
            owner = (p / TEMP_OWNER).read_text().strip()
        except OSError:
            owner = host  # none written (an older data_prep, or an .old folder): this host's
        if owner != host:
            log.info("%s: temporary folder of host %s left alone (its process cannot be checked here)", p, owner)
            continue
        pid = int(m.group(2))
        try:
            if _may_own(pid, p.stat().st_mtime):
                continue
        except OSError:
            continue
        if m.group(1) == "old" and not dst.exists():
            log.warning("%s: the previous %s of a killed run, kept (rename it back if you want it)", p, dst.name)
            continue
        shutil.rmtree(p, ignore_errors=True)
        log.info("removed %s, left by process %d, which no longer runs", p, pid)


def new_temp_dir(dst: Path, unique: bool = False) -> Path:
    """A new temporary sibling DST.tmp-<pid> (unique: DST.tmp-<pid>-<random>) marked with this host;
    stale ones of killed runs are removed first. `finish_temp_dir` renames it to DST."""
    dst = Path(dst).absolute()
    dst.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(dst)
    if unique:
        tmp = Path(tempfile.mkdtemp(prefix=f"{dst.name}.tmp-{os.getpid()}-", dir=dst.parent))
    else:
        tmp = dst.parent / f"{dst.name}.tmp-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    (tmp / TEMP_OWNER).write_text(socket.gethostname() + "\n")
    return tmp


def finish_temp_dir(tmp: Path, dst: Path, replace: bool = True) -> None:
    """Drop the owner mark and rename `tmp` to `dst` (replace: an existing `dst` is swapped out)."""
    (Path(tmp) / TEMP_OWNER).unlink(missing_ok=True)
    if replace:
        replace_dir(Path(tmp), Path(dst))
    else:
        os.rename(tmp, dst)


@contextmanager
def temp_output(dst: Path):
    """Yield a temporary sibling folder DST.tmp-<pid>; rename it to DST on success, remove it on error."""
    dst = Path(dst).absolute()
    tmp = new_temp_dir(dst)
    try:
        yield tmp
        finish_temp_dir(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextmanager
def atomic_output(dst: Path, dataset: str, source: Path | None, overwrite: bool, inputs: Sequence = ()):
    """Check DST (see check_destination; `inputs`, the folders/files read, must survive), then yield a
    temporary sibling folder renamed to DST on success and removed on error."""
    dst = Path(dst).absolute()
    check_inputs_kept(dst, inputs, overwrite)
    check_destination(dst, dataset, source, overwrite)
    with temp_output(dst) as tmp:
        yield tmp


def replace_dir(tmp: Path, dst: Path) -> None:
    if dst.exists():
        old = dst.parent / f"{dst.name}.old-{os.getpid()}"
        if old.exists():
            shutil.rmtree(old)
        os.rename(dst, old)
        os.rename(tmp, dst)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, dst)


# -------------------------------------------------------------------------------------- parallel map
def parallel_map(fn, jobs: list, workers: int | None = None) -> list:
    """Map `fn` over `jobs` with a process pool (default 2 workers, capped by CPUs and job count)."""
    if workers is None:
        workers = 2
    workers = max(1, min(int(workers), os.cpu_count() or 1, len(jobs)))
    if workers <= 1 or len(jobs) <= 2:
        return [fn(j) for j in jobs]
    import multiprocessing as mp

    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    with ctx.Pool(workers) as pool:
        return pool.map(fn, jobs, chunksize=1)

