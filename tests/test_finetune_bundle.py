"""End-to-end tests of the finetune_seg bundle on the synthetic demo data, on the CPU.

pre-train (tiny) -> fine-tune 1 labelled scan (LV) -> evaluate -> inference (``monai.bundle run``), TorchScript
export, ``verify_net_in_out``, bundle properties and resume (MONAI Label: tests/test_monailabel.py). Bundles run in
subprocesses from the repository root, as docs/README.md tells; a small U-Net (8-128) keeps them fast.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tolerance import assert_close_to_scale, conv_reduction_length

from bim.onnx_cpu import onnxruntime_available
from bundle_helpers import messages_of, purge_scripts_modules

ROOT = Path(__file__).resolve().parents[1]
BUNDLE = ROOT / "bundles" / "finetune_seg"
CONFIGS = BUNDLE / "configs"
SMALL = "[8,16,32,64,128,8]"
SMALL_TUPLE = (8, 16, 32, 64, 128, 8)


def monai_bundle(*args: str, env: dict | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "monai.bundle", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    if proc.returncode != 0:
        raise AssertionError(f"monai.bundle {args[:3]} failed ({proc.returncode}):\n{proc.stdout[-5000:]}\n{proc.stderr[-5000:]}")
    return proc


def run_config(configs, **overrides) -> subprocess.CompletedProcess:
    files = [c if os.path.isabs(c) else f"bundles/finetune_seg/configs/{c}" for c in ([configs] if isinstance(configs, str) else configs)]
    cfg = files[0] if len(files) == 1 else "[" + ",".join(f"'{f}'" for f in files) + "]"
    args = ["run", "--config_file", cfg, "--logging_file", "bundles/finetune_seg/configs/logging.conf"]
    for k, v in overrides.items():
        args += [f"--{k}", str(v)]
    return monai_bundle(*args)


def run_in_process(configs, **overrides):
    """A run of ``run_config``'s configs as ``monai.bundle run`` runs them, in this process (``SMALL``, the command
    line's widths, as the list it parses to): for runs whose point is the configs' work, not the command line."""
    from bundle_helpers import run_workflow

    values = {k: list(SMALL_TUPLE) if v == SMALL else str(v) if isinstance(v, Path) else v for k, v in overrides.items()}
    return run_workflow("finetune_seg", configs, **values)


FAST = dict(features=SMALL, crop_size=96, batch_size=8, progress_bar=False, log_every=25)


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pretrain")
    # in this process, as `monai.bundle run` runs it (pretrain_bim's command line: tests/test_pretrain_bundle.py)
    from bundle_helpers import run_workflow

    run_workflow("pretrain_bim", "train.json", output_dir=str(out), epochs=1, iters_per_epoch=4, crop_size=64,
                 scans_per_batch=2, features=list(SMALL_TUPLE), progress_bar=False, panel_every=1000,
                 # MONAI's U-Net: usable after the few CPU iterations of these tests (the authors' style needs longer)
                 unet_style="monai")
    assert (out / "model.pt").is_file()
    return out / "model.pt"


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory, pretrained) -> dict:
    """Fine-tune LV from 1 labelled scan: 3 epochs x 40 iterations, batch 8, 96 x 96 crops, peak LR 3e-3."""
    out = tmp_path_factory.mktemp("finetune")
    proc = run_config("train.json", output_dir=out, pretrained=pretrained, task="lv", labelled_scans=1, epochs=3,
                      iters_per_epoch=40, warmup_epochs=1, learning_rate=0.003, **FAST)
    return {"dir": out, "log": proc.stdout + proc.stderr}


def test_pretrained_weights_loaded_except_final_conv(finetuned):
    log = finetuned["log"]
    assert "pretrained: loaded 134/136 tensors of the network" in log
    assert "not loaded (kept their initialisation): final_conv.bias, final_conv.weight" in log
    best = json.loads((finetuned["dir"] / "best_metric.json").read_text())
    assert best["metric"] == "val_mean_dice" and best["task"] == "lv" and 1 <= best["epoch"] <= 3
    state = torch.load(finetuned["dir"] / "model.pt", weights_only=True)  # plain state dict
    assert state["final_conv.weight"].shape == (2, 8, 1, 1)


def test_finetuned_beats_untrained_on_test_scans(finetuned, tmp_path):
    # in this process, as `monai.bundle run` runs it (evaluate.json's command line: tests/test_experiments_grid.py)
    run_in_process(["train.json", "evaluate.json"], output_dir=finetuned["dir"], features=SMALL,
                   task="lv", labelled_scans=1)
    summary = json.loads((finetuned["dir"] / "eval" / "lv_n1_seed0_summary.json").read_text())
    rows = (finetuned["dir"] / "eval" / "lv_n1_seed0_dice.csv").read_text().splitlines()
    assert rows[0] == "scan,dice" and len(rows) == 1 + summary["n"] == 5
    dice = [float(r.split(",")[1]) for r in rows[1:]]
    assert summary["mean"] == pytest.approx(np.mean(dice), abs=1e-5)
    assert summary["std"] == pytest.approx(np.std(dice), abs=1e-5)
    assert summary["checkpoint"].endswith("model.pt") and summary["task"] == "lv"
    # the prediction panel: one row (image | outlines) per test scan, captioned with its Dice
    from PIL import Image

    panel = np.asarray(Image.open(finetuned["dir"] / "eval" / "lv_n1_seed0_predictions.png"))
    n = summary["n"]
    assert panel.shape[0] % n == 0 and panel.shape[1] == 2 * (panel.shape[0] // n) and panel.shape[2] == 3
    green = (panel[..., 1] > 200) & (panel[..., 0] < 50)
    assert green[:, panel.shape[1] // 2:].any() and not green[:, : panel.shape[1] // 2].any()  # outlines on the right

    from bim.network import build_unet

    torch.manual_seed(0)
    untrained = tmp_path / "untrained"
    untrained.mkdir()
    torch.save(build_unet(out_channels=2, features=SMALL_TUPLE).state_dict(), untrained / "model.pt")
    # the same evaluation in-process (ConfigWorkflow, as MONAI's run() does it), saving a subprocess start
    from monai.bundle import ConfigWorkflow

    purge_scripts_modules()
    sys.path.insert(1, str(BUNDLE))
    try:
        wf = ConfigWorkflow(config_file=[str(CONFIGS / "train.json"), str(CONFIGS / "evaluate.json")],
                            workflow_type="infer", output_dir=str(untrained), features=list(SMALL_TUPLE), task="lv",
                            allow_unfinished=True)  # weights of no training run
        wf.initialize()
        wf.run()
    finally:
        sys.path.remove(str(BUNDLE))
        purge_scripts_modules()
    base = json.loads((untrained / "eval" / "lv_n1_seed0_summary.json").read_text())
    print(f"test Dice: fine-tuned {summary['mean']:.3f}, untrained {base['mean']:.3f}")
    assert summary["mean"] > base["mean"] + 0.2, (summary, base)


def _raw_scan(tmp_path: Path) -> tuple[Path, Path]:
    """A raw synthetic scan at its own spacing (not 1 mm), as a user would give it to inference."""
    from data_prep import ensure_demo_dataset

    raw = Path(ensure_demo_dataset()) / "raw" / "training" / "patient002"
    src = tmp_path / "in"
    src.mkdir()
    shutil.copy(raw / "patient002_frame01.nii.gz", src / "case.nii.gz")
    return src / "case.nii.gz", raw / "patient002_frame01_gt.nii.gz"


def test_inference_writes_masks_in_the_input_geometry(finetuned, tmp_path):
    import nibabel as nib

    image, gt = _raw_scan(tmp_path)
    out = tmp_path / "out"
    run_config("inference.json", dataset_dir=image.parent, output_dir=out, ckpt_path=finetuned["dir"] / "model.pt",
               features=SMALL, task="lv")
    mask = nib.load(out / "case_seg.nii.gz")
    src = nib.load(image)
    assert mask.shape == src.shape
    np.testing.assert_allclose(mask.affine, src.affine, atol=1e-4)
    assert abs(float(src.header.get_zooms()[0]) - 1.0) > 0.1  # really resampled and back
    pred = np.asarray(mask.dataobj)
    truth = np.asarray(nib.load(gt).dataobj) == 3
    assert set(np.unique(pred)) <= {0, 1}
    dice = 2 * np.logical_and(pred == 1, truth).sum() / ((pred == 1).sum() + truth.sum())
    assert dice > 0.5, dice


@pytest.mark.skipif(not onnxruntime_available(), reason="onnx and onnxruntime are not installed")
def test_inference_through_onnxruntime_writes_torchs_masks(finetuned, tmp_path):
    """inference.json's ``cpu_backend``: ONNX Runtime's fp32 logits are torch's fp32 logits up to rounding, so the
    masks agree (a voxel may flip only where two classes' logits tie to ~1e-6). ``cpu_bf16`` false: on a CPU with
    native bf16, torch would otherwise run in bf16, whose rounding flips more voxels."""
    import nibabel as nib

    image, _ = _raw_scan(tmp_path)
    masks = {}
    for backend in ("torch", "onnxruntime"):  # in this process (inference.json's command line: the test above)
        out = tmp_path / backend
        with messages_of("bim") as said:
            run_in_process("inference.json", dataset_dir=image.parent, output_dir=out,
                           ckpt_path=finetuned["dir"] / "model.pt", features=SMALL, task="lv", cpu_backend=backend,
                           cpu_bf16=False)
        assert any("through ONNX Runtime" in line for line in said) is (backend == "onnxruntime")
        masks[backend] = np.asarray(nib.load(out / "case_seg.nii.gz").dataobj)
    assert masks["torch"].sum() > 0
    assert float((masks["torch"] == masks["onnxruntime"]).mean()) >= 0.9999


def test_torchscript_export_and_verify_net_in_out(finetuned, tmp_path):
    env = {"PYTHONPATH": str(BUNDLE)}
    meta, cfg = "bundles/finetune_seg/configs/metadata.json", "bundles/finetune_seg/configs/inference.json"
    ts = tmp_path / "model.ts"
    monai_bundle("ckpt_export", "network_def", "--filepath", str(ts), "--ckpt_file", str(finetuned["dir"] / "model.pt"),
                 "--meta_file", meta, "--config_file", cfg, "--features", SMALL, env=env)
    scripted = torch.jit.load(str(ts))
    from bim.network import build_unet

    net = build_unet(out_channels=2, features=SMALL_TUPLE)
    net.load_state_dict(torch.load(finetuned["dir"] / "model.pt", weights_only=True))
    x = torch.rand(2, 1, 64, 48)
    with torch.no_grad():
        # TorchScript may fuse or order the sums otherwise: rounding of the longest conv sum at the logits' scale
        assert_close_to_scale(scripted.eval()(x), net.eval()(x), conv_reduction_length(net), "scripted vs eager")
    # MONAI's check in this process, as its command line calls it (the command line: ckpt_export's, above)
    from monai.bundle import verify_net_in_out

    purge_scripts_modules()
    sys.path.insert(1, str(BUNDLE))
    try:
        with messages_of("monai.bundle.scripts") as said:  # MONAI's own logger, which propagates nothing to the root
            verify_net_in_out("network_def", meta_file=str(ROOT / meta), config_file=str(ROOT / cfg))
    finally:
        sys.path.remove(str(BUNDLE))
        purge_scripts_modules()
    assert any("verified with no error" in line for line in said), said


@pytest.mark.parametrize(
    "configs,workflow_type,overrides",
    [
        (["train.json"], "train", {}),
        (["train.json", "evaluate.json"], "infer", {}),
        (["inference.json"], "infer", {}),
    ],
    ids=["train", "evaluate", "inference"],
)
def test_bundle_properties(configs, workflow_type, overrides, finetuned, tmp_path):
    from monai.bundle import ConfigWorkflow

    purge_scripts_modules()
    sys.path.insert(1, str(BUNDLE))
    try:
        files = [str(CONFIGS / c) for c in configs]
        extra = {"output_dir": str(finetuned["dir"]), "features": list(SMALL_TUPLE)}
        if configs == ["inference.json"]:
            image, _ = _raw_scan(tmp_path)
            extra = {"dataset_dir": str(image.parent), "ckpt_path": str(finetuned["dir"] / "model.pt"),
                     "output_dir": str(tmp_path / "pred"), "features": list(SMALL_TUPLE)}
        wf = ConfigWorkflow(config_file=files if len(files) > 1 else files[0], meta_file=str(CONFIGS / "metadata.json"),
                            logging_file=str(CONFIGS / "logging.conf"), workflow_type=workflow_type, **extra, **overrides)
        wf.initialize()
        assert wf.check_properties() == []
    finally:
        sys.path.remove(str(BUNDLE))
        purge_scripts_modules()


def test_unknown_task_fails_with_a_clear_error():
    from monai.bundle import ConfigParser

    purge_scripts_modules()
    sys.path.insert(1, str(BUNDLE))
    try:
        for config in ("train.json", "inference.json"):
            parser = ConfigParser()
            parser.read_config(str(CONFIGS / config))
            parser["task"] = "liver"
            with pytest.raises(Exception) as err:
                parser.get_parsed_content("network_def")
            chain, e = [], err.value
            while e is not None:  # monai wraps the error of a component in a RuntimeError
                chain.append(str(e))
                e = e.__cause__
            assert "unknown task 'liver'; choose one of ['acdc', 'lv', 'myo', 'prostate', 'rv']" in "\n".join(chain)
    finally:
        sys.path.remove(str(BUNDLE))
        purge_scripts_modules()


def test_resume_continues_the_same_run(tmp_path):
    """A run stopped after iteration 4 of 6 (mid-epoch, checkpoint every 2) and started again with the same
    command ends with the same weights, bit for bit, as the run that was never stopped."""
    common = dict(FAST, crop_size=64, batch_size=2, epochs=2, iters_per_epoch=3, save_every=2, learning_rate=0.003,
                  warmup_epochs=1, task="acdc")
    stop = tmp_path / "stop_after_4.json"
    stop.write_text(json.dumps({"run": [
        "$@train#trainer.add_event_handler(ignite.engine.Events.ITERATION_COMPLETED(once=4), lambda e: e.terminate())",
        "$@train#trainer.run()",
    ], "imports": ["$import torch", "$import monai", "$import ignite"]}))
    # the run never stopped and the stopped run in this process, as `monai.bundle run` runs them; the run started
    # again is the command line's
    run_in_process("train.json", output_dir=tmp_path / "straight", **common)
    run_in_process(["train.json", str(stop)], output_dir=tmp_path / "resumed", **common)
    stopped = torch.load(tmp_path / "resumed" / "checkpoint_last.pt", weights_only=True)
    assert stopped["trainer"]["iteration"] == 4
    proc = run_config("train.json", output_dir=tmp_path / "resumed", **common)
    log = proc.stdout + proc.stderr
    assert f"resuming from {tmp_path / 'resumed' / 'checkpoint_last.pt'}" in log
    a = torch.load(tmp_path / "straight" / "checkpoint_final.pt", weights_only=True)
    b = torch.load(tmp_path / "resumed" / "checkpoint_final.pt", weights_only=True)
    assert a["trainer"]["iteration"] == b["trainer"]["iteration"] == 6
    for k in a["network"]:
        assert torch.equal(a["network"][k], b["network"][k]), k
    assert a["best_saver"]["best_epoch"] == b["best_saver"]["best_epoch"]
    assert json.loads((tmp_path / "resumed" / "best_metric.json").read_text())["task"] == "acdc"


@pytest.mark.parametrize("patience, last_epoch", [(1, 2), (None, 4)])
def test_early_stopping_ends_the_run_after_patience_validations_without_gain(tmp_path, patience, last_epoch):
    """With a learning rate of 1e-12 and a BatchNorm momentum of 1e-12 neither
    the weights nor the running statistics move (in float32), so every validation
    repeats the first one's Dice: patience 1 stops after the second epoch; without patience all 4 epochs run."""
    overrides = dict(FAST, crop_size=64, batch_size=2, epochs=4, iters_per_epoch=2, warmup_epochs=0,
                     learning_rate=1e-12, bn_momentum=1e-12, task="lv")
    if patience is not None:
        overrides["early_stop_patience"] = patience
    run_in_process("train.json", output_dir=tmp_path, **overrides)  # in this process, as `monai.bundle run` runs it
    final = torch.load(tmp_path / "checkpoint_final.pt", weights_only=True)
    assert final["trainer"]["iteration"] == last_epoch * 2
    assert json.loads((tmp_path / "best_metric.json").read_text())["epoch"] == 1


@pytest.mark.parametrize("pretrained, record, expected", [
    (None, None, None), ("runs/pretrain/model.pt", None, 5), ("runs/pretrain/model.pt", [5, 10], None), (None, 10, None)])
def test_early_stop_patience_defaults_to_5_from_pretrained_weights_only(pretrained, record, expected):
    """From pre-trained weights fine-tuning stops after 5 validations without gain; from random init, or while
    record_early_stop records the stops of a full-length run, all epochs run; an explicit value wins."""
    from monai.bundle import ConfigParser

    parser = ConfigParser()
    parser.read_config(str(CONFIGS / "train.json"))
    parser["pretrained"], parser["record_early_stop"] = pretrained, record
    assert parser.get_parsed_content("early_stop_patience") == expected
    parser["early_stop_patience"] = 10
    assert parser.get_parsed_content("early_stop_patience") == 10


def test_record_early_stop_trains_all_epochs_and_keeps_the_model_early_stopping_would_have_kept(tmp_path):
    """The same frozen run as above with ``--record_early_stop 5,1`` (two patiences, as the command line writes
    them) instead of ``early_stop_patience 1``: all 4 epochs run; patience 1 would have stopped after epoch 2 with
    the best weights of epoch 1, which ``model_patience1.pt`` holds; patience 5 never runs out and keeps the same."""
    overrides = dict(FAST, crop_size=64, batch_size=2, epochs=4, iters_per_epoch=2, warmup_epochs=0,
                     learning_rate=1e-12, bn_momentum=1e-12, task="lv", record_early_stop="5,1")
    run_config("train.json", output_dir=tmp_path, **overrides)
    assert torch.load(tmp_path / "checkpoint_final.pt", weights_only=True)["trainer"]["iteration"] == 8
    records = json.loads((tmp_path / "early_stop_record.json").read_text())
    assert [(r["patience"], r["stopped"], r["epoch"], r["iteration"], r["best_epoch"], r["run_epochs"])
            for r in records] == [(1, True, 2, 4, 1, 4), (5, False, 4, 8, 1, 4)]
    assert 0 < records[0]["seconds"] <= records[1]["seconds"] <= records[1]["run_seconds"]
    best = torch.load(tmp_path / "model.pt", weights_only=True)
    for n in (1, 5):
        kept = torch.load(tmp_path / f"model_patience{n}.pt", weights_only=True)
        assert kept.keys() == best.keys() and all(torch.equal(kept[k], best[k]) for k in best)
