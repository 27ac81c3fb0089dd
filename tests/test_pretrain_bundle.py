"""The pretrain_bim bundle end to end: properties, outputs, every Table 1 variant, determinism, resume (its
inference.json, TorchScript export and shape check: test_pretrain_inference.py)."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from bundle_helpers import BUNDLES, ROOT, bundle_run_command, run_bundle, run_workflow, workflow

VARIANTS = sorted(p.stem for p in (BUNDLES / "pretrain_bim" / "configs" / "variants").glob("*.json"))
TINY = dict(epochs=1, iters_per_epoch=2, crop_size=64, scans_per_batch=2, log_every=1, panel_every=100, save_every=100,
            progress_bar=False, features=[8, 8, 16, 16, 32, 8], num_clusters=10, num_subheads=1)


def _train_workflow(demo_dataset, out, configs=("train.json",), **overrides):
    return workflow("pretrain_bim", list(configs), dataset_dir=str(demo_dataset), output_dir=str(out), **{**TINY, **overrides})


def test_train_config_has_every_required_property(demo_dataset, tmp_path):
    wf = _train_workflow(demo_dataset, tmp_path)
    assert wf.check_properties() == []


def test_bundle_runs_end_to_end_and_writes_weights_and_cluster_panel(demo_dataset, tmp_path):
    out = tmp_path / "run"
    proc = run_bundle("pretrain_bim", "train.json", dataset_dir=demo_dataset, output_dir=out, epochs=2,
                      iters_per_epoch=2, crop_size=64, scans_per_batch=2, log_every=1, panel_every=2, save_every=2,
                      progress_bar=False)
    state = torch.load(out / "model.pt", weights_only=True)
    from bim.pretrain.model import BIMClusterNet

    BIMClusterNet(unet_style="authors").load_state_dict(state)  # the default network_def, strictly: U-Net without final_conv + heads
    assert not any(k.startswith("unet.final_conv.") for k in state) and "cluster_head.heads.2.weight" in state
    panels = sorted((out / "panels").glob("clusters_iter*.png"))
    assert [p.name for p in panels] == ["clusters_iter000002.png", "clusters_iter000004.png"]
    from PIL import Image

    w, h = Image.open(panels[-1]).size
    assert w == 4 * (64 + 4) and h % (64 + 4) == 0  # image | clusters | entropy | edges, one row per slice
    assert (out / "checkpoint_final.pt").is_file() and (out / "checkpoint_last.pt").is_file()
    assert "clusters in use" in proc.stdout and "mi:" in proc.stdout and "cc:" in proc.stdout and "con:" in proc.stdout
    # the clusters scored against the demo set's labelled validation scans (labels never used for training)
    quality = json.loads((out / "cluster_quality.json").read_text())
    assert quality["split"] == "validation" and quality["scans"] >= 1 and set(quality["classes"]) == {"RV", "Myo", "LV"}
    assert all(0 <= v["pooled_dice"] <= 1 and 0 <= v["per_scan_dice"] <= 1 for v in quality["classes"].values())
    assert "cluster quality on" in proc.stdout + proc.stderr
    # evaluate.json scores the final checkpoint on the test scans; the validation score above comes out again
    # (in this process, as `monai.bundle run` runs them: the command line is tested by the training run above and,
    # for path_dependence.json, by the dense_level test)
    data = dict(dataset_dir=str(demo_dataset), output_dir=str(out))
    run_workflow("pretrain_bim", ["train.json", "evaluate.json"], **data, cluster_quality_split="validation")
    again = json.loads((out / "cluster_quality_validation.json").read_text())
    for name, v in quality["classes"].items():
        assert again["classes"][name]["pooled_dice"] == pytest.approx(v["pooled_dice"], abs=1e-6)
    run_workflow("pretrain_bim", ["train.json", "evaluate.json"], **data)
    assert json.loads((out / "cluster_quality_test.json").read_text())["split"] == "test"
    # path_dependence.json: for each encoder level, the share of pixels whose cluster changes without its spatial
    # information, and the cluster scores then
    run_workflow("pretrain_bim", ["train.json", "path_dependence.json"], **data)
    paths = json.loads((out / "path_dependence_validation.json").read_text())
    assert paths["split"] == "validation" and paths["scans"] == quality["scans"] and set(paths["levels"]) == set("01234")
    assert all(0 <= v["changed"] <= 1 and 0 <= v["changed_in_structures"] <= 1 and set(v["pooled_dice"]) == {"RV", "Myo", "LV"}
               for v in paths["levels"].values())
    assert not list(out.rglob("*.tmp")), "no temporary files are left behind"


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_parses_and_trains(variant, demo_dataset, tmp_path):
    cfg = json.loads((BUNDLES / "pretrain_bim" / "configs" / "variants" / f"{variant}.json").read_text())
    wf = _train_workflow(demo_dataset, tmp_path, ("train.json", f"variants/{variant}.json"))
    trainer = wf.parser.get_parsed_content("train#trainer")
    trainer.run()
    out = trainer.state.output
    active = {k for k, v in trainer.loss_weights.items() if v}
    expected = {k for k, v in cfg["loss_weights"].items() if v not in (0, 0.0)}
    assert active == expected
    assert active <= set(out) and not ({"mi", "cc", "con", "imsat", "local_con"} - active) & set(out)
    assert all(torch.isfinite(out[k]) for k in active)
    if variant == "iic_dec":
        assert trainer.alpha == 0.0
    assert (tmp_path / "model.pt").is_file()


def _losses_of_a_run(demo_dataset, out):
    wf = _train_workflow(demo_dataset, out, iters_per_epoch=3)
    trainer = wf.parser.get_parsed_content("train#trainer")
    seen = []
    from ignite.engine import Events

    trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda e: seen.append({k: float(v) for k, v in e.state.output.items()}))
    trainer.run()
    return seen


def test_same_seed_gives_identical_losses_on_cpu(demo_dataset, tmp_path):
    a = _losses_of_a_run(demo_dataset, tmp_path / "a")
    b = _losses_of_a_run(demo_dataset, tmp_path / "b")
    assert len(a) == 3 and a == b
    c = _train_workflow(demo_dataset, tmp_path / "c", seed=1, iters_per_epoch=1).parser.get_parsed_content("train#trainer")
    c.run()
    assert float(c.state.output["loss"]) != a[0]["loss"]


def test_killed_run_resumes_to_the_same_weights(demo_dataset, tmp_path):
    common = dict(dataset_dir=demo_dataset, epochs=2, iters_per_epoch=5, crop_size=64, scans_per_batch=2,
                  save_every=2, panel_every=100, progress_bar=False, features=[8, 8, 16, 16, 32, 8], num_clusters=10)
    # the uninterrupted run in this process, as `monai.bundle run` runs it; the killed and resumed runs are the
    # command line's
    reference = tmp_path / "uninterrupted"
    run_workflow("pretrain_bim", "train.json", output_dir=str(reference), **{**common, "dataset_dir": str(demo_dataset)})

    resumed = tmp_path / "interrupted"
    cmd = bundle_run_command("pretrain_bim", "train.json", output_dir=resumed, **common)
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 240
    while not (resumed / "checkpoint_last.pt").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (resumed / "model.pt").exists(), "the run must be killed before it finishes for this test to mean anything"
    killed_at = torch.load(resumed / "checkpoint_last.pt", weights_only=True)["trainer"]["iteration"]
    assert 2 <= killed_at < 10
    proc = run_bundle("pretrain_bim", "train.json", output_dir=resumed, **common)  # resume_from defaults to "auto"
    assert f"resuming from" in proc.stdout + proc.stderr
    final = torch.load(resumed / "checkpoint_final.pt", weights_only=True)
    assert final["trainer"]["iteration"] == 10
    ref_final = torch.load(reference / "checkpoint_final.pt", weights_only=True)
    assert final["lr_scheduler"]["last_epoch"] == ref_final["lr_scheduler"]["last_epoch"] == 10
    a = torch.load(reference / "model.pt", weights_only=True)
    b = torch.load(resumed / "model.pt", weights_only=True)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k].float(), b[k].float(), atol=1e-6), k


def test_multi_gpu_config_runs_under_torchrun_on_cpu(demo_dataset, tmp_path):
    """multi_gpu_train.json is a thin override: torchrun with 2 processes (gloo on CPU). The Contrast (Enc+Dec)
    variant leaves the cluster head unused and uses the projectors outside the DDP forward: DDP must cope."""
    for variant in (["variants/contrast_enc_dec.json"],):
        files = ["train.json", *variant, "multi_gpu_train.json"]
        cmd = bundle_run_command("pretrain_bim", files, dataset_dir=demo_dataset, output_dir=tmp_path / str(len(variant)),
                                 epochs=1, iters_per_epoch=2, crop_size=64, scans_per_batch=2, progress_bar=False,
                                 features="[8,8,16,16,32,8]", num_clusters=10)
        cmd = [cmd[0], "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *cmd[1:]]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert (tmp_path / str(len(variant)) / "model.pt").is_file()
        # each rank read its own half of the 34 training scans; both validation scans scored, one on each rank
        log = proc.stdout + proc.stderr
        assert "rank 0 of 2: training scans 0-16 of 34" in log and "rank 1 of 2: training scans 17-33 of 34" in log
        assert json.loads((tmp_path / str(len(variant)) / "cluster_quality.json").read_text())["scans"] == 2


def test_benchmark_profiles_the_step_and_writes_the_operator_table(demo_dataset, tmp_path):
    import sys

    out, table = tmp_path / "bench.json", tmp_path / "ops.txt"
    cmd = [sys.executable, str(ROOT / "tools" / "benchmark_pretrain.py"), "--dataset_dir", str(demo_dataset),
           "--iterations", "2", "--warmup", "1", "--scans_per_batch", "1", "--crop_size", "64", "--bare", "False",
           "--profile", str(table), "--profile_steps", "1", "--output_dir", str(tmp_path / "work"), "--out", str(out),
           "--decoder_pad", "always", "--cudnn_deterministic", "True"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    # channels_last left out: the bundle's default, which is off on a CPU; MONAI's decoder pad, as asked
    assert result["settings"]["channels_last"] is False and result["settings"]["decoder_pad"] == "always"
    assert result["settings"]["cudnn_deterministic"] is True  # the bundle's initialize applied the override (default false)
    step = result["full_step"]
    assert step["ms_per_step"] > 0 and step["profile"]["table"] == str(table) and step["profile"]["wall_s"] > 0
    assert "bare_unet_eager_bf16" not in result  # --bare False
    ops = table.read_text()
    assert "Name" in ops and "aten::convolution" in ops  # the U-Net's operators, sorted by their own time


def test_dense_level_clusters_a_deeper_decoder_block_and_scores_it_at_the_image_resolution(demo_dataset, tmp_path):
    # dense_level 2: the cluster head on upcat_2 (half resolution); the panel and the scores upsample its map
    out = tmp_path / "run"
    run_workflow("pretrain_bim", ["train.json", "variants/ours_mi_cc.json"], dataset_dir=str(demo_dataset),
                 output_dir=str(out), **{**TINY, "panel_every": 2, "iters_per_epoch": 2, "dense_level": 2})
    state = torch.load(out / "checkpoint_final.pt", weights_only=True)["network"]
    assert state["cluster_net.cluster_head.heads.0.weight"].shape[1] == TINY["features"][1]  # upcat_2's width
    from PIL import Image

    w, h = Image.open(out / "panels" / "clusters_latest.png").size
    assert w == 4 * (64 + 4) and h % (64 + 4) == 0  # same layout as at the last block
    assert set(json.loads((out / "cluster_quality.json").read_text())["classes"]) == {"RV", "Myo", "LV"}
    run_bundle("pretrain_bim", ["train.json", "variants/ours_mi_cc.json", "path_dependence.json"],
               dataset_dir=demo_dataset, output_dir=out, features=TINY["features"], num_clusters=TINY["num_clusters"],
               num_subheads=TINY["num_subheads"], dense_level=2)
    assert set(json.loads((out / "path_dependence_validation.json").read_text())["levels"]) == set("01234")
    with pytest.raises(RuntimeError) as bad:  # MONAI's parser wraps the network's own error: one clear cause
        _train_workflow(demo_dataset, tmp_path / "bad", dense_level=5).parser.get_parsed_content("network_def")
    assert "dense_level must be one of [1, 2, 3, 4]" in str(bad.value.__cause__)


def test_checkpoints_record_the_settings_so_a_changed_run_is_not_resumed(demo_dataset):
    """pretrain_bim's checkpoints carry a fingerprint of the settings that shape training: a re-run in a used
    ``output_dir`` with another LR, alpha or length starts afresh instead of resuming the old run; logging does not
    count."""
    from monai.bundle import ConfigParser

    def fingerprint(**overrides):
        parser = ConfigParser()
        parser.read_config([str(BUNDLES / "pretrain_bim" / "configs" / "train.json")])
        parser.update({"dataset_dir": str(demo_dataset), **overrides})
        return parser.get_parsed_content("fingerprint")

    base = fingerprint()
    assert fingerprint(log_every=7, progress_bar=False) == base
    for change in ({"learning_rate": 0.01}, {"alpha": 0.25}, {"epochs": 6}, {"seed": 1},
                   {"loss_weights#cc": 0.0}, {"unet_style": "monai"}, {"bn_momentum": 0.1}):
        assert fingerprint(**change) != base, change
    train = json.loads((BUNDLES / "pretrain_bim" / "configs" / "train.json").read_text())
    handlers = {h["_target_"]: h for h in train["train"]["handlers"]}
    assert handlers["bim.engine.ResumeFromCheckpoint"]["fingerprint"] == "@fingerprint"
    assert handlers["bim.engine.CheckpointEveryN"]["fingerprint"] == "@fingerprint"


def test_the_training_step_under_bf16_autocast_gathers_the_bf16_features(demo_dataset, tmp_path, monkeypatch):
    """The step as a GPU runs it (bf16 autocast, which the CPU path leaves off): the default nearest feature warp on
    the fp32 grid gathers the bf16 features (no fp32 copy), the MI and CC losses run in fp32, and two steps give
    finite losses and gradients."""
    import bim.engine
    import bim.gpu_augment
    import bim.pretrain.losses
    import bim.pretrain.trainer

    def cpu_bf16(device, enabled=True):
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=bool(enabled))

    gathered = []
    original = bim.gpu_augment.nearest_gather

    def spy(x, grid):
        gathered.append((x.dtype, grid.dtype))
        return original(x, grid)

    losses_seen = []
    mi_loss, cc_loss = bim.pretrain.losses.mi_loss, bim.pretrain.losses.cc_loss

    def mi_spy(p_hat, p_tilde, *args):
        out = mi_loss(p_hat, p_tilde, *args)
        losses_seen.append(("mi", p_hat.dtype, p_tilde.dtype, out.dtype))
        return out

    def cc_spy(image, p, *args):
        out = cc_loss(image, p, *args)
        losses_seen.append(("cc", image.dtype, p.dtype, out.dtype))
        return out

    monkeypatch.setattr(bim.pretrain.trainer, "bf16_autocast", cpu_bf16)
    monkeypatch.setattr(bim.gpu_augment, "nearest_gather", spy)
    monkeypatch.setattr(bim.pretrain.losses, "mi_loss", mi_spy)
    monkeypatch.setattr(bim.pretrain.losses, "cc_loss", cc_spy)
    wf = _train_workflow(demo_dataset, tmp_path, cluster_quality=False)
    trainer = wf.parser.get_parsed_content("train#trainer")
    trainer.run()
    assert gathered and set(gathered) == {(torch.bfloat16, torch.float32)}
    assert {k for k, *_ in losses_seen} == {"mi", "cc"}  # the MI and CC losses see and give fp32 only
    assert all(dtype == torch.float32 for _, *dtypes in losses_seen for dtype in dtypes)
    out = trainer.state.output
    assert all(torch.isfinite(torch.as_tensor(v)).all() for v in out.values())
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in trainer.network.parameters())
