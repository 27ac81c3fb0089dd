"""A folder of 3D NIfTI images (labels optional) -> prepared set (e.g. for pre-training)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .common import (
    DataPrepError,
    atomic_output,
    log,
    make_datalist,
    nifti_stem,
    parse_bool,
    parse_int,
    parse_int_list,
    slice_partition,
    stratified_split,
    write_json,
)
from .scan import ScanJob, run_jobs
from .splits import ACDC_FRACTIONS, draw_labelled

LAYOUT = "a folder of 3D NIfTI images (*.nii / *.nii.gz); labels in --labels_dir (same name or NAME<suffix>) or as NAME<suffix>.nii[.gz] next to the images"


def _nifti_files(d: Path) -> list[Path]:
    return sorted(p for p in d.iterdir() if p.is_file() and (p.name.endswith(".nii") or p.name.endswith(".nii.gz")))


def discover(images_dir: Path, labels_dir: Path | None, label_suffix: str) -> list[tuple[str, Path, Path | None]]:
    images_dir = Path(images_dir)
    if not images_dir.is_dir():
        raise DataPrepError(f"{images_dir}: not a folder; expected {LAYOUT}")
    files = _nifti_files(images_dir)
    label_of: dict[str, Path] = {}
    if label_suffix:
        for p in files:
            st = nifti_stem(p)
            if st.endswith(label_suffix) and len(st) > len(label_suffix):
                label_of[st[: -len(label_suffix)]] = p
    label_files = set(label_of.values())
    images = [p for p in files if p not in label_files]
    if not images:
        raise DataPrepError(f"{images_dir}: no NIfTI image found; expected {LAYOUT}")
    if labels_dir is not None:
        labels_dir = Path(labels_dir)
        if not labels_dir.is_dir():
            raise DataPrepError(f"{labels_dir}: --labels_dir is not a folder; expected a folder of NIfTI labels")
        lab_files = {nifti_stem(p): p for p in _nifti_files(labels_dir)}
        for p in images:
            st = nifti_stem(p)
            for cand in (st, st + label_suffix if label_suffix else st):
                if cand in lab_files:
                    label_of[st] = lab_files[cand]
                    break
        matched = set(label_of.values())
        unmatched = sorted(n for n, q in lab_files.items() if q not in matched)
        if unmatched:
            log.info("nifti: %d label file(s) in %s match no image (ignored): %s", len(unmatched), labels_dir,
                     ", ".join(unmatched[:5]))
    out = []
    seen = set()
    for p in images:
        st = nifti_stem(p)
        if st in seen:
            raise DataPrepError(f"{p}: scan name {st} appears twice (.nii and .nii.gz); expected unique names")
        seen.add(st)
        out.append((st, p, label_of.get(st)))
    return out


def prepare(
    images_dir,
    dst,
    labels_dir=None,
    label_suffix="_seg",
    size=256,
    num_partitions=3,
    spacing="none",
    num_classes=None,
    seeds=(0, 1, 2),
    labelled_counts=(1, 2, 4),
    split_seed=0,
    workers=2,
    overwrite=False,
) -> dict:
    seeds = parse_int_list(seeds, "seeds", 0)
    counts = parse_int_list(labelled_counts, "labelled_counts", 1)
    size = parse_int(size, "size", 8)
    num_partitions = parse_int(num_partitions, "num_partitions", 1)
    num_classes = None if num_classes is None else parse_int(num_classes, "num_classes", 1)
    split_seed = parse_int(split_seed, "split_seed", 0)
    workers = parse_int(workers, "workers", 1)
    overwrite = parse_bool(overwrite, "overwrite")
    if spacing is None or str(spacing).lower() in ("none", ""):
        mode, target = "resize", 1.0
    else:
        try:
            mode, target = "spacing", float(spacing)
        except ValueError:
            raise DataPrepError(f"--spacing: expected 'none' or a spacing in mm like 1.0, got {spacing!r}") from None
        if not (target > 0 and np.isfinite(target)):
            raise DataPrepError(f"--spacing: expected 'none' or a positive spacing in mm like 1.0, got {spacing!r}")
    allowed = tuple(range(int(num_classes))) if num_classes else tuple(range(256))
    src = Path(images_dir)
    scans = discover(src, labels_dir, label_suffix)
    with atomic_output(Path(dst), "nifti", src, overwrite, inputs=(src, labels_dir)) as tmp:
        jobs = [ScanJob(s, str(i), str(l) if l else None, str(tmp), size, mode, allowed, target) for s, i, l in scans]
        res = run_jobs(jobs, workers)
        labelled_ids = [s for s, _, l in scans if l is not None]
        if labelled_ids:
            sp = stratified_split({s: "all" for s in labelled_ids}, *ACDC_FRACTIONS, seed=split_seed)
            held = set(sp["validation"]) | set(sp["test"])
            train = sorted(s for s, _, _ in scans if s not in held)
            train_labelled = sorted(s for s in labelled_ids if s not in held)
            split = {"training": train, "validation": sp["validation"], "test": sp["test"]}
            labelled = draw_labelled(train_labelled, {s: [s] for s in train_labelled}, counts, seeds)
            values = sorted({v for r in res.values() for v in r["label_values"]})
        else:
            split = {"training": sorted(s for s, _, _ in scans), "validation": [], "test": []}
            labelled = {}
            values = []
            log.info("nifti: no labels found: all %d scans go to training, validation/test are empty and no "
                     "labelled subsets are written (pre-training use)", len(scans))
        labels = {str(v): ("background" if v == 0 else f"class{v}") for v in (values or [])}
        if num_classes:
            labels = {str(v): ("background" if v == 0 else f"class{v}") for v in range(int(num_classes))}
        items = {}
        for s, _, l in scans:
            r = res[s]
            it = {"image": f"images/{s}.nii.gz"}
            if l is not None:
                it["label"] = f"labels/{s}.nii.gz"
            it.update({"scan": s, "patient": s, "num_slices": r["num_slices"],
                       "slice_partition": slice_partition(r["num_slices"], num_partitions)})
            items[s] = it
        dl = make_datalist(
            dataset="nifti", source=src, num_partitions=num_partitions, size=size, labels=labels,
            split_name=f"seeded:{int(split_seed)}", items=items, split=split, labelled=labelled,
        )
        write_json(dl, tmp / "datalist.json")
    log.info("nifti: wrote %d training (%d labelled) / %d validation / %d test scans to %s",
             len(dl["training"]), sum("label" in it for it in dl["training"]), len(dl["validation"]),
             len(dl["test"]), dst)
    return dl
