"""pretrain_bim's network_def and model.pt: strict loading, MONAI's shape check and TorchScript export, and
configs/inference.json (cluster maps of NIfTI scans in their own geometry plus a PNG panel per scan).

A tiny pre-training run (U-Net 8-128, 2 iterations of 64 x 64 crops) gives the model.pt; K stays at the default 40,
the output width metadata.json declares."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from bundle_helpers import BUNDLES, purge_scripts_modules, run_bundle, run_workflow, workflow

BUNDLE = BUNDLES / "pretrain_bim"
CONFIGS = BUNDLE / "configs"
SMALL = [8, 16, 32, 64, 128, 8]
NET = dict(features=SMALL, num_subheads=2)  # 2 sub-heads: model.pt must hold every one of them
K = 40


@pytest.fixture(scope="module")
def pretrained(demo_dataset, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pretrain")
    # in this process, as `monai.bundle run` runs it (the command line: tests/test_pretrain_bundle.py)
    run_workflow("pretrain_bim", "train.json", dataset_dir=str(demo_dataset), output_dir=str(out), epochs=1,
                 iters_per_epoch=2, crop_size=64, scans_per_batch=2, panel_every=100, save_every=100, progress_bar=False,
                 cluster_quality=False, features=list(SMALL), num_subheads=2)
    return out


def _raw_scans(tmp_path: Path) -> list[Path]:
    """Two raw synthetic scans at their own spacing (not 1 mm), in a folder, as a user would give them."""
    from data_prep import ensure_demo_dataset

    raw = Path(ensure_demo_dataset()) / "raw" / "training" / "patient002"
    src = tmp_path / "in"
    src.mkdir()
    for frame in ("01", "11"):
        shutil.copy(raw / f"patient002_frame{frame}.nii.gz", src / f"case{frame}.nii.gz")
    return sorted(src.glob("*.nii.gz"))


def test_network_def_is_the_network_of_model_pt(pretrained, demo_dataset):
    state = torch.load(pretrained / "model.pt", weights_only=True)
    trained = torch.load(pretrained / "checkpoint_final.pt", weights_only=True)["network"]
    # model.pt is the trained cluster network of the pre-training wrapper, tensor for tensor
    assert {f"cluster_net.{k}" for k in state} == {k for k in trained if k.startswith("cluster_net.")}
    assert all(torch.equal(v, trained[f"cluster_net.{k}"]) for k, v in state.items())
    for config, kind in (("train.json", "train"), ("inference.json", "infer")):
        # inference.json takes the U-Net style and widths of --ckpt_path (auto)
        overrides = {"dataset_dir": str(demo_dataset)} if kind == "train" else {"ckpt_path": str(pretrained / "model.pt")}
        net = workflow("pretrain_bim", config, workflow_type=kind, **overrides, **NET).parser.get_parsed_content("network_def")
        net.load_state_dict(state)  # strict
        x = torch.rand(2, 1, 48, 32)
        with torch.no_grad():
            logits = net.eval()(x)
        assert tuple(logits.shape) == (2, K, 48, 32) and logits.dtype == torch.float32
    purge_scripts_modules()


def test_verify_net_in_out_and_torchscript_export(pretrained, tmp_path):
    from monai.bundle import ckpt_export, verify_net_in_out

    from bim.pretrain.model import BIMClusterNet

    common = dict(net_id="network_def", meta_file=str(CONFIGS / "metadata.json"),
                  config_file=str(CONFIGS / "inference.json"), bundle_root=str(BUNDLE), **NET)
    verify_net_in_out(device="cpu", n=3, **common)  # raises on a mismatch with metadata.json's network_data_format
    with pytest.raises(ValueError, match="output channel number `10` doesn't match: `40`"):
        verify_net_in_out(device="cpu", num_clusters=10, **common)
    ts = tmp_path / "model.ts"
    ckpt_export(filepath=str(ts), ckpt_file=str(pretrained / "model.pt"), ckpt_path=str(pretrained / "model.pt"), **common)
    scripted = torch.jit.load(str(ts))
    net = BIMClusterNet(unet_style="authors", **NET)  # train.json's default style
    net.load_state_dict(torch.load(pretrained / "model.pt", weights_only=True))
    x = torch.rand(2, 1, 64, 48)
    with torch.no_grad():  # the same fp32 operations: equal up to float rounding
        torch.testing.assert_close(scripted.eval()(x), net.eval()(x))


def test_inference_writes_cluster_maps_in_the_input_geometry_and_panels(pretrained, tmp_path):
    import nibabel as nib
    from PIL import Image

    from bim.inference import scan_preprocessing

    scans = _raw_scans(tmp_path)
    out = tmp_path / "out"
    run_bundle("pretrain_bim", "inference.json", dataset_dir=scans[0].parent, ckpt_path=pretrained / "model.pt",
               output_dir=out, features="[8,16,32,64,128,8]", num_subheads=2)
    for scan in scans:
        name = scan.name.removesuffix(".nii.gz")
        src, clusters = nib.load(scan), nib.load(out / f"{name}_clusters.nii.gz")
        assert clusters.shape == src.shape
        np.testing.assert_allclose(clusters.affine, src.affine, atol=1e-4)
        assert abs(float(src.header.get_zooms()[0]) - 1.0) > 0.1  # really resampled to 1 mm and back
        values = np.asarray(clusters.dataobj)
        assert clusters.get_data_dtype() == np.uint8 and values.min() >= 0 and values.max() < K
        # the panel: 3 slices, image | cluster map, each tile framed by 2 pixels, in the network's geometry (the
        # inferer pads each slice to a multiple of 16 and crops the output back)
        _, h, w, _ = scan_preprocessing("acdc")({"image": str(scan)})["image"].shape
        panel = np.asarray(Image.open(out / f"{name}_clusters.png"))
        assert panel.shape == (3 * (h + 4), 2 * (w + 4), 3) and (h % 16, w % 16) != (0, 0)
        assert h > src.shape[0]  # 1.27 mm pixels resampled to 1 mm: more rows
    assert sorted(p.name for p in out.iterdir()) == sorted(
        f"{s.name.removesuffix('.nii.gz')}_clusters.{ext}" for s in scans for ext in ("nii.gz", "png"))


def test_inference_names_a_missing_checkpoint_or_scan_folder(tmp_path):
    def cause_chain(err):
        chain, e = [], err
        while e is not None:  # monai wraps the error of a component in a RuntimeError
            chain.append(str(e))
            e = e.__cause__
        return "\n".join(chain)

    missing = tmp_path / "nowhere" / "model.pt"
    parser = workflow("pretrain_bim", "inference.json", workflow_type="infer", ckpt_path=str(missing)).parser
    with pytest.raises(Exception) as err:
        parser.get_parsed_content("handlers")
    assert f"checkpoint {missing} does not exist: train the bundle first" in cause_chain(err.value)
    with pytest.raises(Exception) as err:
        parser.get_parsed_content("datalist")
    assert "set --dataset_dir to a NIfTI file or a folder of NIfTI volumes" in cause_chain(err.value)
    purge_scripts_modules()


def test_checkpoints_of_earlier_versions_still_load_for_scoring(tmp_path):
    # before 0.3.0 the pre-training network held the U-Net (with its untrained final_conv) and the cluster head at the
    # top of its state dict; evaluate.json and path_dependence.json read such checkpoints
    from bim.network import build_unet
    from bim.pretrain.cluster_quality import load_pretrain_checkpoint
    from bim.pretrain.model import BIMClusterNet, BIMPretrainNet

    torch.manual_seed(0)
    source = BIMPretrainNet(BIMClusterNet(num_clusters=5, num_subheads=1, features=SMALL), projector_dim=8)
    old = {k.removeprefix("cluster_net."): v for k, v in source.state_dict().items()}
    old.update({f"unet.final_conv.{k}": v for k, v in build_unet(out_channels=1, features=SMALL).final_conv.state_dict().items()})
    torch.save({"network": old}, tmp_path / "checkpoint_final.pt")
    target = BIMPretrainNet(BIMClusterNet(num_clusters=5, num_subheads=1, features=SMALL), projector_dim=8)
    load_pretrain_checkpoint(target, str(tmp_path / "checkpoint_final.pt"))
    assert all(torch.equal(v, target.state_dict()[k]) for k, v in source.state_dict().items())
