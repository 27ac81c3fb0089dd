"""data_prep on the real data in ../shared (skipped with a reason when absent), and split files."""

import json
import shutil
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from data_prep import acdc, promise12, read_datalist, synthetic
from data_prep.common import slice_partition
from data_prep.splits import ACDC_REFERENCE


def _nested(dl, counts, seeds=(0, 1, 2)):
    for s in seeds:
        sets = [[it["scan"] for it in dl.get(f"labelled_seed{s}_{k}", [])] for k in counts]
        present = [x for x in sets if x]  # counts that did not fit are absent
        for small, big in zip(present, present[1:]):
            assert big[: len(small)] == small
        yield sets


@pytest.fixture(scope="module")
def acdc384(shared_dir, tmp_path_factory):
    dst = tmp_path_factory.mktemp("acdc") / "acdc384"
    dl = acdc.prepare(shared_dir / "data" / "acdc", dst, size=384)  # SRC/training/patientNNN layout
    return dst, dl


def test_acdc_real_384_reference(acdc384, shared_dir):
    dst, dl = acdc384
    ref = json.loads(ACDC_REFERENCE.read_text())
    assert ref["counts"] == {"training": 88, "validation": 4, "test": 8}
    assert dl["dataset"] == "acdc" and dl["split"] == "reference" and dl["spatial_size"] == [384, 384]
    # every patient keeps its reference role; no patient in two lists
    roles = {}
    for key in ("training", "validation", "test"):
        for it in dl[key]:
            assert roles.setdefault(it["patient"], key) == key
            assert it["patient"] in ref[key]
    assert len(roles) == 10 and {k: sum(v == k for v in roles.values()) for k in ("validation", "test")} == {"validation": 1, "test": 1}
    assert len(dl["training"]) == 16
    # labelled subsets: the reference ones are absent from patient001-010 -> seeded from present training
    train_pats = {it["patient"] for it in dl["training"]}
    for sets in _nested(dl, (1, 2, 4)):
        assert [len(x) for x in sets] == [1, 2, 4]
        assert {x.split("_")[0] for x in sets[2]} <= train_pats and len({x.split("_")[0] for x in sets[2]}) == 4
    it = dl["training"][0]
    img, lab = nib.load(dst / it["image"]), nib.load(dst / it["label"])
    assert img.shape == lab.shape == (384, 384, it["num_slices"])
    assert img.header.get_zooms() == (1.0, 1.0, 10.0) and np.allclose(img.affine, np.diag([1, 1, 10, 1]))
    a, lb = np.asarray(img.dataobj), np.asarray(lab.dataobj)
    assert a.dtype == np.float32 and a.min() >= 0 and a.max() <= 1 and 0.005 < (a >= 1).mean() < 0.05
    assert set(np.unique(lb).tolist()) == {0, 1, 2, 3}
    # coarsely centred on the foreground, label not cut
    cx, cy = np.argwhere(lb > 0)[:, :2].mean(0)
    assert abs(cx - 192) < 2 and abs(cy - 192) < 2
    raw = np.asarray(nib.load(shared_dir / "data/acdc/training" / it["patient"] / f"{it['patient']}_frame01_gt.nii.gz").dataobj)
    zoom = nib.load(shared_dir / "data/acdc/training" / it["patient"] / f"{it['patient']}_frame01.nii.gz").header.get_zooms()
    if it["phase"] == "ED":  # 1 mm pixels: foreground area in pixels ~ area in mm^2
        assert (lb > 0).sum() == pytest.approx((raw > 0).sum() * zoom[0] * zoom[1], rel=0.03)
    assert it["slice_partition"] == slice_partition(it["num_slices"], 3)
    assert len(read_datalist(dst, "validation")) == 2


def test_acdc_real_subset_nii_and_split_file(shared_dir, tmp_path):
    """Three patients copied as uncompressed .nii straight under SRC; a --split file forces roles."""
    src = tmp_path / "src"
    for pid in ("patient001", "patient004", "patient009"):
        (src / pid).mkdir(parents=True)
        shutil.copy(shared_dir / "data/acdc/training" / pid / "Info.cfg", src / pid)
        for f in (shared_dir / "data/acdc/training" / pid).glob("*.nii.gz"):
            im = nib.load(f)
            nib.save(nib.Nifti1Image(np.asarray(im.dataobj), im.affine, im.header), src / pid / f.name[:-3])
    dl = acdc.prepare(src, tmp_path / "ref", size=64, seeds="0")
    assert dl["split"] == "reference"
    assert [sorted({i["patient"] for i in dl[k]}) for k in ("training", "validation", "test")] == [
        ["patient001"], ["patient004"], ["patient009"]]
    assert [len(dl[f"labelled_seed0_{k}"]) for k in (1, 2, 4)] == [1, 1, 1] and "labelled_seed1_1" not in dl
    split = {"training": ["patient004", "patient009"], "validation": ["patient001"], "test": [],
             "labelled_seed0_1": ["patient009_ES"], "labelled_seed0_2": ["patient009_ES", "patient004_ED"]}
    (tmp_path / "split.json").write_text(json.dumps(split))
    dl = acdc.prepare(src, tmp_path / "forced", size=64, split=str(tmp_path / "split.json"), seeds=[0])
    assert dl["split"] == f"file:{tmp_path / 'split.json'}"
    assert [it["scan"] for it in dl["validation"]] == ["patient001_ED", "patient001_ES"] and dl["test"] == []
    assert [it["scan"] for it in dl["labelled_seed0_2"]] == ["patient009_ES", "patient004_ED"]
    assert [it["scan"] for it in dl["labelled_seed0_4"]] == ["patient009_ES", "patient004_ED"]  # not in the file
    assert nib.load(tmp_path / "forced" / dl["training"][0]["image"]).shape[:2] == (64, 64)


def test_split_file_partial_labelled_fallback(tmp_path, caplog):
    """Labelled reference scans partly absent: kept where present, empty subsets redrawn, still nested."""
    synthetic.generate(tmp_path / "raw", num_patients=5, seed=1)
    split = {"training": [f"patient{i:03d}" for i in (1, 2, 3)] + ["patient050"], "validation": ["patient004"],
             "test": ["patient005"], "labelled_seed0_1": ["patient050_ED"],
             "labelled_seed0_2": ["patient050_ED", "patient002_ES"],
             "labelled_seed0_4": ["patient050_ED", "patient002_ES", "patient060_ED", "patient003_ED"]}
    (tmp_path / "s.json").write_text(json.dumps(split))
    with caplog.at_level("INFO", logger="data_prep"):
        dl = acdc.prepare(tmp_path / "raw", tmp_path / "out", size=32, split=str(tmp_path / "s.json"), seeds="0,1")
    assert dl["dataset"] == "synthetic-acdc"
    assert [[it["scan"] for it in dl[f"labelled_seed0_{k}"]] for k in (1, 2, 4)] == [
        ["patient002_ES"], ["patient002_ES"], ["patient002_ES", "patient003_ED"]]
    assert "labelled_seed0_1: none of its reference scans is present" in caplog.text
    sets1 = list(_nested(dl, (1, 2, 4), seeds=(1,)))[0]  # seed 1 not in the file: drawn, 3 training patients
    assert [len(x) for x in sets1] == [1, 2, 0]


@pytest.fixture(scope="module")
def promise256(shared_dir, tmp_path_factory):
    dst = tmp_path_factory.mktemp("promise") / "p256"
    dl = promise12.prepare(shared_dir / "data/promise12_resampled/training_data", dst, size=256)
    return dst, dl


def test_promise12_real_metaimage(promise256):
    dst, dl = promise256
    assert dl["dataset"] == "promise12" and dl["num_partitions"] == 5 and dl["spatial_size"] == [256, 256]
    assert dl["labels"] == {"0": "background", "1": "prostate"}
    assert [len(dl[k]) for k in ("training", "validation", "test")] == [3, 1, 1]
    assert not any(k.startswith("labelled_") for k in dl)  # 4/6/8 do not fit into 3 training cases
    scans = {it["scan"] for k in ("training", "validation", "test") for it in dl[k]}
    assert scans == {f"Case{i:02d}" for i in range(5)}
    for it in dl["training"] + dl["validation"] + dl["test"]:
        img, lab = nib.load(dst / it["image"]), nib.load(dst / it["label"])
        assert img.shape == lab.shape == (256, 256, 32) and it["num_slices"] == 32
        assert img.header.get_zooms() == (0.5, 0.5, 1.0)  # 1 mm placeholder scaled by 128 -> 256
        lb = np.asarray(lab.dataobj)
        assert set(np.unique(lb).tolist()) == {0, 1}
        assert it["slice_partition"] == slice_partition(32, 5) and it["slice_partition"][-1] == 4
    # the prostate sits in the middle slices, as in the raw (z, y, x) volume transposed to (x, y, z)
    import itk
    raw = itk.array_from_image(itk.imread(str(Path(dl["source"]) / "Case00_segmentation.mhd")))
    lb = np.asarray(nib.load(dst / "labels/Case00.nii.gz").dataobj)
    assert np.array_equal(lb.sum((0, 1)) > 0, raw.sum((1, 2)) > 0)
    assert (lb > 0).sum() == pytest.approx(4 * (raw > 0).sum(), rel=0.05)


def test_promise12_nifti_names(shared_dir, tmp_path):
    import itk
    src = tmp_path / "src"
    src.mkdir()
    for i in range(2):
        for suf in ("", "_segmentation"):
            a = itk.array_from_image(itk.imread(str(shared_dir / f"data/promise12_resampled/training_data/Case{i:02d}{suf}.mhd")))
            nib.save(nib.Nifti1Image(np.ascontiguousarray(a.transpose(2, 1, 0)), np.eye(4)), src / f"Case{i:02d}{suf}.nii")
    dl = promise12.prepare(src, tmp_path / "out", size=64)
    assert [len(dl[k]) for k in ("training", "validation", "test")] == [2, 0, 0]
    assert nib.load(tmp_path / "out" / dl["training"][0]["image"]).shape == (64, 64, 32)
