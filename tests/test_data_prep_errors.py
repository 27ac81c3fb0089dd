"""Bad input: one clear DataPrepError naming the file and what was expected, and no partial output."""

import json
import os
import shutil
import subprocess
import sys
import time
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
    """Write `arr` to `path`, keeping the file's own affine when it exists (else diag(zooms))."""
    affine = nib.load(path).affine if path.exists() else np.diag(list(zooms[:3]) + [1.0])
    nib.save(nib.Nifti1Image(arr, affine), path)


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
    _fails(lambda: acdc.prepare(src, dst, size=32), dst, str(f), str(_p2(src) / "patient002_frame01.nii.gz"),
           "does not cover the image", "image voxels lie outside the label", "expected a label on the image's voxel grid")


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


# ------------------------------------------------------------------ a label on another grid than its image
def _scan_pair(d: Path, lab_arr, lab_affine, name="s1"):
    """An image (40 x 36 x 4, 1.5 x 1.25 x 8 mm, origin (-20, 10, 5)) and its label `lab_arr` stored
    with `lab_affine` in the flat NIfTI layout (NAME.nii.gz + NAME_seg.nii.gz)."""
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(5)
    nib.save(nib.Nifti1Image(rng.random((40, 36, 4)).astype(np.float32), _IMG_AFFINE), d / f"{name}.nii.gz")
    nib.save(nib.Nifti1Image(np.ascontiguousarray(lab_arr), lab_affine), d / f"{name}_seg.nii.gz")
    return d


_IMG_AFFINE = np.array([[1.5, 0, 0, -20.0], [0, 1.25, 0, 10.0], [0, 0, 8.0, 5.0], [0, 0, 0, 1]])


def _asymmetric_label() -> np.ndarray:
    lab = np.zeros((40, 36, 4), np.uint8)
    lab[3:12, 5:9, :] = 1  # off-centre in x and y: any flip or swap of axes moves it
    lab[20:30, 20:33, 1:3] = 2
    return lab


def _prepared_label(src: Path, dst: Path) -> np.ndarray:
    nifti.prepare(src, dst, size=32, labelled_counts="1")
    return np.asarray(nib.load(dst / "labels" / "s1.nii.gz").dataobj)


def _voxel_map(affine, perm, flips, shape):
    """The affine of the same world grid stored with axes `perm` of the original and `flips` mirrored."""
    a = np.array(affine, float)
    out = np.eye(4)
    for new_axis, old_axis in enumerate(perm):
        col = a[:3, old_axis].copy()
        if new_axis in flips:
            out[:3, 3] += col * (shape[old_axis] - 1)
            col = -col
        out[:3, new_axis] = col
    out[:3, 3] += a[:3, 3]
    return out


def test_label_stored_mirrored_or_permuted_is_put_on_the_image_grid(tmp_path, caplog):
    lab = _asymmetric_label()
    want = _prepared_label(_scan_pair(tmp_path / "same", lab, _IMG_AFFINE), tmp_path / "want")
    assert (want == 1).any() and (want == 2).any()
    mirrored = lab[::-1]  # x stored mirrored, its affine flipped: the same world positions
    got = _prepared_label(_scan_pair(tmp_path / "mirror", mirrored, _voxel_map(_IMG_AFFINE, (0, 1, 2), {0}, lab.shape)),
                          tmp_path / "o1")
    np.testing.assert_array_equal(got, want)
    swapped = lab.transpose(1, 0, 2)[:, ::-1]  # x and y swapped, the new y mirrored
    with caplog.at_level("INFO", logger="data_prep"):
        got = _prepared_label(_scan_pair(tmp_path / "swap", swapped, _voxel_map(_IMG_AFFINE, (1, 0, 2), {1}, lab.shape)),
                              tmp_path / "o2")
    np.testing.assert_array_equal(got, want)
    assert "reoriented exactly" in caplog.text
    # a finer label grid covering the image (half the voxel size in-plane): nearest neighbour gives it back
    fine = np.repeat(np.repeat(lab, 2, axis=0), 2, axis=1)
    fine_affine = _IMG_AFFINE @ np.diag([0.5, 0.5, 1.0, 1.0])
    got = _prepared_label(_scan_pair(tmp_path / "fine", fine, fine_affine), tmp_path / "o3")
    np.testing.assert_array_equal(got, want)


def test_label_without_world_geometry_is_used_only_on_the_same_grid(tmp_path):
    lab = _asymmetric_label()
    img = nib.Nifti1Image(lab, None)  # no affine given: sform and qform codes 0, no world positions
    assert int(img.header["sform_code"]) == int(img.header["qform_code"]) == 0
    want = _prepared_label(_scan_pair(tmp_path / "same", lab, _IMG_AFFINE), tmp_path / "want")
    src = _scan_pair(tmp_path / "nogeo", lab, None)
    np.testing.assert_array_equal(_prepared_label(src, tmp_path / "o1"), want)  # same shape: the image's grid
    nib.save(nib.Nifti1Image(np.ascontiguousarray(lab[2:]), None), src / "s1_seg.nii.gz")
    dst = tmp_path / "o2"
    _fails(lambda: nifti.prepare(src, dst, size=32), dst, str(src / "s1_seg.nii.gz"), str(src / "s1.nii.gz"),
           "label shape (38, 36, 4) does not match image shape (40, 36, 4)", "no usable world geometry",
           "expected the same voxel grid")


def test_label_grid_not_covering_the_image_is_one_clear_error(tmp_path):
    shifted = _IMG_AFFINE.copy()
    shifted[0, 3] += 3 * 1.5  # 3 voxels along x: the image's first 3 columns have no label
    src = _scan_pair(tmp_path / "src", _asymmetric_label(), shifted)
    dst = tmp_path / "out"
    _fails(lambda: nifti.prepare(src, dst, size=32), dst, str(src / "s1_seg.nii.gz"), str(src / "s1.nii.gz"),
           "does not cover the image", f"{3 * 36 * 4} of {40 * 36 * 4} image voxels lie outside the label",
           "origin (-15.5, 10.0, 5.0) mm", "origin (-20.0, 10.0, 5.0) mm")


# ------------------------------------------------------------------------ command line and option values
def _main(argv, capsys):
    """`python -m data_prep ARGV` in this process: (exit code, stderr)."""
    from data_prep.__main__ import main
    from data_prep.common import log

    handlers = list(log.handlers)
    try:
        rc = main([str(a) for a in argv])
    finally:
        log.handlers[:] = handlers  # main's handler writes to capsys's stream, closed after this test
    return rc, capsys.readouterr().err


def test_misspelled_option_is_rejected_before_any_work(raw3, tmp_path, capsys):
    dst = tmp_path / "out"
    rc, err = _main(["acdc", raw3, dst, "--sise", "128"], capsys)
    assert rc == 2 and "data_prep: error: acdc: unknown option --sise; did you mean --size?" in err
    assert "Traceback" not in err
    assert not dst.exists() and not list(tmp_path.glob("out.tmp-*"))
    rc, err = _main(["demo", dst, "--num-patient=3"], capsys)
    assert rc == 2 and "unknown option --num-patient; did you mean --num_patients?" in err and not dst.exists()
    rc, err = _main(["synthetic", dst, "7", "0", "false", "extra"], capsys)
    assert rc == 2 and "unexpected extra argument(s) extra" in err and not dst.exists()


@pytest.mark.parametrize("command,kwargs,message", [
    ("acdc", {"size": "abc"}, "--size: expected an integer >= 8, got 'abc'"),
    ("acdc", {"size": 4}, "--size: expected an integer >= 8, got 4"),
    ("acdc", {"split_seed": "x"}, "--split_seed: expected an integer >= 0, got 'x'"),
    ("acdc", {"workers": 0}, "--workers: expected an integer >= 1, got 0"),
    ("acdc", {"seeds": "0,a"}, "--seeds: expected comma-separated integers >= 0, got '0,a'"),
    ("acdc", {"overwrite": "maybe"}, "--overwrite: expected true or false, got 'maybe'"),
    ("promise12", {"size": 12.5}, "--size: expected an integer >= 8, got 12.5"),
    ("nifti", {"num_partitions": "three"}, "--num_partitions: expected an integer >= 1, got 'three'"),
    ("nifti", {"num_classes": "two"}, "--num_classes: expected an integer >= 1, got 'two'"),
    ("nifti", {"labelled_counts": "0,2"}, "--labelled_counts: expected comma-separated integers >= 1, got '0,2'"),
    ("nifti", {"spacing": "abc"}, "--spacing: expected 'none' or a spacing in mm like 1.0, got 'abc'"),
    ("synthetic", {"num_patients": "abc"}, "--num_patients: expected an integer >= 1, got 'abc'"),
    ("demo", {"size": "abc"}, "--size: expected an integer >= 8, got 'abc'"),
])
def test_bad_option_value_names_the_option(raw3, tmp_path, command, kwargs, message):
    from data_prep.cli import COMMANDS

    dst = tmp_path / "out"
    args = (dst,) if command in ("synthetic", "demo") else (raw3, dst)
    _fails(lambda: COMMANDS[command](*args, **kwargs), dst, message)


def test_bad_option_value_on_the_command_line(raw3, tmp_path, capsys):
    dst = tmp_path / "out"
    rc, err = _main(["acdc", raw3, dst, "--size", "abc"], capsys)
    assert rc == 2 and err.strip().endswith("data_prep: error: --size: expected an integer >= 8, got 'abc'")
    assert "Traceback" not in err and not dst.exists() and not list(tmp_path.glob("out.tmp-*"))


# ------------------------------------------------------------------------- the raw data is never deleted
def _tree(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_overwrite_never_deletes_the_source(src, tmp_path):
    before = _tree(src)
    for dst, msg in ((src, "the destination is the input"), (tmp_path, "the destination contains the input"),
                     (src / "training", "lies inside the input")):
        with pytest.raises(DataPrepError) as ei:
            acdc.prepare(src, dst, size=32, overwrite=True)
        assert str(dst) in str(ei.value) and msg in str(ei.value) and "would delete" in str(ei.value)
        assert "expected a DST outside the input" in str(ei.value)
        assert _tree(src) == before and not list(dst.parent.glob(dst.name + ".tmp-*"))
    split = tmp_path / "out" / "split.json"  # an input inside DST: a rerun would delete it
    split.parent.mkdir()
    split.write_text("{}")
    with pytest.raises(DataPrepError, match="the destination contains the input .*split.json"):
        acdc.prepare(src, tmp_path / "out", size=32, split=split)
    assert split.read_text() == "{}"
    inside = src / "prepared"  # a data_prep output inside SRC may be replaced, with or without --overwrite
    acdc.prepare(src, inside, size=32)
    acdc.prepare(src, inside, size=32, overwrite=True)
    assert (inside / "datalist.json").is_file()
    shutil.rmtree(inside)
    lab_dir = _p2(src)  # nifti: the labels folder is an input too
    with pytest.raises(DataPrepError, match="the destination is the input"):
        nifti.prepare(src / "training" / "patient001", lab_dir, labels_dir=lab_dir, label_suffix="_gt", overwrite=True)
    assert _tree(src) == before


# ----------------------------------------------------------------- temporary folders of killed runs
def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _temp(dst: Path, suffix: str, owner: str | None = None, mtime: float | None = None) -> Path:
    t = dst.parent / f"{dst.name}{suffix}"
    (t / "images").mkdir(parents=True)
    (t / "images" / "a.nii.gz").write_bytes(b"x" * 100)
    if owner is not None:
        (t / ".data_prep_owner").write_text(owner + "\n")
    if mtime is not None:
        os.utime(t, (mtime, mtime))
    return t


def test_temporary_folders_of_killed_runs_are_removed_never_a_running_ones(tmp_path):
    import socket

    live = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        dst = tmp_path / "syn"
        dst.mkdir()
        (dst / "synthetic_phantoms.json").write_text("{}")  # an earlier output, replaced below
        dead = _dead_pid()
        stale = [_temp(dst, f".tmp-{dead}"), _temp(dst, f".tmp-{dead}-abc123", socket.gethostname()),
                 _temp(dst, f".old-{dead}"),
                 # the live process started after this folder was last written: its pid was reused
                 _temp(dst, f".tmp-{live.pid}-reused", mtime=time.time() - 3600)]
        kept = [_temp(dst, f".tmp-{live.pid}"),  # a running process's
                _temp(dst, f".tmp-{dead}-elsewhere", owner="another-host.example"),  # another host's
                _temp(tmp_path / "other", f".tmp-{dead}")]  # another destination's
        synthetic.generate(dst, num_patients=1)
        assert (dst / "synthetic_phantoms.json").is_file() and not (dst / ".data_prep_owner").exists()
        assert [t.exists() for t in stale] == [False] * len(stale)
        assert [t.exists() for t in kept] == [True] * len(kept)
    finally:
        live.communicate(b"")
    old_without_dst = _temp(tmp_path / "gone", f".old-{dead}")  # the only copy of a killed swap's output
    synthetic.generate(tmp_path / "fresh", num_patients=1)
    assert old_without_dst.exists()
