"""MONAI Label trains and infers with the exported bundles, for real.

The bundles are exported with ``python -m bim.export_bundle`` into a MONAI Label app's ``model/`` folder, and
monailabel's own :class:`~monailabel.tasks.train.bundle.BundleTrainTask` and
:class:`~monailabel.tasks.infer.bundle.BundleInferTask` run them over a :class:`~monailabel.datastore.local.LocalDatastore`
of raw demo NIfTI scans (their own spacing and intensities, as a user's scanner writes them) whose labels hold the
model's class indices (LV = 1 for task lv). The tests assert on the written masks (the input's shape and affine,
Dice against the ground truth) and on the trained model's validation Dice. A small U-Net (8-128) keeps them fast.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SMALL = [8, 16, 32, 64, 128, 8]
# the user edits these in the exported configs/train.json; the defaults (a 32-512 U-Net, 200 iterations an epoch)
# are for a GPU
TINY = dict(features=SMALL, iters_per_epoch=20, batch_size=8, crop_size=64, learning_rate=0.003, warmup_epochs=1,
            save_every=10, progress_bar=False)
EPOCHS = 4
TRAIN_SCANS = [f"patient{i:03d}_frame01" for i in (1, 2, 3, 4, 6)]  # 4 train, 1 validation (val_split 0.2)
LV = 3  # ACDC's label value of the LV cavity in the raw ground truth
# Inference scores the validation scan on its raw grid (1.25-1.5 mm), training's validation on the 1 mm grid: the
# two Dice differ only where the boundary falls between grids, a band one raw voxel wide around an LV of radius
# ~12 mm, i.e. at most 2 x 1.5 / 12 = 25 % of its area; a geometry error (wrong affine, flipped axes, another size)
# moves the mask off the LV and costs far more. TOL allows 0.1 of Dice between the two.
TOL = 0.1


def raw_dir() -> Path:
    from data_prep import ensure_demo_dataset

    return Path(ensure_demo_dataset()) / "raw" / "training"


def raw_scan(name: str) -> tuple[Path, Path]:
    folder = raw_dir() / name.split("_")[0]
    return folder / f"{name}.nii.gz", folder / f"{name}_gt.nii.gz"


def make_datastore(path: Path, label_of=lambda gt: (gt == LV).astype(np.uint8)):
    """A MONAI Label LocalDatastore of the raw TRAIN_SCANS: images in ``path``, final labels in
    ``path/labels/final`` under the same name, each ``label_of(ACDC ground truth)``."""
    from monailabel.datastore.local import LocalDatastore

    (path / "labels" / "final").mkdir(parents=True)
    for name in TRAIN_SCANS:
        image, gt = raw_scan(name)
        shutil.copy(image, path / image.name)
        src = nib.load(gt)
        nib.save(nib.Nifti1Image(label_of(np.asarray(src.dataobj)), src.affine, src.header),
                 path / "labels" / "final" / image.name)
    return LocalDatastore(str(path), extensions=("*.nii.gz",))


def validation_scan(datastore) -> str:
    """The scan MONAI Label's split holds out for validation: val_split 0.2 of 5 scans, not shuffled, is the last one
    of the datastore's list (whose order is the file system's)."""
    return Path(datastore.datalist()[-1]["image"]).name.removesuffix(".nii.gz")


def export_into_app(bundle: str, app: Path, **settings) -> Path:
    """The README's command: export the bundle into the app's model folder; then set ``settings`` in its configs
    (network size and schedule in train.json, the network size in inference.json too)."""
    proc = subprocess.run([sys.executable, "-m", "bim.export_bundle", bundle, "--out", str(app / "model")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    path = app / "model" / bundle
    for config, keys in (("train.json", settings), ("inference.json", {"features": settings["features"]})):
        cfg = json.loads((path / "configs" / config).read_text())
        cfg.update(keys)
        (path / "configs" / config).write_text(json.dumps(cfg, indent=2))
    return path


class LogCapture(logging.Handler):
    """Messages of the bundles' logger ("bim") while a MONAI Label task runs."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())

    def __enter__(self):
        logger = logging.getLogger("bim")
        self.level = logger.level
        logger.setLevel(logging.INFO)
        logger.addHandler(self)
        return self

    def __exit__(self, *exc):
        logging.getLogger("bim").removeHandler(self)
        logging.getLogger("bim").setLevel(self.level)

    def text(self) -> str:
        return "\n".join(self.messages)


def train(bundle_path: Path, datastore, max_epochs: int) -> str:
    """One MONAI Label train request on the CPU; returns what the bundle logged."""
    from monailabel.tasks.train.bundle import BundleTrainTask

    task = BundleTrainTask(str(bundle_path), {})
    assert task.is_valid()
    with LogCapture() as log:
        task({"model": bundle_path.name, "max_epochs": max_epochs, "device": "cpu", "multi_gpu": False}, datastore)
    return log.text()


def infer(bundle_path: Path, image: Path) -> tuple[nib.Nifti1Image, dict]:
    from monailabel.tasks.infer.bundle import BundleInferTask

    task = BundleInferTask(str(bundle_path), {})
    assert task.is_valid() and task.labels == {"lv": 1}
    mask_file, result = task({"image": str(image), "device": "cpu"})
    return nib.load(mask_file), result


def dice(pred: np.ndarray, truth: np.ndarray) -> float:
    return float(2 * np.logical_and(pred, truth).sum() / (pred.sum() + truth.sum()))


def error_chain(err: BaseException) -> str:
    """The messages of ``err`` and its causes (MONAI's config parser wraps a component's error)."""
    chain = []
    while err is not None:
        chain.append(str(err))
        err = err.__cause__ or err.__context__
    return "\n".join(chain)


def all_lv_dice(gt: Path) -> float:
    """The Dice of a mask that calls every voxel LV: what a model that learnt nothing about the shape scores at most
    (an empty mask scores 0)."""
    truth = np.asarray(nib.load(gt).dataobj) == LV
    return dice(np.ones_like(truth), truth)


@pytest.fixture(scope="module")
def finetune_app(tmp_path_factory) -> dict:
    """finetune_seg exported into an app, trained by one MONAI Label request (EPOCHS x 20 iterations)."""
    tmp = tmp_path_factory.mktemp("monailabel")
    bundle = export_into_app("finetune_seg", tmp / "app", **TINY)
    datastore = make_datastore(tmp / "datastore")
    log = train(bundle, datastore, max_epochs=EPOCHS)
    return {"bundle": bundle, "datastore": datastore, "log": log, "validation": validation_scan(datastore),
            "first": json.loads((bundle / "models" / "best_metric.json").read_text())}


def test_train_task_learns_from_raw_datastore_scans(finetune_app):
    bundle, first = finetune_app["bundle"], finetune_app["first"]
    models = bundle / "models"
    # raw scans of different sizes and spacings, resampled to 1 mm as inference does, then padded to one size
    assert "scans of different in-plane sizes: slices zero-padded to" in finetune_app["log"]
    assert "task lv: 4 labelled scans" in finetune_app["log"]
    # validation Dice (3D, the datastore's validation scan) of the model written: the LV found (an all-LV mask
    # scores all_lv_dice, ~0.08; an empty one 0)
    val_gt = raw_scan(finetune_app["validation"])[1]
    print(f"validation Dice after the first request: {first['value']:.3f} (all-LV mask {all_lv_dice(val_gt):.3f})")
    assert first["value"] > max(0.5, all_lv_dice(val_gt)), first
    assert first["epochs"] == EPOCHS and first["checkpoint"] == (models / "model.pt").as_posix()
    # MONAI Label's max_epochs sets the LR schedule's length: the cosine reaches 0 at its last iteration
    final = torch.load(models / "checkpoint_final.pt", weights_only=True)
    assert final["trainer"]["iteration"] == EPOCHS * TINY["iters_per_epoch"]
    assert final["lr_scheduler"]["t_total"] == EPOCHS * TINY["iters_per_epoch"]
    assert final["optimizer"]["param_groups"][0]["lr"] == pytest.approx(0.0, abs=1e-12)
    # what training writes is readable by others
    for name in ("model.pt", "checkpoint_final.pt", "checkpoint_last.pt", "best_metric.json"):
        assert stat.S_IMODE(os.stat(models / name).st_mode) == 0o644, name


def test_infer_task_writes_the_mask_in_the_input_geometry(finetune_app):
    image, gt = raw_scan(finetune_app["validation"])
    mask, result = infer(finetune_app["bundle"], image)
    src = nib.load(image)
    assert mask.shape == src.shape
    np.testing.assert_allclose(mask.affine, src.affine, atol=1e-4)
    assert abs(float(src.header.get_zooms()[0]) - 1.0) > 0.1  # resampled to 1 mm and back
    pred = np.asarray(mask.dataobj)
    assert set(np.unique(pred).tolist()) <= {0, 1} and result["label_names"] == {"lv": 1}
    score = dice(pred == 1, np.asarray(nib.load(gt).dataobj) == LV)
    print(f"inference Dice on the validation scan: {score:.3f} (training's validation {finetune_app['first']['value']:.3f})")
    assert score == pytest.approx(finetune_app["first"]["value"], abs=TOL)


def test_second_train_request_trains_again_and_keeps_the_better_model(finetune_app):
    bundle = finetune_app["bundle"]
    models = bundle / "models"
    before = (models / "checkpoint_final.pt").stat().st_mtime_ns
    log = train(bundle, finetune_app["datastore"], max_epochs=EPOCHS)
    total = EPOCHS * TINY["iters_per_epoch"]
    assert f"is of a finished run ({total} of {total} iterations): training again from the start" in log
    assert "resuming from" not in log
    assert (models / "checkpoint_final.pt").stat().st_mtime_ns != before
    assert torch.load(models / "checkpoint_final.pt", weights_only=True)["trainer"]["iteration"] == total
    # model.pt is this request's best only where it beats the first request's model, else kept with a warning
    record = json.loads((models / "best_metric.json").read_text())
    assert record["value"] >= finetune_app["first"]["value"]
    if record == finetune_app["first"]:
        assert "keeping that model; this run's best weights go to model_new.pt" in log
        assert (models / "model_new.pt").is_file()


def test_label_values_outside_the_output_encoding_are_a_clear_error(tmp_path, finetune_app):
    """ACDC's raw label values (0-3) are not the lv model's classes (0, 1): an error naming the file."""
    datastore = make_datastore(tmp_path / "acdc_labels", label_of=lambda gt: gt.astype(np.uint8))
    with pytest.raises(Exception) as err:
        train(finetune_app["bundle"], datastore, max_epochs=1)
    labels = re.escape(str(tmp_path / "acdc_labels" / "labels" / "final"))
    assert re.search(rf"{labels}/patient\d{{3}}_frame01\.nii\.gz: label values \[2, 3\] do not fit task 'lv': the "
                     rf"label of a raw scan holds the class indices the model predicts \(0 background, 1 LV\)",
                     error_chain(err.value)), error_chain(err.value)


def test_meanteacher_without_unlabelled_scans_says_so(tmp_path):
    bundle = export_into_app("meanteacher_seg", tmp_path / "app", **TINY)
    datastore = make_datastore(tmp_path / "datastore")
    with pytest.raises(Exception) as err:
        train(bundle, datastore, max_epochs=1)
    assert ("meanteacher_seg needs unlabelled scans but dataset_dir is null, which would take them from the "
            "synthetic demo data set while the 4 labelled scans are raw scans from elsewhere") in error_chain(err.value)
    assert not (bundle / "models" / "model.pt").exists()


def test_meanteacher_trains_and_infers_with_unlabelled_scans(tmp_path):
    """meanteacher_seg with its unlabelled scans from a prepared data set (here the demo's): trained by MONAI Label
    on the raw datastore, then inferring on the datastore's validation scan."""
    from data_prep import ensure_demo_dataset

    bundle = export_into_app("meanteacher_seg", tmp_path / "app", **TINY, dataset_dir=str(ensure_demo_dataset()),
                             unlabelled_batch_size=4)
    datastore = make_datastore(tmp_path / "datastore")
    log = train(bundle, datastore, max_epochs=EPOCHS)
    assert "both zero-padded to" in log  # raw labelled slices beside the demo's 128 x 128 unlabelled ones
    record = json.loads((bundle / "models" / "best_metric.json").read_text())
    image, gt = raw_scan(validation_scan(datastore))
    print(f"mean teacher validation Dice: {record['value']:.3f} (all-LV mask {all_lv_dice(gt):.3f})")
    assert record["method"] == "mean_teacher" and record["value"] > max(0.5, all_lv_dice(gt)), record
    mask, _ = infer(bundle, image)
    assert mask.shape == nib.load(image).shape
    np.testing.assert_allclose(mask.affine, nib.load(image).affine, atol=1e-4)
    score = dice(np.asarray(mask.dataobj) == 1, np.asarray(nib.load(gt).dataobj) == LV)
    print(f"mean teacher inference Dice on the validation scan: {score:.3f}")
    assert score == pytest.approx(record["value"], abs=TOL)
