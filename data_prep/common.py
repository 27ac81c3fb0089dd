"""Shared helpers of data_prep: reading/validating volumes, resampling, normalisation, splits,
the datalist contract and the atomic output folder.

Only numpy and nibabel are imported here (no torch, no itk), so worker processes start fast.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
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


def read_nifti(path: Path, what: str = "image") -> tuple[np.ndarray, tuple[float, ...]]:
    """Read a NIfTI file fully; returns (array, zooms). Raises DataPrepError when unreadable."""
    import nibabel as nib

    path = Path(path)
    if not path.is_file():
        raise DataPrepError(f"{path}: file not found; expected a NIfTI {what} (.nii or .nii.gz)")
    try:
        img = nib.load(str(path))
        arr = np.asanyarray(img.dataobj)
        zooms = tuple(float(z) for z in img.header.get_zooms())
    except Exception as e:  # nibabel raises many kinds (ImageFileError, EOFError, zlib.error, ...)
        raise DataPrepError(
            f"{path}: cannot read as NIfTI ({type(e).__name__}: {e}); expected a readable 3D NIfTI {what}"
        ) from None
    return np.asarray(arr), zooms


def read_metaimage(path: Path, what: str = "image") -> tuple[np.ndarray, tuple[float, ...]]:
    """Read a MetaImage (.mhd) with itk; returns the array as (x, y, z) and the spacing (x, y, z).

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
    except Exception as e:
        raise DataPrepError(
            f"{path}: cannot read as MetaImage ({type(e).__name__}: {str(e).strip()[:300]}); "
            f"expected a readable 3D MetaImage {what}"
        ) from None
    if arr.ndim != 3:
        raise DataPrepError(f"{path}: {what} has {arr.ndim} dimensions {arr.shape}; expected a 3D volume")
    return np.ascontiguousarray(arr.transpose(2, 1, 0)), spacing


def read_volume(path: Path, what: str = "image") -> tuple[np.ndarray, tuple[float, float, float]]:
    """Read .nii/.nii.gz/.mhd, check it is 3D; returns ((x, y, z) array, 3 spacings)."""
    path = Path(path)
    if path.name.endswith(".mhd"):
        arr, zooms = read_metaimage(path, what)
    else:
        arr, zooms = read_nifti(path, what)
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
    return arr, zooms  # type: ignore[return-value]


def check_image(arr: np.ndarray, path: Path) -> np.ndarray:
    if not np.issubdtype(arr.dtype, np.number) or np.iscomplexobj(arr):
        raise DataPrepError(f"{path}: image has dtype {arr.dtype}; expected real numbers")
    a = arr.astype(np.float32, copy=False)
    if not np.isfinite(a).all():
        n = int((~np.isfinite(a)).sum())
        raise DataPrepError(f"{path}: image contains {n} NaN/inf voxels; expected finite intensities")
    return a


def check_label(arr: np.ndarray, path: Path, allowed: Sequence[int], image_shape=None, image_path=None) -> np.ndarray:
    if image_shape is not None and tuple(arr.shape) != tuple(image_shape):
        raise DataPrepError(
            f"{path}: label shape {tuple(arr.shape)} does not match image shape {tuple(image_shape)} "
            f"of {image_path}; expected the same voxel grid"
        )
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


def parse_int_list(value, name: str) -> list[int]:
    """fire gives '0,1,2' as a tuple, an int, or a string: accept all."""
    if value is None:
        return []
    if isinstance(value, (int, np.integer)):
        return [int(value)]
    if isinstance(value, str):
        parts = [p for p in value.replace(" ", "").split(",") if p]
    else:
        parts = list(value)
    try:
        return [int(p) for p in parts]
    except (TypeError, ValueError):
        raise DataPrepError(f"--{name}: expected comma-separated integers, got {value!r}") from None


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


@contextmanager
def atomic_output(dst: Path, dataset: str, source: Path | None, overwrite: bool):
    """Yield a temporary sibling folder DST.tmp-<pid>; rename it to DST on success, remove it on error."""
    dst = Path(dst).absolute()
    check_destination(dst, dataset, source, overwrite)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.parent / f"{dst.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        yield tmp
        replace_dir(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


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

