"""Per-scan processing (runs in worker processes): read, validate, normalise, resample, crop, write."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .common import (
    DataPrepError,
    check_image,
    check_label,
    crop_or_pad,
    label_centre,
    label_on_image_grid,
    percentile_normalise,
    read_volume,
    resample_inplane,
    save_nifti,
)


@dataclass
class ScanJob:
    scan: str
    image: str
    label: str | None
    out_dir: str
    size: int
    mode: str  # "spacing": resample to `target_spacing` mm then crop/pad; "resize": each slice to size x size
    allowed_labels: tuple = (0, 1, 2, 3)
    target_spacing: float = 1.0
    meta: dict = field(default_factory=dict)


def load_pair(job: ScanJob):
    img_path = Path(job.image)
    img, zooms, img_affine = read_volume(img_path, "image")
    img = check_image(img, img_path)
    lab = None
    if job.label is not None:
        lab_path = Path(job.label)
        lab_raw, _, lab_affine = read_volume(lab_path, "label")
        lab = check_label(lab_raw, lab_path, job.allowed_labels)
        lab = label_on_image_grid(lab, lab_affine, lab_path, img.shape, img_affine, img_path)
    return img, lab, zooms


def process_scan(job: ScanJob) -> dict:
    img, lab, zooms = load_pair(job)
    img_path = Path(job.image)
    img = percentile_normalise(img, img_path)
    nx, ny, nz = img.shape
    if job.mode == "spacing":
        t = float(job.target_spacing)
        out_shape = (max(1, int(round(nx * zooms[0] / t))), max(1, int(round(ny * zooms[1] / t))))
        scale = (t / zooms[0], t / zooms[1])
        img_r = resample_inplane(img, out_shape, scale, order=1)
        lab_r = resample_inplane(lab, out_shape, scale, order=0) if lab is not None else None
        centre = label_centre(lab_r, out_shape)
        img_o = crop_or_pad(img_r, centre, job.size, 0.0)
        lab_o = crop_or_pad(lab_r, centre, job.size, 0) if lab_r is not None else None
        spacing = (t, t, zooms[2])
    elif job.mode == "resize":
        out_shape = (job.size, job.size)
        scale = (nx / job.size, ny / job.size)
        img_o = resample_inplane(img, out_shape, scale, order=1)
        lab_o = resample_inplane(lab, out_shape, scale, order=0) if lab is not None else None
        spacing = (zooms[0] * scale[0], zooms[1] * scale[1], zooms[2])
    else:  # pragma: no cover - internal
        raise ValueError(f"unknown mode {job.mode}")
    out = Path(job.out_dir)
    save_nifti(np.ascontiguousarray(img_o, dtype=np.float32), spacing, out / "images" / f"{job.scan}.nii.gz")
    values = []
    if lab_o is not None:
        save_nifti(np.ascontiguousarray(lab_o, dtype=np.uint8), spacing, out / "labels" / f"{job.scan}.nii.gz")
        values = sorted(int(v) for v in np.unique(lab_o))
    return {
        "scan": job.scan,
        "num_slices": int(nz),
        "spacing": [float(s) for s in spacing],
        "label_values": values,
        "labelled": lab_o is not None,
    }


def run_jobs(jobs: list[ScanJob], workers: int | None) -> dict[str, dict]:
    from .common import parallel_map

    if not jobs:
        raise DataPrepError("no scans to process")
    (Path(jobs[0].out_dir) / "images").mkdir(parents=True, exist_ok=True)
    if any(j.label is not None for j in jobs):
        (Path(jobs[0].out_dir) / "labels").mkdir(parents=True, exist_ok=True)
    results = parallel_map(process_scan, jobs, workers)
    return {r["scan"]: r for r in results}
