"""End-to-end tests of the meanteacher_seg bundle on the synthetic demo data, on the CPU.

Mean Teacher from a (tiny) pre-trained checkpoint through ``monai.bundle run`` (train -> evaluate -> inference,
as docs/README.md tells), the six other methods in-process for a few iterations, and MONAI's bundle properties.
A small U-Net (4-64) and 64 x 64 crops keep it fast.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from bundle_helpers import run_bundle, run_workflow, workflow

ROOT = Path(__file__).resolve().parents[1]
SMALL = "[4,8,16,32,64,4]"
SMALL_TUPLE = (4, 8, 16, 32, 64, 4)
FAST = dict(features=SMALL, crop_size=64, batch_size=2, unlabelled_batch_size=2, progress_bar=False, log_every=1)
METHODS = ("supervised", "mean_teacher", "ua_mt", "ict", "entropy_min", "mixup", "adversarial")
# each variant's default regulariser weight (its config sets it; the supervised method has none)
WEIGHTS = {"supervised": 0.0, "mean_teacher": 1.0, "ua_mt": 1.0, "ict": 0.1, "entropy_min": 0.01, "mixup": 0.1,
           "adversarial": 0.001}


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> Path:
    """A stand-in for a pretrain_bim checkpoint: a U-Net's state dict without its final 1x1 conv."""
    from bim.network import backbone_state_dict, build_unet

    torch.manual_seed(123)
    path = tmp_path_factory.mktemp("pre") / "model.pt"
    torch.save(backbone_state_dict(build_unet(out_channels=2, features=SMALL_TUPLE)), path)
    return path


@pytest.fixture(scope="module")
def mean_teacher_run(tmp_path_factory, pretrained, demo_dataset) -> dict:
    out = tmp_path_factory.mktemp("mt")
    proc = run_bundle(
        "meanteacher_seg", ["train.json", "variants/mean_teacher.json"], output_dir=out, pretrained=pretrained,
        dataset_dir=demo_dataset, epochs=2, iters_per_epoch=3, save_every=2, **FAST,
    )
    return {"dir": out, "log": proc.stdout + proc.stderr}


def test_mean_teacher_trains_from_pretrained_weights(mean_teacher_run, pretrained):
    out, log = mean_teacher_run["dir"], mean_teacher_run["log"]
    assert "pretrained: loaded" in log and "final_conv.bias, final_conv.weight" in log
    assert "loss_reg" in log and "weight" in log
    best = json.loads((out / "best_metric.json").read_text())
    assert best["method"] == "mean_teacher" and best["weights"] == "student" and best["pretrained"] == str(pretrained)
    student = torch.load(out / "model.pt", weights_only=True)
    assert student["final_conv.weight"].shape == (2, 4, 1, 1)
    final = torch.load(out / "checkpoint_final.pt", weights_only=True)
    assert int(final["teacher"]["n_averaged"]) == 1 + 6  # the copy + one EMA step per iteration
    assert final["trainer"]["iteration"] == 6


def test_evaluate_and_inference_as_finetune_seg(mean_teacher_run, demo_dataset, tmp_path):
    import nibabel as nib

    out = mean_teacher_run["dir"]
    # evaluate.json in this process, as `monai.bundle run` runs it; inference.json below through the command line
    run_workflow("meanteacher_seg", ["train.json", "evaluate.json"], output_dir=str(out),
                 dataset_dir=str(demo_dataset), features=list(SMALL_TUPLE))
    summary = json.loads((out / "eval" / "lv_n1_seed0_summary.json").read_text())
    rows = (out / "eval" / "lv_n1_seed0_dice.csv").read_text().splitlines()
    assert rows[0] == "scan,dice" and len(rows) == 1 + summary["n"] and summary["n"] >= 1
    assert 0.0 <= summary["mean"] <= 1.0 and summary["checkpoint"] == str(out / "model.pt")

    src = tmp_path / "in"
    src.mkdir()
    image = next((Path(demo_dataset) / "raw" / "training").glob("patient*/patient*_frame01.nii.gz"))
    shutil.copy(image, src / "case.nii.gz")
    run_bundle("meanteacher_seg", "inference.json", dataset_dir=src, output_dir=tmp_path / "pred",
               ckpt_path=out / "model.pt", features=SMALL)
    mask = nib.load(tmp_path / "pred" / "case_seg.nii.gz")
    assert mask.shape == nib.load(src / "case.nii.gz").shape


@pytest.mark.parametrize("method", [m for m in METHODS if m != "mean_teacher"])
def test_method_runs_end_to_end(method, tmp_path, demo_dataset):
    from bim.semi_supervised import METHODS

    wf = workflow("meanteacher_seg", ["train.json", f"variants/{method}.json"], output_dir=str(tmp_path),
                  dataset_dir=str(demo_dataset), epochs=1, iters_per_epoch=2, resume_from=None,
                  **{**FAST, "features": list(SMALL_TUPLE)})
    assert wf.check_properties() == []
    wf.run()
    trainer = wf.parser.get_parsed_content("train#trainer")
    assert type(wf.parser.get_parsed_content("train#step")) is METHODS[method]  # the variant names its class
    terms = trainer.state.output["terms"]
    assert trainer.state.iteration == 2 and (tmp_path / "model.pt").is_file()
    assert all(torch.isfinite(torch.as_tensor(v)).all() for v in terms.values())
    if method == "supervised":
        assert terms["weight"] == 0.0 and wf.parser.get_parsed_content("train#unlabelled_store") is None
    if method == "ua_mt":
        assert {"threshold", "certain_fraction"} <= set(terms)
    if method == "adversarial":
        assert "loss_disc" in terms
    best = json.loads((tmp_path / "best_metric.json").read_text())
    assert best["method"] == method and best["method_weight"] == WEIGHTS[method]


@pytest.mark.parametrize("overrides, message", [
    ({"method": "foo"}, "method must be one of supervised, mean_teacher, ua_mt, ict, entropy_min, mixup, adversarial; "
                        "got 'foo'"),
    ({"method": "ict"}, "method is 'ict' but train#step is MeanTeacher ('mean_teacher'): run with "
                        "configs/variants/ict.json, which builds train#step as InterpolationConsistency"),
])
def test_an_unknown_or_unbuilt_method_stops_the_run_naming_the_key(overrides, message, tmp_path, demo_dataset):
    with pytest.raises(Exception) as err:
        workflow("meanteacher_seg", "train.json", output_dir=str(tmp_path), dataset_dir=str(demo_dataset),
                 **{**FAST, "features": list(SMALL_TUPLE)}, **overrides).run()
    text = "".join(str(e) for e in (err.value, err.value.__cause__, err.value.__context__) if e)
    assert message in text
    assert not any(tmp_path.glob("*.pt"))  # stopped before training


def test_labelled_and_unlabelled_data_keys(demo_dataset, tmp_path):
    wf = workflow("meanteacher_seg", "train.json", output_dir=str(tmp_path), dataset_dir=str(demo_dataset))
    labelled = wf.parser.get_parsed_content("train#dataset#data")
    unlabelled = wf.parser.get_parsed_content("train#unlabelled_dataset#data")
    assert len(labelled) == 1 and all("label" in it for it in labelled)  # labelled_seed0_1
    training = json.loads((Path(demo_dataset) / "datalist.json").read_text())["training"]
    assert len(unlabelled) == len(training) > len(labelled)
    store = wf.parser.get_parsed_content("train#unlabelled_store")
    assert store.label is None  # labels of the training scans are not read
    assert wf.parser.get_parsed_content("teacher").decay == 0.99


def test_bundle_properties(mean_teacher_run, demo_dataset):
    ev = workflow("meanteacher_seg", ["train.json", "evaluate.json"], workflow_type="eval",
                  output_dir=str(mean_teacher_run["dir"]), dataset_dir=str(demo_dataset), features=list(SMALL_TUPLE))
    assert ev.check_properties() == []
    inf = workflow("meanteacher_seg", "inference.json", workflow_type="infer", dataset_dir=str(demo_dataset / "images"))
    assert inf.check_properties() == []
    meta = json.loads((ROOT / "bundles" / "meanteacher_seg" / "configs" / "metadata.json").read_text())
    assert meta["monai_version"] == "1.6.1" and meta["pytorch_version"] == "2.13.0" and meta["numpy_version"] == "2.4.6"
    assert meta["version"] in meta["changelog"]


@pytest.mark.parametrize("method", ["mean_teacher", "adversarial"])
def test_multi_gpu_config_runs_under_torchrun_on_cpu(method, demo_dataset, tmp_path):
    """multi_gpu_train.json under torchrun with 2 processes (gloo on CPU): the DDP student takes two forwards
    (labelled, unlabelled) before one backward, the teacher stays outside DDP, the discriminator is DDP too."""
    import subprocess

    from bundle_helpers import bundle_run_command

    out = tmp_path / method
    cmd = bundle_run_command("meanteacher_seg", ["train.json", f"variants/{method}.json", "multi_gpu_train.json"],
                             dataset_dir=demo_dataset, output_dir=out, epochs=1, iters_per_epoch=2, save_every=2, **FAST)
    cmd = [cmd[0], "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *cmd[1:]]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (out / "model.pt").is_file() and (out / "checkpoint_final.pt").is_file()


def test_weights_loaded_at_start_reach_the_teacher_too(demo_dataset, tmp_path):
    """MONAI Label loads ``model.pt`` into the student with a CheckpointLoader that runs when training starts, after
    the teacher was built from the student's random initialisation: the teacher must start from the loaded weights."""
    from monai.bundle import ConfigWorkflow

    from bim.network import build_unet
    from bundle_helpers import BUNDLES, purge_scripts_modules

    torch.manual_seed(7)
    loaded = build_unet(out_channels=2, features=SMALL_TUPLE).state_dict()
    torch.save(loaded, tmp_path / "model.pt")
    purge_scripts_modules()
    configs = BUNDLES / "meanteacher_seg" / "configs"
    wf = ConfigWorkflow(config_file=[str(configs / "train.json"), str(configs / "variants" / "mean_teacher.json")],
                        workflow_type="train", output_dir=str(tmp_path / "out"), dataset_dir=str(demo_dataset),
                        epochs=1, iters_per_epoch=1, **{**FAST, "features": list(SMALL_TUPLE)})
    wf.parser["train"]["handlers"].insert(0, {"_target_": "CheckpointLoader", "load_path": str(tmp_path / "model.pt"),
                                              "load_dict": {"model": "@network"}, "strict": True})
    wf.initialize()
    initial = {k: v.clone() for k, v in wf.parser.get_parsed_content("network").state_dict().items()}
    wf.run()
    teacher = wf.parser.get_parsed_content("teacher").module.state_dict()

    def distance(a, b):
        return sum(float((a[k].float() - b[k].float()).abs().sum()) for k in a if a[k].is_floating_point())

    assert distance(loaded, initial) > 0
    # one EMA step (decay 0.99) after one student step at LR <= 2e-5 from the loaded weights
    assert distance(teacher, loaded) < 0.02 * distance(initial, loaded)
