"""data_prep on synthetic data: phantoms, demo set, datalist contract, nifti source, helpers."""

import hashlib
import json
import threading
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from monai.data import load_decathlon_datalist

import data_prep
from data_prep import read_datalist
from data_prep import demo as demo_mod
from data_prep import nifti as nifti_mod
from data_prep import synthetic
from data_prep.common import crop_or_pad, resample_inplane, slice_partition, split_counts


def _digest(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("demo") / "demo_acdc"
    demo_mod.prepare(d, num_patients=10, size=96)
    return d


def test_synthetic_deterministic_and_layout(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    synthetic.generate(a, num_patients=3, seed=5)
    synthetic.generate(b, num_patients=3, seed=5)
    synthetic.generate(c, num_patients=3, seed=6)
    da, db, dc = _digest(a), _digest(b), _digest(c)
    assert da == db  # same bytes twice
    assert da != dc
    pdir = a / "training" / "patient002"
    info = dict(line.split(": ") for line in (pdir / "Info.cfg").read_text().splitlines())
    assert set(info) == {"ED", "ES", "Group", "Height", "NbFrame", "Weight"}
    assert info["ED"] == "1" and info["Group"] == "MINF"
    es = int(info["ES"])
    assert 1 < es < int(info["NbFrame"])
    for fr in (1, es):
        img = nib.load(pdir / f"patient002_frame{fr:02d}.nii.gz")
        lab = nib.load(pdir / f"patient002_frame{fr:02d}_gt.nii.gz")
        assert img.shape == lab.shape and len(img.shape) == 3
        assert 104 <= img.shape[0] <= 120 and img.shape[1] == 112 and 6 <= img.shape[2] <= 10
        sx, sy, sz = img.header.get_zooms()
        assert 1.2 <= sx <= 1.6 and sx == sy and 8 <= sz <= 10
        assert set(np.unique(np.asarray(lab.dataobj)).tolist()) == {0, 1, 2, 3}


def test_synthetic_phantom_properties():
    p = synthetic.make_patient(0, 1)
    img_ed, lab_ed = p["frames"]["ED"]
    img_es, lab_es = p["frames"]["ES"]
    # ES is contracted: smaller LV and RV cavities, myocardium kept
    assert (lab_es == 3).sum() < 0.8 * (lab_ed == 3).sum()
    assert (lab_es == 1).sum() < 0.9 * (lab_ed == 1).sum()
    assert abs(int((lab_es == 2).sum()) - int((lab_ed == 2).sum())) < 0.25 * (lab_ed == 2).sum()
    # radii shrink toward base and apex; the apical slice has no RV
    lv_area = [(lab_ed[..., z] >= 2).sum() for z in range(lab_ed.shape[2])]
    assert max(lv_area) > lv_area[0] and max(lv_area) > 2 * lv_area[-1]
    assert (lab_ed[..., -1] == 1).sum() == 0 and (lab_ed[..., 0] == 1).sum() > 0
    # intensities overlap: many background voxels are brighter than a typical voxel of each class
    img = img_ed.astype(np.float32)
    bg = img[lab_ed == 0]
    for k in (1, 2, 3):
        m = np.median(img[lab_ed == k])
        assert (bg > m).sum() > 0.1 * (lab_ed == k).sum(), k
    myo, bgm = np.median(img[lab_ed == 2]), np.median(bg[bg > 0.1 * bg.max()])
    assert abs(myo - bgm) < 0.5 * np.median(img[lab_ed == 3])


def test_demo_dataset_contract(demo_dir):
    dl = json.loads((demo_dir / "datalist.json").read_text())
    assert dl["dataset"] == "synthetic-acdc" and dl["created_by"] == "data_prep"
    assert dl["source"] == str(demo_dir / "raw") and (demo_dir / "raw" / "training" / "patient001").is_dir()
    assert dl["num_partitions"] == 3 and dl["spatial_size"] == [96, 96]
    assert dl["labels"] == {"0": "background", "1": "RV", "2": "Myo", "3": "LV"}
    assert dl["split"] == "seeded:0"
    # 10 patients: 1 val, 1 test patient (proportional with the >= 1 rule), 8 training
    pats = {k: {it["patient"] for it in dl[k]} for k in ("training", "validation", "test")}
    assert [len(pats[k]) for k in ("training", "validation", "test")] == [8, 1, 1]
    assert not (pats["training"] & pats["validation"]) and not (pats["training"] & pats["test"])
    assert not (pats["validation"] & pats["test"])
    assert len(dl["training"]) == 16  # both phases of each patient
    for it in dl["training"] + dl["validation"] + dl["test"]:
        img = nib.load(demo_dir / it["image"])
        lab = nib.load(demo_dir / it["label"])
        assert img.shape == lab.shape == (96, 96, it["num_slices"])
        assert img.get_data_dtype() == np.float32 and lab.get_data_dtype() == np.uint8
        z = img.header.get_zooms()
        assert z[0] == pytest.approx(1.0) and z[1] == pytest.approx(1.0) and 8 <= z[2] <= 10
        assert np.allclose(np.diag(img.affine)[:2], 1.0)
        assert it["slice_partition"] == slice_partition(it["num_slices"], 3)
        assert it["scan"] == f"{it['patient']}_{it['phase']}" and it["group"] in synthetic.GROUPS
    a = np.asarray(nib.load(demo_dir / dl["training"][0]["image"]).dataobj)
    lab = np.asarray(nib.load(demo_dir / dl["training"][0]["label"]).dataobj)
    assert 0.0 <= a.min() and a.max() <= 1.0 and a.max() > 0.9
    assert set(np.unique(lab).tolist()) == {0, 1, 2, 3}
    # nested labelled subsets of distinct training patients
    train_scans = {it["scan"] for it in dl["training"]}
    for s in (0, 1, 2):
        sets = [[it["scan"] for it in dl[f"labelled_seed{s}_{k}"]] for k in (1, 2, 4)]
        assert [len(x) for x in sets] == [1, 2, 4]
        assert sets[1][:1] == sets[0] and sets[2][:2] == sets[1]
        assert set(sets[2]) <= train_scans
        assert len({x.split("_")[0] for x in sets[2]}) == 4
        full = dl[f"labelled_seed{s}_4"][0]
        assert full == next(it for it in dl["training"] if it["scan"] == full["scan"])
    assert [it["scan"] for it in dl["labelled_seed0_4"]] != [it["scan"] for it in dl["labelled_seed1_4"]]
    # monai reads every list
    for key in ("training", "validation", "test", "labelled_seed0_1", "labelled_seed2_4"):
        items = load_decathlon_datalist(str(demo_dir / "datalist.json"), is_segmentation=True, data_list_key=key)
        assert items and all(Path(it["image"]).is_file() and Path(it["label"]).is_file() for it in items)


def test_slice_partition_values():
    assert slice_partition(10, 3) == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert slice_partition(5, 5) == [0, 1, 2, 3, 4]
    assert slice_partition(7, 5) == [0, 0, 1, 2, 2, 3, 4]
    assert slice_partition(2, 3) == [0, 1]


def test_split_counts():
    assert split_counts(100, 0.04, 0.08) == (88, 4, 8)
    assert split_counts(50, 3 / 50, 7 / 50) == (40, 3, 7)
    assert split_counts(10, 0.04, 0.08) == (8, 1, 1)
    assert split_counts(3, 0.04, 0.08) == (1, 1, 1)
    assert split_counts(2, 0.04, 0.08) == (2, 0, 0)


def test_resample_and_crop():
    vol = np.arange(16, dtype=np.float32).reshape(4, 4, 1)
    same = resample_inplane(vol, (4, 4), (1.0, 1.0), 1)
    assert np.allclose(same, vol)
    up = resample_inplane(vol, (8, 8), (0.5, 0.5), 1)
    assert up.shape == (8, 8, 1) and up.min() == 0 and up.max() == 15
    lab = np.zeros((4, 4, 1), np.uint8)
    lab[1:3, 1:3] = 3
    nn = resample_inplane(lab, (8, 8), (0.5, 0.5), 0)
    assert set(np.unique(nn).tolist()) == {0, 3} and (nn == 3).sum() == 16
    c = crop_or_pad(vol, (0.0, 0.0), 4, -1)
    assert c[0, 0, 0] == -1 and c[2, 2, 0] == vol[0, 0, 0]


def test_read_datalist(demo_dir, tmp_path):
    items = read_datalist(demo_dir, "labelled_seed0_2")
    assert len(items) == 2 and Path(items[0]["image"]).is_absolute() and Path(items[0]["label"]).is_file()
    with pytest.raises(ValueError, match=r"datalist.json has no key 'labelled_seed0_8'; .*available labelled subsets: labelled_seed0_1, labelled_seed0_2, labelled_seed0_4, labelled_seed1_1"):
        read_datalist(demo_dir, "labelled_seed0_8")
    with pytest.raises(FileNotFoundError, match="datalist.json"):
        read_datalist(tmp_path / "nothing", "training")


def test_ensure_demo_dataset_concurrent(tmp_path, monkeypatch):
    monkeypatch.setattr(demo_mod, "DEMO_PATIENTS", 3)
    monkeypatch.setattr(demo_mod, "DEMO_SIZE", 32)
    monkeypatch.setenv("BIM_DEMO_DIR", str(tmp_path / "cache" / "demo"))
    out, errs = [], []

    def call():
        try:
            out.append(data_prep.ensure_demo_dataset())
        except Exception as e:  # pragma: no cover - reported below
            errs.append(e)

    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errs and out == [tmp_path / "cache" / "demo"] * 2
    assert json.loads((out[0] / "datalist.json").read_text())["spatial_size"] == [32, 32]
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["demo"]  # temp copies removed
    assert data_prep.ensure_demo_dataset() == out[0]  # second call reuses it


@pytest.fixture(scope="module")
def nifti_folder(tmp_path_factory) -> Path:
    """6 synthetic scans as a flat NIfTI folder, with a parallel labels folder."""
    root = tmp_path_factory.mktemp("nifti_src")
    (root / "images").mkdir()
    (root / "labels").mkdir()
    for i in range(1, 7):
        p = synthetic.make_patient(3, i)
        img, lab = p["frames"]["ED"]
        aff = np.diag(list(p["spacing"]) + [1.0])
        nib.save(nib.Nifti1Image(img, aff), root / "images" / f"scan{i}.nii.gz")
        nib.save(nib.Nifti1Image(lab, aff), root / "labels" / f"scan{i}_seg.nii.gz")
    return root


def test_nifti_unlabelled_only(nifti_folder, tmp_path, caplog):
    dst = tmp_path / "pre"
    with caplog.at_level("INFO", logger="data_prep"):
        dl = nifti_mod.prepare(nifti_folder / "images", dst, size=64, num_partitions=4)
    assert "no labels found" in caplog.text
    assert len(dl["training"]) == 6 and dl["validation"] == [] and dl["test"] == []
    assert not any(k.startswith("labelled_") for k in dl) and dl["num_partitions"] == 4
    it = dl["training"][0]
    assert "label" not in it and it["slice_partition"] == slice_partition(it["num_slices"], 4)
    img = nib.load(dst / it["image"])
    assert img.shape[:2] == (64, 64) and not (dst / "labels").exists()
    assert load_decathlon_datalist(str(dst / "datalist.json"), True, "training")[0]["image"].endswith(".nii.gz")


def test_nifti_with_labels(nifti_folder, tmp_path):
    dst = tmp_path / "lab"
    dl = nifti_mod.prepare(nifti_folder / "images", dst, labels_dir=nifti_folder / "labels", size=80,
                                 spacing="1.0", labelled_counts="1,2,4,8")
    assert [len(dl[k]) for k in ("training", "validation", "test")] == [4, 1, 1]
    assert all("label" in it for k in ("training", "validation", "test") for it in dl[k])
    assert {it["scan"] for it in dl["validation"] + dl["test"]}.isdisjoint(it["scan"] for it in dl["training"])
    assert "labelled_seed0_4" in dl and "labelled_seed0_8" not in dl  # 8 does not fit into 4 training scans
    assert dl["labels"] == {"0": "background", "1": "class1", "2": "class2", "3": "class3"}
    img = nib.load(dst / dl["training"][0]["image"])
    assert img.shape[:2] == (80, 80) and img.header.get_zooms()[:2] == (1.0, 1.0)
