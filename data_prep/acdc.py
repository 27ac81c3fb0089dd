"""ACDC (challenge layout) -> prepared 2D-slice data set."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Sequence

from .common import (
    DataPrepError,
    atomic_output,
    log,
    make_datalist,
    parse_prepare_options,
    slice_partition,
    write_json,
)
from .scan import ScanJob, run_jobs
from .splits import ACDC_FRACTIONS, ACDC_REFERENCE, apply_split_file, load_split_file, seeded_split

ACDC_LABELS = {"0": "background", "1": "RV", "2": "Myo", "3": "LV"}
ACDC_COUNTS = (1, 2, 4)
ACDC_PARTITIONS = 3
SYNTHETIC_MARKER = "synthetic_phantoms.json"
LAYOUT = (
    "the ACDC challenge layout: SRC/training/patientNNN/ (or SRC/patientNNN/) holding Info.cfg "
    "(ED, ES, Group), patientNNN_frameYY.nii[.gz] and patientNNN_frameYY_gt.nii[.gz]"
)
_PID = re.compile(r"^patient\d+$")


def read_info(path: Path) -> dict:
    if not path.is_file():
        raise DataPrepError(f"{path}: missing Info.cfg; expected {LAYOUT}")
    info = {}
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise DataPrepError(f"{path}: cannot read Info.cfg ({e}); expected 'Key: value' lines") from None
    for line in text.splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            info[k.strip()] = v.strip()
    try:
        return {**info, "ED": int(float(info["ED"])), "ES": int(float(info["ES"])), "Group": str(info["Group"])}
    except (KeyError, ValueError):
        raise DataPrepError(
            f"{path}: Info.cfg lacks a valid ED, ES or Group line (found keys {sorted(info)}); "
            "expected lines like 'ED: 1', 'ES: 12', 'Group: DCM'"
        ) from None


def find_root(src: Path) -> Path:
    src = Path(src)
    if not src.is_dir():
        raise DataPrepError(f"{src}: not a folder; expected {LAYOUT}")
    if (src / "training").is_dir():
        root = src / "training"
    else:
        root = src
    if not any(p.is_dir() and _PID.match(p.name) for p in root.iterdir()):
        raise DataPrepError(f"{src}: no patientNNN folders found; expected {LAYOUT}")
    return root


def _frame_file(pdir: Path, pid: str, frame: int, gt: bool) -> Path:
    base = f"{pid}_frame{frame:02d}{'_gt' if gt else ''}"
    for ext in (".nii.gz", ".nii"):
        if (pdir / (base + ext)).is_file():
            return pdir / (base + ext)
    raise DataPrepError(f"{pdir / (base + '.nii.gz')}: file not found (nor .nii); expected {LAYOUT}")


def discover(src: Path) -> tuple[Path, list[dict]]:
    root = find_root(src)
    patients = []
    for pdir in sorted(p for p in root.iterdir() if p.is_dir() and _PID.match(p.name)):
        pid = pdir.name
        info = read_info(pdir / "Info.cfg")
        scans = {}
        for phase in ("ED", "ES"):
            scans[phase] = (_frame_file(pdir, pid, info[phase], False), _frame_file(pdir, pid, info[phase], True))
        patients.append({"patient": pid, "group": info["Group"], "scans": scans})
    return root, patients


def is_synthetic(root: Path) -> bool:
    return (root / SYNTHETIC_MARKER).is_file() or (root.parent / SYNTHETIC_MARKER).is_file()


def choose_split(patients, split, seeds, split_seed, synthetic) -> tuple[str, dict]:
    groups = {p["patient"]: p["group"] for p in patients}
    scans_of = {p["patient"]: [f"{p['patient']}_ED", f"{p['patient']}_ES"] for p in patients}
    if split is not None:
        d = load_split_file(Path(split))
        return f"file:{Path(split).resolve()}", apply_split_file(d, scans_of, str(split), seeds, ACDC_COUNTS, strict=True)
    if not synthetic and ACDC_REFERENCE.is_file():
        ref = load_split_file(ACDC_REFERENCE)
        ref_groups = ref.get("groups", {})
        if all(p in ref_groups and ref_groups[p] == g for p, g in groups.items()):
            res = apply_split_file(ref, scans_of, "reference", seeds, ACDC_COUNTS, strict=False)
            if res:
                log.info("using the reference split %s", ACDC_REFERENCE)
                return "reference", res
        log.info("source patients are not all in the reference split (or groups differ): seeded split %d", split_seed)
    return f"seeded:{int(split_seed)}", seeded_split(groups, scans_of, ACDC_FRACTIONS, split_seed, ACDC_COUNTS, seeds)


def prepare_into(
    src: Path,
    out_dir: Path,
    size: int = 384,
    split: str | None = None,
    seeds: Sequence[int] = (0, 1, 2),
    split_seed: int = 0,
    workers: int | None = 2,
    source_label: Path | None = None,
) -> dict:
    src = Path(src)
    root, patients = discover(src)
    synthetic = is_synthetic(root)
    split_name, sp = choose_split(patients, split, seeds, split_seed, synthetic)
    jobs = []
    meta = {}
    for p in patients:
        for phase, (img, lab) in p["scans"].items():
            scan = f"{p['patient']}_{phase}"
            jobs.append(ScanJob(scan, str(img), str(lab), str(out_dir), int(size), "spacing", (0, 1, 2, 3), 1.0))
            meta[scan] = {"patient": p["patient"], "group": p["group"], "phase": phase}
    log.info("acdc: %d patients, %d scans from %s", len(patients), len(jobs), root)
    res = run_jobs(jobs, workers)
    items = {}
    for scan, m in meta.items():
        r = res[scan]
        items[scan] = {
            "image": f"images/{scan}.nii.gz",
            "label": f"labels/{scan}.nii.gz",
            "scan": scan,
            "patient": m["patient"],
            "group": m["group"],
            "phase": m["phase"],
            "num_slices": r["num_slices"],
            "slice_partition": slice_partition(r["num_slices"], ACDC_PARTITIONS),
        }
    dl = make_datalist(
        dataset="synthetic-acdc" if synthetic else "acdc",
        source=source_label or src,
        num_partitions=ACDC_PARTITIONS,
        size=size,
        labels=dict(ACDC_LABELS),
        split_name=split_name,
        items=items,
        split=sp,
        labelled=sp["labelled"],
    )
    write_json(dl, Path(out_dir) / "datalist.json")
    return dl


def prepare(src, dst, size=384, split=None, seeds=(0, 1, 2), split_seed=0, workers=2, overwrite=False) -> dict:
    seeds, size, split_seed, workers, overwrite = parse_prepare_options(seeds, size, split_seed, workers, overwrite)
    src = Path(src)
    root = find_root(src)
    dataset = "synthetic-acdc" if is_synthetic(root) else "acdc"
    with atomic_output(Path(dst), dataset, src, overwrite, inputs=(src, split)) as tmp:
        dl = prepare_into(src, tmp, size, split, seeds, split_seed, workers)
    log.info(
        "acdc: wrote %d training / %d validation / %d test scans to %s (split %s)",
        len(dl["training"]), len(dl["validation"]), len(dl["test"]), dst, dl["split"],
    )
    return dl


def make_reference(src: Path, out: Path, seed: int) -> dict:
    """Build the reference split from the full 100-patient set (see tools/make_reference_split.py)."""
    _, patients = discover(Path(src))
    groups = {p["patient"]: p["group"] for p in patients}
    scans_of = {p["patient"]: [f"{p['patient']}_ED", f"{p['patient']}_ES"] for p in patients}
    sp = seeded_split(groups, scans_of, ACDC_FRACTIONS, seed, ACDC_COUNTS, (0, 1, 2))
    ref = {
        "dataset": "acdc",
        "created_by": "tools/make_reference_split.py",
        "split_seed": int(seed),
        "num_patients": len(patients),
        "counts": {k: len(sp[k]) for k in ("training", "validation", "test")},
        "training": sp["training"],
        "validation": sp["validation"],
        "test": sp["test"],
        **sp["labelled"],
        "groups": groups,
    }
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    return ref
