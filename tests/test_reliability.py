"""Bad inputs a careful user tries (docs/reliability.md): each stops with one clear last line that names
the key or file, what was expected and what was given, and leaves nothing behind."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from bundle_helpers import BUNDLES, workflow

ROOT = Path(__file__).resolve().parents[1]


def last_line_of(fn) -> str:
    """The ``error: ...`` line that ``bim.errors.excepthook`` prints last for the error ``fn()`` raises."""
    from bim.errors import last_line

    with pytest.raises(Exception) as err:
        fn()
    return last_line(err.value) or f"error: {err.value}"


CONFIGS = [("pretrain_bim", "train.json", "cluster_quality"), ("pretrain_bim", ["train.json", "evaluate.json"], "amp"),
           ("finetune_seg", "train.json", "amp"), ("finetune_seg", ["train.json", "evaluate.json"], "amp"),
           ("finetune_seg", "inference.json", "amp"), ("meanteacher_seg", "train.json", "compile_teacher"),
           ("meanteacher_seg", "inference.json", "amp")]


@pytest.mark.parametrize("bundle, configs, key", CONFIGS)
def test_a_boolean_key_given_as_a_lowercase_string_stops_every_config_with_the_key_named(bundle, configs, key, tmp_path):
    """``--amp false`` arrives as the string 'false', which ``if @amp`` takes for true: every config (train, evaluate,
    inference) checks its options first and names the key and the spelling to use."""
    line = last_line_of(lambda: workflow(bundle, configs, output_dir=str(tmp_path), **{key: "false"}))
    assert line == f"error: {key} must be True or False, got 'false' (write --{key} False)"
    assert not any(tmp_path.iterdir())  # stopped before anything was built


def test_every_config_checks_its_options_first():
    for path in sorted(BUNDLES.glob("*/configs/*.json")):
        config = json.loads(path.read_text())
        if "initialize" in config:  # files without one (pretrain_bim's evaluate.json) run train.json's
            assert config["initialize"][0] == "@check_options", path


@pytest.mark.parametrize("bundle, overrides, message", [
    ("finetune_seg", {"learning_rate": "abc"}, "learning_rate must be a number (default 2e-05), got 'abc'"),
    ("finetune_seg", {"seed": "abc"}, "seed must be an integer (default 0), got 'abc'"),
    ("finetune_seg", {"iters_per_epoch": 0}, "iters_per_epoch must be >= 1 (default 200), got 0"),
    ("finetune_seg", {"epochs": -1}, "epochs must be >= 1 (default 50), got -1"),
    ("meanteacher_seg", {"record_early_stop": [5, 0]}, "record_early_stop must be an integer >= 1 or a list of them "
                                                      "(such as [5, 10]), got [5, 0]"),
    ("pretrain_bim", {"crop_size": 8}, "crop_size must be >= 16 (default 224), got 8"),
    ("pretrain_bim", {"data_store": "gpu"}, "data_store must be one of 'auto', 'device', 'host' (default 'auto'), got 'gpu'"),
    ("pretrain_bim", {"data_memory_budget_gb": "lots"}, "data_memory_budget_gb must be 'auto' or a number (default "
                                                        "'auto'), got 'lots'"),
    ("pretrain_bim", {"data_memory_budget_gb": 0}, "data_memory_budget_gb must be > 0 (default 'auto'), got 0"),
    ("finetune_seg", {"learning_rate": -0.1}, "learning_rate must be > 0 (default 2e-05), got -0.1"),
    ("finetune_seg", {"epoch": 1}, "--epoch is not an option of this bundle (did you mean --epochs? --help True lists them)"),
    ("meanteacher_seg", {"consistency_weigth": 2}, "--consistency_weigth is not an option of this bundle (did you mean "
                                                    "--consistency_weight? --help True lists them)"),
])
def test_a_bad_option_value_or_an_unknown_key_stops_with_the_key_named(bundle, overrides, message, tmp_path):
    line = last_line_of(lambda: workflow(bundle, "train.json", output_dir=str(tmp_path), **overrides))
    assert line == f"error: {message}"
    assert not any(tmp_path.iterdir())


def test_help_lists_the_options_with_defaults_and_meanings_and_runs_nothing(tmp_path, capsys):
    from bim.options import main

    with pytest.raises(SystemExit) as done:
        workflow("finetune_seg", "train.json", dataset_dir=str(tmp_path / "absent"), help=True)
    assert done.value.code == 0
    printed = capsys.readouterr().out
    assert main([str(BUNDLES / "finetune_seg" / "configs" / "train.json")]) == 0
    listed = capsys.readouterr().out  # the same options, with the config's own defaults
    assert [line.split()[0] for line in listed.splitlines()] == [line.split()[0] for line in printed.splitlines()]
    assert [line.split()[1] for line in listed.splitlines() if line.startswith("--dataset_dir")] == ["null"]
    lines = {line.split()[0]: line for line in printed.splitlines()[1:]}
    assert lines["--dataset_dir"].split()[1] == json.dumps(str(tmp_path / "absent"))
    assert lines["--learning_rate"].split()[1:3] == ["2e-05", "peak"]
    assert lines["--epochs"].split()[1] == "50"
    assert "--help" not in lines and "--train" not in lines


def test_the_last_line_printed_for_a_wrapped_error_is_the_projects_message(capsys):
    """MONAI wraps a component's error in RuntimeError('Failed to instantiate ...'); the hook ends with ours."""
    from bim.engine import warmup_cosine_scheduler
    from bim.errors import excepthook

    try:
        try:
            warmup_cosine_scheduler(None, epochs=0, iters_per_epoch=10, warmup_epochs=0, start_ratio=0.01)
        except ValueError as e:
            raise RuntimeError("Failed to instantiate component 'x'\n set '_mode_=debug'") from e
    except RuntimeError as e:
        excepthook(type(e), e, e.__traceback__)
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == "error: the schedule needs >= 1 iteration, got epochs x iters_per_epoch = 0 x 10"
    assert "Traceback" in err  # the tracebacks come first, as Python prints them
    assert sys.excepthook is excepthook  # installed by importing bim


# ------------------------------------------------------------------------------------------ data where it enters

TINY = dict(features=[8, 16, 32, 64, 128, 8], crop_size=64, batch_size=2, progress_bar=False, epochs=1,
            iters_per_epoch=2, log_every=1, save_every=1)


@pytest.fixture
def dataset_copy(demo_dataset, tmp_path) -> Path:
    """A copy of the demo data set's prepared scans and datalist, to break one file of."""
    import shutil

    dst = tmp_path / "data"
    for name in ("images", "labels"):
        shutil.copytree(demo_dataset / name, dst / name)
    shutil.copy(demo_dataset / "datalist.json", dst / "datalist.json")
    return dst


def scan_file(dataset: Path, key: str, split: str, kind: str = "image") -> Path:
    return dataset / json.loads((dataset / "datalist.json").read_text())[key if split is None else split][0][kind]


def rewrite(path: Path, change) -> None:
    import nibabel as nib
    import numpy as np

    img = nib.load(str(path))
    data = change(np.asarray(img.dataobj).copy())
    nib.save(nib.Nifti1Image(data, img.affine, img.header), str(path))


@pytest.mark.parametrize("split, change, message", [
    ("labelled_seed0_1", lambda a: a.astype("float32") * float("nan"), "the image has {n} NaN or infinite voxel(s) of {n}"),
    ("validation", lambda a: a * 0 + 3, "the image is constant (every voxel 3.0)"),
])
def test_a_nan_or_constant_image_stops_training_naming_the_file(dataset_copy, tmp_path, split, change, message):
    path = scan_file(dataset_copy, None, split)
    rewrite(path, change)
    n = int(np.prod(nib_shape(path)))
    line = last_line_of(lambda: workflow("finetune_seg", "train.json", dataset_dir=str(dataset_copy), output_dir=str(tmp_path / "out"), **TINY).run())
    assert line.startswith(f"error: {path}: {message.format(n=n)}")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").glob("*.pt"))


def nib_shape(path: Path) -> tuple:
    import nibabel as nib

    return nib.load(str(path)).shape


def test_a_truncated_prepared_label_stops_training_naming_the_file(dataset_copy, tmp_path):
    path = scan_file(dataset_copy, None, "labelled_seed0_1", "label")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    line = last_line_of(lambda: workflow("finetune_seg", "train.json", dataset_dir=str(dataset_copy), output_dir=str(tmp_path / "out"), **TINY).run())
    assert line.startswith(f"error: {path}: cannot read this label file (EOFError")
    assert "it is truncated or not a NIfTI volume" in line
    assert not (tmp_path / "out").exists()


def test_a_label_value_outside_the_task_in_a_validation_scan_stops_with_rc_1_naming_the_file(dataset_copy, tmp_path):
    """It aborted the interpreter (rc 134) from MONAI's cache thread; now rc 1 and the file in the last line."""
    import subprocess

    from bundle_helpers import bundle_run_command

    path = scan_file(dataset_copy, None, "validation", "label")
    rewrite(path, lambda a: np.where(np.arange(a.size).reshape(a.shape) == 0, 7, a).astype(a.dtype))
    proc = subprocess.run(bundle_run_command("finetune_seg", "train.json", dataset_dir=dataset_copy,
                                             output_dir=tmp_path / "out", **dict(TINY, features="[8,16,32,64,128,8]")),
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stderr.splitlines()[-1] == (
        f"error: {path}: label values [7] cannot be mapped by task 'lv' (accepted values: [0, 1, 2, 3]; binary ACDC "
        f"left-ventricle cavity from label 3). Was the data set prepared for another task?")
    assert not (tmp_path / "out").exists()


def test_the_non_finite_loss_handler_names_the_first_bad_iteration_read_at_its_interval():
    """The loss is recorded on the device each iteration and read every gcd(every, save_every) iterations."""
    import torch
    from ignite.engine import Engine

    from bim.engine import NonFiniteLossError, StopOnNonFiniteLoss

    losses = [1.0, 2.0, float("inf"), float("nan"), 1.0, 1.0, 1.0, 1.0]
    seen = []
    engine = Engine(lambda e, b: seen.append(e.state.iteration) or {"loss": torch.tensor(losses[e.state.iteration - 1])})
    StopOnNonFiniteLoss(every=20, save_every=4).attach(engine)
    with pytest.raises(NonFiniteLossError, match=r"^the training loss is NaN or infinite from iteration 3 on \(checked "
                                                 r"at iteration 4\); training stopped\. Check the learning_rate"):
        engine.run(range(8), max_epochs=1)
    assert seen == [1, 2, 3, 4]
    finite = Engine(lambda e, b: {"loss": torch.tensor(1.0)})
    StopOnNonFiniteLoss(every=3).attach(finite)
    finite.run(range(5), max_epochs=1)  # checked at 3 and at the end: nothing to say


def test_a_nan_loss_stops_training_before_any_checkpoint(demo_dataset, tmp_path):
    out = tmp_path / "out"
    line = last_line_of(lambda: workflow("finetune_seg", "train.json", dataset_dir=str(demo_dataset), output_dir=str(out),
                          **dict(TINY, iters_per_epoch=4, log_every=2, save_every=2),
                          **{"train#trainer#loss_function": "$lambda logits, label: logits.mean() * float('nan')"}).run())
    assert line.startswith("error: the training loss is NaN or infinite from iteration 1 on (checked at iteration 2)")
    assert not list(out.glob("*.pt"))


# ------------------------------------------------------------------------------------------------- evaluate.json


def random_model(out: Path, features=TINY["features"]) -> Path:
    """A model.pt as a stopped training leaves it: the best weights, no checkpoint_final.pt."""
    import torch

    from bim.network import build_unet

    out.mkdir(parents=True, exist_ok=True)
    torch.save(build_unet(out_channels=2, features=features).state_dict(), out / "model.pt")
    return out / "model.pt"


def test_evaluate_refuses_the_model_of_an_unfinished_run_unless_allowed(demo_dataset, tmp_path, capfd):
    out = tmp_path / "run"
    model = random_model(out)
    common = dict(dataset_dir=str(demo_dataset), output_dir=str(out), features=TINY["features"])
    line = last_line_of(lambda: workflow("finetune_seg", ["train.json", "evaluate.json"], **common).run())
    assert line == (f"error: {model} comes from a training that did not finish: {out / 'checkpoint_final.pt'} does not "
                    f"exist (the run was stopped or is still running). Finish it (run train.json again with the same "
                    f"output_dir: it resumes), or pass --allow_unfinished True to evaluate these weights anyway")
    assert not (out / "eval").exists()
    capfd.readouterr()
    workflow("finetune_seg", ["train.json", "evaluate.json"], allow_unfinished=True, **common).run()
    assert (out / "eval" / "lv_n1_seed0_summary.json").is_file()
    log = "".join(capfd.readouterr())
    assert "comes from a training that did not finish" in log and f"evaluating the weights of {model}" in log
    assert "Got new best metric" not in log and "random initialisation" not in log
    assert "test Dice" in log


# ------------------------------------------------------------------------------------------------ inference.json


def test_inference_on_a_patient_folder_segments_the_images_not_the_label_files(demo_dataset, tmp_path, capfd):
    import shutil

    patient = tmp_path / "patient001"
    shutil.copytree(demo_dataset / "raw" / "training" / "patient001", patient)
    out = tmp_path / "pred"
    model = random_model(tmp_path / "run")
    capfd.readouterr()
    workflow("finetune_seg", "inference.json", dataset_dir=str(patient), output_dir=str(out), ckpt_path=str(model),
             features=TINY["features"]).run()
    assert sorted(p.name for p in out.iterdir()) == ["patient001_frame01_seg.nii.gz", "patient001_frame11_seg.nii.gz"]
    log = "".join(capfd.readouterr())
    assert (f"2 label file(s) in {patient} left out (patient001_frame01_gt.nii.gz, patient001_frame11_gt.nii.gz: "
            f"names ending in _gt, _seg, _segmentation)") in log
    assert f"2 segmentation(s) written to {out} (<name>_seg.nii.gz)" in log


@pytest.mark.parametrize("shape", [(32, 32, 4, 3), (32, 32)])
def test_inference_on_a_4d_or_2d_scan_stops_naming_the_file(tmp_path, shape):
    import nibabel as nib

    scan = tmp_path / "scans" / "series.nii.gz"
    scan.parent.mkdir()
    nib.save(nib.Nifti1Image(np.random.default_rng(0).random(shape, dtype=np.float32), np.eye(4)), str(scan))
    model = random_model(tmp_path / "run")
    wf = workflow("finetune_seg", "inference.json", dataset_dir=str(scan.parent), output_dir=str(tmp_path / "pred"),
                  ckpt_path=str(model), features=TINY["features"])
    assert last_line_of(wf.run) == f"error: {scan}: expected image to be a 3D scan (H, W, D), got shape {shape}"
    assert not (tmp_path / "pred").exists()


# ------------------------------------------------------------------------------------------- checkpoints, weights


def test_a_truncated_checkpoint_last_stops_the_resume_naming_the_file_and_the_way_out(demo_dataset, tmp_path):
    import torch

    out = tmp_path / "out"
    out.mkdir()
    ckpt = out / "checkpoint_last.pt"
    torch.save({"network": {"w": torch.zeros(1000)}}, ckpt)
    ckpt.write_bytes(ckpt.read_bytes()[:300])
    truncated = ckpt.read_bytes()
    line = last_line_of(lambda: workflow("finetune_seg", "train.json", dataset_dir=str(demo_dataset), output_dir=str(out), **TINY).run())
    assert line.startswith(f"error: checkpoint {ckpt}: not a valid weights file (")
    assert line.endswith("it is truncated, corrupt or not a PyTorch weights file: delete it to start afresh, or choose "
                         "another output_dir (or pass --resume_from None)")
    assert [p.name for p in out.glob("*.pt")] == ["checkpoint_last.pt"] and ckpt.read_bytes() == truncated


@pytest.mark.parametrize("content", [b"not a checkpoint at all", b"PK\x03\x04 truncated zip"])
def test_a_corrupt_pretrained_file_is_named_as_not_a_valid_weights_file(demo_dataset, tmp_path, content):
    bad = tmp_path / "model.pt"
    bad.write_bytes(content)
    line = last_line_of(lambda: workflow("finetune_seg", "train.json", dataset_dir=str(demo_dataset), output_dir=str(tmp_path / "out"),
                          pretrained=str(bad), **TINY).run())
    assert line.startswith(f"error: --pretrained {bad}: not a valid weights file (")
    assert line.endswith("it is truncated, corrupt or not a PyTorch weights file: pass a pretrain_bim model.pt or a "
                         "bundle checkpoint")
    assert "weights_only" not in line
    assert not (tmp_path / "out").exists()
