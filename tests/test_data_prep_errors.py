"""Bad input: one clear DataPrepError naming the file and what was expected, and no partial output."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from data_prep import DataPrepError, acdc, nifti, promise12, synthetic

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def raw3(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("raw3") / "raw"
    synthetic.generate(d, num_patients=3, seed=2)
    return d


@pytest.fixture
def src(raw3, tmp_path) -> Path:
    s = tmp_path / "src"
    shutil.copytree(raw3, s)
    (s / "synthetic_phantoms.json").unlink()
    return s


def _p2(src):
    return src / "training" / "patient002"


def _rewrite(path: Path, arr, zooms=(1.3, 1.3, 9.0)):
    nib.save(nib.Nifti1Image(arr, np.diag(list(zooms[:3]) + [1.0])), path)


def _fails(fn, dst: Path, *match: str):
    with pytest.raises(DataPrepError) as ei:
        fn()
    msg = str(ei.value)
    for m in match:
        assert m in msg, (m, msg)
    assert not dst.exists(), "partial output left"
    assert not list(dst.parent.glob(dst.name + ".tmp-*")), "temporary folder left"
    return msg


def test_corrupt_file(src, tmp_path):
    f = _p2(src) / "patient002_frame01.nii.gz"
    f.write_bytes(b"this is not a nifti file" * 10)
    dst = tmp_path / "out"
    _fails(lambda: acdc.prepare(src, dst, size=32), dst, str(f), "cannot read as NIfTI", "expected a readable 3D NIfTI image")


def test_truncated_file(src, tmp_path):
    f = _p2(src) / "patient002_frame01_gt.nii.gz"
    f.write_bytes(f.read_bytes()[:2000])
    dst = tmp_path / "out"
    _fails(lambda: acdc.prepare(src, dst, size=32), dst, str(f), "cannot read as NIfTI", "label")


def test_shape_mismatch(src, tmp_path):
    f = _p2(src) / "patient002_frame01_gt.nii.gz"
    lab = np.asarray(nib.load(f).dataobj)
    _rewrite(f, np.ascontiguousarray(lab[:-4]))
    dst = tmp_path / "out"
    _fails(lambda: acdc.prepare(src, dst, size=32), dst, str(f), "does not match image shape", "expected the same voxel grid")


def test_label_values_outside(src, tmp_path):
    f = _p2(src) / "patient002_frame01_gt.nii.gz"
    lab = np.asarray(nib.load(f).dataobj).copy()
    lab[0, 0, 0] = 7
    _rewrite(f, lab)
    dst = tmp_path / "out"
    _fails(lambda: acdc.prepare(src, dst, size=32), dst, str(f), "label values [7] outside the expected set [0, 1, 2, 3]")


@pytest.mark.parametrize("shape,ndim", [((40, 40), 2), ((40, 40, 5, 2), 4)])
def test_wrong_dimensionality(tmp_path, shape, ndim):
    d = tmp_path / "imgs"
    d.mkdir()
    _rewrite(d / "a.nii.gz", np.random.default_rng(0).random((40, 40, 5)).astype(np.float32))
    _rewrite(d / "b.nii.gz", np.random.default_rng(0).random(shape).astype(np.float32))
    dst = tmp_path / "out"
    _fails(lambda: nifti.prepare(d, dst, size=32), dst, str(d / "b.nii.gz"), f"has {ndim} dimensions", "expected a 3D volume")


def test_nan_image(src, tmp_path):
    f = _p2(src) / "patient002_frame01.nii.gz"
    img = np.asarray(nib.load(f).dataobj).astype(np.float32)
    img[3, 3, 1] = np.nan
    _rewrite(f, img)
    dst = tmp_path / "out"
    _fails(lambda: acdc.prepare(src, dst, size=32), dst, str(f), "1 NaN/inf voxels", "expected finite intensities")


def test_constant_image(src, tmp_path):
    f = _p2(src) / "patient002_frame01.nii.gz"
    _rewrite(f, np.full(nib.load(f).shape, 5, np.int16))
    dst = tmp_path / "out"
    _fails(lambda: acdc.prepare(src, dst, size=32), dst, str(f), "image is constant (5.0)", "expected varying intensities")


def test_missing_info_cfg(src, tmp_path):
    (_p2(src) / "Info.cfg").unlink()
    dst = tmp_path / "out"
    _fails(lambda: acdc.prepare(src, dst, size=32), dst, str(_p2(src) / "Info.cfg"), "missing Info.cfg", "ACDC challenge layout")


def test_bad_info_cfg_and_missing_frame(src, tmp_path):
    (_p2(src) / "Info.cfg").write_text("Group: NOR\n")
    dst = tmp_path / "out"
    _fails(lambda: acdc.prepare(src, dst, size=32), dst, "Info.cfg lacks a valid ED, ES or Group line")
    (_p2(src) / "Info.cfg").write_text("ED: 1\nES: 99\nGroup: NOR\n")
    _fails(lambda: acdc.prepare(src, dst, size=32), dst, "patient002_frame99.nii.gz: file not found", "ACDC challenge layout")


def test_empty_or_wrong_layout(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (tmp_path / "wrong" / "case1").mkdir(parents=True)
    dst = tmp_path / "out"
    _fails(lambda: acdc.prepare(empty, dst), dst, str(empty), "no patientNNN folders found", "expected the ACDC challenge layout: SRC/training/patientNNN/")
    _fails(lambda: acdc.prepare(tmp_path / "wrong", dst), dst, "no patientNNN folders found")
    _fails(lambda: acdc.prepare(tmp_path / "absent", dst), dst, "not a folder")
    _fails(lambda: promise12.prepare(empty, dst), dst, str(empty), "no CaseNN image found", "expected the PROMISE12 layout: SRC (or SRC/training_data) holding CaseNN.mhd")
    _fails(lambda: nifti.prepare(empty, dst), dst, str(empty), "no NIfTI image found", "expected a folder of 3D NIfTI images")


def test_promise12_missing_segmentation_and_corrupt_mhd(tmp_path):
    d = tmp_path / "p"
    d.mkdir()
    _rewrite(d / "Case00.nii.gz", np.random.default_rng(0).random((16, 16, 4)).astype(np.float32))
    dst = tmp_path / "out"
    _fails(lambda: promise12.prepare(d, dst, size=16), dst, "Case00_segmentation.nii.gz: segmentation not found")
    m = tmp_path / "m"
    m.mkdir()
    (m / "Case01.mhd").write_text("ObjectType = Image\nNDims = 3\nDimSize = 8 8 4\nElementType = MET_SHORT\nElementDataFile = Case01.raw\n")
    (m / "Case01.raw").write_bytes(b"\0" * 10)  # far too short
    shutil.copy(m / "Case01.mhd", m / "Case01_segmentation.mhd")
    _fails(lambda: promise12.prepare(m, dst, size=16), dst, str(m / "Case01.mhd"), "cannot read as MetaImage")


def test_destination_with_other_dataset(src, raw3, tmp_path):
    dst = tmp_path / "out"
    nifti.prepare(_p2(src), dst, size=32, label_suffix="_gt")
    before = (dst / "datalist.json").read_text()
    with pytest.raises(DataPrepError, match=r"datalist.json: holds dataset 'nifti' .*expected 'acdc'.*--overwrite"):
        acdc.prepare(src, dst, size=32)
    assert (dst / "datalist.json").read_text() == before  # untouched
    with pytest.raises(DataPrepError, match="holds dataset 'nifti' from"):
        nifti.prepare(src / "training" / "patient001", dst, size=32)  # same kind, other source
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "x.txt").write_text("x")
    with pytest.raises(DataPrepError, match="not a data_prep output"):
        acdc.prepare(src, tmp_path / "junk", size=32)
    dl = acdc.prepare(src, dst, size=32, overwrite=True)
    assert json.loads((dst / "datalist.json").read_text())["dataset"] == dl["dataset"] == "acdc"
    assert not (dst / "images" / "patient002_frame01.nii.gz").exists()  # old content replaced
    acdc.prepare(src, dst, size=32)  # same dataset + source: rerun is allowed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["junk", "out", "src"]


def test_cli_error_and_success(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "data_prep", "acdc", str(tmp_path), str(tmp_path / "o")],
                       capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 2 and "data_prep: error:" in r.stderr and "no patientNNN folders found" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "o").exists()
    r = subprocess.run([sys.executable, "-m", "data_prep", "demo", str(tmp_path / "d"), "--num_patients", "3",
                        "--size", "32"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    dl = json.loads((tmp_path / "d" / "datalist.json").read_text())
    assert dl["dataset"] == "synthetic-acdc" and dl["spatial_size"] == [32, 32] and len(dl["training"]) == 2
