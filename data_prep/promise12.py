"""PROMISE12 (CaseNN.mhd + CaseNN_segmentation.mhd, or the same names as NIfTI) -> prepared set."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

from .common import DataPrepError, atomic_output, log, make_datalist, slice_partition, write_json
from .common import parse_prepare_options
from .scan import ScanJob, run_jobs
from .splits import PROMISE_FRACTIONS, apply_split_file, load_split_file, seeded_split

PROMISE_LABELS = {"0": "background", "1": "prostate"}
PROMISE_COUNTS = (4, 6, 8)
PROMISE_PARTITIONS = 5
EXTS = (".mhd", ".nii.gz", ".nii")
LAYOUT = (
    "the PROMISE12 layout: SRC (or SRC/training_data) holding CaseNN.mhd + CaseNN_segmentation.mhd "
    "(MetaImage with their .raw files) or CaseNN.nii[.gz] + CaseNN_segmentation.nii[.gz]"
)
_CASE = re.compile(r"^(Case\d+)(\.mhd|\.nii\.gz|\.nii)$")


def discover(src: Path) -> tuple[Path, list[tuple[str, Path, Path]]]:
    src = Path(src)
    if not src.is_dir():
        raise DataPrepError(f"{src}: not a folder; expected {LAYOUT}")
    root = src / "training_data" if (src / "training_data").is_dir() else src
    cases = {}
    for p in sorted(root.iterdir()):
        m = _CASE.match(p.name)
        if m and p.is_file():
            if m.group(1) in cases:
                raise DataPrepError(f"{p}: case {m.group(1)} exists in two formats; expected one file per case")
            cases[m.group(1)] = p
    if not cases:
        raise DataPrepError(f"{src}: no CaseNN image found; expected {LAYOUT}")
    out = []
    for case, img in cases.items():
        ext = _CASE.match(img.name).group(2)
        seg = root / f"{case}_segmentation{ext}"
        if not seg.is_file():
            raise DataPrepError(f"{seg}: segmentation not found for {img.name}; expected {LAYOUT}")
        out.append((case, img, seg))
    return root, out


def prepare(src, dst, size=256, split=None, seeds=(0, 1, 2), split_seed=0, workers=2, overwrite=False) -> dict:
    seeds, size, split_seed, workers, overwrite = parse_prepare_options(seeds, size, split_seed, workers, overwrite)
    src = Path(src)
    root, cases = discover(src)
    with atomic_output(Path(dst), "promise12", src, overwrite, inputs=(src, split)) as tmp:
        dl = prepare_into(src, tmp, cases, size, split, seeds, split_seed, workers)
    log.info(
        "promise12: wrote %d training / %d validation / %d test scans to %s",
        len(dl["training"]), len(dl["validation"]), len(dl["test"]), dst,
    )
    return dl


def prepare_into(src, out_dir, cases, size, split, seeds: Sequence[int], split_seed, workers) -> dict:
    ids = [c for c, _, _ in cases]
    scans_of = {c: [c] for c in ids}
    if split is not None:
        split_name = f"file:{Path(split).resolve()}"
        sp = apply_split_file(load_split_file(Path(split)), scans_of, str(split), seeds, PROMISE_COUNTS, strict=True)
    else:
        split_name = f"seeded:{int(split_seed)}"
        sp = seeded_split({c: "all" for c in ids}, scans_of, PROMISE_FRACTIONS, split_seed, PROMISE_COUNTS, seeds)
    mhd = [img for _, img, _ in cases if img.name.endswith(".mhd")]
    if mhd:
        log.info("promise12: reading MetaImage with itk; the shared copy's headers carry a 1 mm placeholder spacing")
        # load itk's IO modules once here: forked workers inherit them instead of each paying ~7 s
        from .common import read_metaimage

        read_metaimage(mhd[0])
    jobs = [ScanJob(c, str(img), str(seg), str(out_dir), int(size), "resize", (0, 1)) for c, img, seg in cases]
    res = run_jobs(jobs, workers)
    items = {}
    for c in ids:
        r = res[c]
        items[c] = {
            "image": f"images/{c}.nii.gz",
            "label": f"labels/{c}.nii.gz",
            "scan": c,
            "patient": c,
            "num_slices": r["num_slices"],
            "slice_partition": slice_partition(r["num_slices"], PROMISE_PARTITIONS),
        }
    dl = make_datalist(
        dataset="promise12", source=src, num_partitions=PROMISE_PARTITIONS, size=size,
        labels=dict(PROMISE_LABELS), split_name=split_name, items=items, split=sp, labelled=sp["labelled"],
    )
    write_json(dl, Path(out_dir) / "datalist.json")
    return dl
