"""The segmentation bundles take the U-Net's style and widths from the weights they start from (``unet_style`` and
``features`` "auto", the default): the ``pretrained`` file when training, the checkpoint evaluated, the ``ckpt_path``
inferred with; without weights, today's network (monai style, 32-512), so earlier runs and commands reproduce."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from bundle_helpers import workflow

from bim.network import PAPER_FEATURES, UNET_STYLES, backbone_state_dict, build_unet, unet_features_of, unet_style_of
from bim.pretrain.model import BIMClusterNet, BIMPretrainNet
from bim.segmentation import resolve_unet

WIDTHS = [4, 5, 6, 7, 9, 3]  # all different: a width read from the wrong tensor shows
SMALL = [8, 16, 32, 64, 128, 8]
FAST = dict(crop_size=64, batch_size=4, progress_bar=False, log_every=5, epochs=1, iters_per_epoch=6, warmup_epochs=1,
            learning_rate=0.003)


def last_line_of(fn) -> str:
    from bim.errors import last_line

    with pytest.raises(Exception) as err:
        fn()
    return last_line(err.value) or f"error: {err.value}"


# ------------------------------------------------------------------------------------------------- detection


@pytest.mark.parametrize("style", UNET_STYLES)
def test_style_and_widths_are_read_from_the_weights_whatever_their_prefix(style):
    unet = build_unet(out_channels=3, features=WIDTHS, unet_style=style).state_dict()
    cluster_net = BIMClusterNet(num_clusters=5, num_subheads=2, features=WIDTHS, unet_style=style, dense_level=2)
    holders = {prefix: {prefix + k: v for k, v in unet.items()}
               for prefix in ("", "module.", "_orig_mod.", "module._orig_mod.", "unet.", "network.")}
    holders["model.pt of pretrain_bim"] = cluster_net.state_dict()
    holders["pre-training checkpoint"] = BIMPretrainNet(cluster_net, 8).state_dict()  # cluster_net.unet.*
    holders["backbone of pretrain_bim < 0.3.0"] = backbone_state_dict(build_unet(features=WIDTHS, unet_style=style))
    for name, state in holders.items():
        assert unet_style_of(state) == style, name
        assert unet_features_of(state) == WIDTHS, name


def test_weights_without_a_unet_give_none_and_two_styles_or_widths_an_error():
    linear = torch.nn.Linear(3, 2).state_dict()
    assert unet_style_of(linear) is None and unet_features_of(linear) is None
    monai = build_unet(features=WIDTHS).state_dict()
    authors = {"teacher." + k: v for k, v in build_unet(features=WIDTHS, unet_style="authors").state_dict().items()}
    with pytest.raises(ValueError, match="U-Nets of both styles"):
        unet_style_of({**monai, **authors})
    wider = {"teacher." + k: v for k, v in build_unet(features=SMALL).state_dict().items()}
    with pytest.raises(ValueError, match="U-Nets of different widths"):
        unet_features_of({**monai, **wider})


# ---------------------------------------------------------------------------------------------- resolve_unet


def save_unet(path: Path, style: str, features=WIDTHS, out_channels: int = 2) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(build_unet(out_channels=out_channels, features=features, unet_style=style).state_dict(), path)
    return path


def test_without_weights_auto_is_todays_network():
    assert resolve_unet("auto", "auto", None) == {"unet_style": "monai", "features": list(PAPER_FEATURES)}
    assert resolve_unet("authors", SMALL, None) == {"unet_style": "authors", "features": SMALL}


@pytest.mark.parametrize("style", UNET_STYLES)
def test_auto_takes_the_style_and_widths_of_the_file_and_an_explicit_value_that_agrees(style, tmp_path):
    model = save_unet(tmp_path / "model.pt", style)
    assert resolve_unet("auto", "auto", model) == {"unet_style": style, "features": WIDTHS}
    assert resolve_unet(style, "auto", model, "--checkpoint") == {"unet_style": style, "features": WIDTHS}
    assert resolve_unet("auto", SMALL, model) == {"unet_style": style, "features": SMALL}  # explicit widths as given


def test_an_explicit_style_that_contradicts_the_file_names_the_file_both_styles_and_the_fix(tmp_path):
    model = save_unet(tmp_path / "model.pt", "authors")
    with pytest.raises(ValueError) as err:
        resolve_unet("monai", "auto", model, "--ckpt_path")
    assert str(err.value) == (f"--ckpt_path {model}: holds a U-Net of style 'authors', but unet_style is 'monai': drop "
                              f"--unet_style (its default, auto, takes the style of the weights) or pass --unet_style "
                              f"authors")


def test_a_missing_corrupt_or_foreign_file_is_named(tmp_path, caplog):
    missing = tmp_path / "missing.pt"
    with pytest.raises(FileNotFoundError, match=f"--checkpoint {missing}: no such file; pass the model.pt of a training"):
        resolve_unet("auto", "auto", missing, "--checkpoint")
    with pytest.raises(FileNotFoundError, match=f"pretrained checkpoint {missing} does not exist"):
        resolve_unet("auto", "auto", missing)
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match=f"--pretrained {corrupt}: not a valid weights file"):
        resolve_unet("auto", "auto", corrupt)
    foreign = tmp_path / "linear.pt"
    torch.save(torch.nn.Linear(3, 2).state_dict(), foreign)
    with pytest.raises(ValueError, match=f"--pretrained {foreign}: holds no U-Net weights of this project"):
        resolve_unet("auto", "auto", foreign)
    assert resolve_unet("monai", SMALL, foreign) == {"unet_style": "monai", "features": SMALL}  # as before: load says
    two = tmp_path / "two.pt"
    torch.save({**build_unet(features=WIDTHS).state_dict(),
                **{"teacher." + k: v for k, v in build_unet(features=SMALL).state_dict().items()}}, two)
    with pytest.raises(ValueError, match=rf"--pretrained {two}: the weights hold U-Nets of different widths: .*: pass "
                                         "the weights of one network"):
        resolve_unet("auto", "auto", two)
    # inference's network alone (MONAI's verify_net_in_out, ckpt_export --ckpt_file): built without the file
    with caplog.at_level(logging.WARNING, logger="bim"):
        assert resolve_unet("auto", "auto", missing, "--ckpt_path", required=False)["unet_style"] == "monai"
    assert f"--ckpt_path {missing} does not exist: the U-Net is built without weights (unet_style auto: monai)" in caplog.text


# ------------------------------------------------------------------------------------------------ the bundles


def test_random_init_builds_and_fingerprints_todays_network(demo_dataset, tmp_path):
    """No pretrained file: the monai-style 32-512 U-Net, and the settings fingerprint of earlier runs (so their
    interrupted runs still resume)."""
    wf = workflow("finetune_seg", "train.json", dataset_dir=str(demo_dataset), output_dir=str(tmp_path), **FAST)
    net = wf.parser.get_parsed_content("network_def")
    assert unet_style_of(net.state_dict()) == "monai" and unet_features_of(net.state_dict()) == list(PAPER_FEATURES)
    settings = json.loads(wf.parser.get_parsed_content("fingerprint"))
    assert settings["unet_style"] == "monai" and settings["features"] == list(PAPER_FEATURES)


def test_an_explicit_style_that_contradicts_pretrained_stops_the_bundle_before_anything_is_written(demo_dataset, tmp_path):
    model = tmp_path / "model.pt"
    torch.save(BIMClusterNet(features=SMALL, unet_style="authors").state_dict(), model)
    out = tmp_path / "out"
    for bundle in ("finetune_seg", "meanteacher_seg"):
        line = last_line_of(lambda: workflow(bundle, "train.json", dataset_dir=str(demo_dataset), output_dir=str(out),
                                             pretrained=str(model), unet_style="monai", **FAST).run())
        assert line == (f"error: --pretrained {model}: holds a U-Net of style 'authors', but unet_style is 'monai': "
                        f"drop --unet_style (its default, auto, takes the style of the weights) or pass --unet_style "
                        f"authors"), bundle
        assert not out.exists()


def test_meanteacher_student_takes_the_style_of_pretrained(demo_dataset, tmp_path):
    model = tmp_path / "model.pt"
    torch.save(BIMClusterNet(features=SMALL, unet_style="authors").state_dict(), model)
    wf = workflow("meanteacher_seg", "train.json", dataset_dir=str(demo_dataset), output_dir=str(tmp_path / "out"),
                  pretrained=str(model), **FAST)
    student = wf.parser.get_parsed_content("network")
    assert unet_style_of(student.state_dict()) == "authors" and unet_features_of(student.state_dict()) == SMALL
    assert len(student.pretrained_report["loaded"]) == len(student.state_dict()) - 2  # all but final_conv


@pytest.fixture(scope="module")
def authors_run(tmp_path_factory, demo_dataset) -> dict:
    """pretrain_bim with --unet_style authors (tiny), then finetune_seg from its model.pt with no unet_style or
    features given."""
    tmp = tmp_path_factory.mktemp("authors")
    workflow("pretrain_bim", "train.json", dataset_dir=str(demo_dataset), output_dir=str(tmp / "pre"), epochs=1,
             iters_per_epoch=2, crop_size=64, scans_per_batch=2, panel_every=100, save_every=100, progress_bar=False,
             features=SMALL, unet_style="authors", cluster_quality=False).run()
    wf = workflow("finetune_seg", "train.json", dataset_dir=str(demo_dataset), output_dir=str(tmp / "ft"),
                  pretrained=str(tmp / "pre" / "model.pt"), **FAST)
    wf.run()
    return {"pretrained": tmp / "pre" / "model.pt", "dir": tmp / "ft", "train": wf}


def test_a_pretrain_bim_model_pt_of_the_authors_style_is_detected(authors_run):
    state = torch.load(authors_run["pretrained"], weights_only=True)
    assert any(k.startswith("cluster_head.") for k in state)  # BIMClusterNet's state dict
    assert unet_style_of(state) == "authors" and unet_features_of(state) == SMALL


def test_finetune_evaluate_and_inference_take_the_authors_style_without_being_told(authors_run, demo_dataset, tmp_path):
    wf = authors_run["train"]
    assert wf.parser.get_parsed_content("resolved_unet") == {"unet_style": "authors", "features": SMALL}
    report = wf.parser.get_parsed_content("network").pretrained_report
    assert report["shape_mismatch"] == [] and report["not_loaded"] == ["final_conv.bias", "final_conv.weight"]
    model = authors_run["dir"] / "model.pt"
    assert unet_style_of(torch.load(model, weights_only=True)) == "authors"
    workflow("finetune_seg", ["train.json", "evaluate.json"], workflow_type="infer", dataset_dir=str(demo_dataset),
             output_dir=str(authors_run["dir"])).run()
    summary = json.loads((authors_run["dir"] / "eval" / "lv_n1_seed0_summary.json").read_text())
    assert summary["n"] == 4 and summary["checkpoint"] == str(model)
    scans = demo_dataset / "raw" / "training" / "patient002"
    infer = workflow("finetune_seg", "inference.json", workflow_type="infer", dataset_dir=str(scans),
                     output_dir=str(tmp_path / "pred"), ckpt_path=str(model))
    infer.run()
    assert infer.parser.get_parsed_content("resolved_unet") == {"unet_style": "authors", "features": SMALL}
    assert sorted(p.name for p in (tmp_path / "pred").iterdir()) == ["patient002_frame01_seg.nii.gz",
                                                                     "patient002_frame11_seg.nii.gz"]


def test_the_readmes_torchscript_export_of_an_authors_model_takes_its_style_from_ckpt_path(authors_run, tmp_path):
    """The README's ``ckpt_export`` line: ``--ckpt_path`` (the model it exports) lets auto build the model's U-Net."""
    import sys

    from monai.bundle import ckpt_export
    from tolerance import assert_close_to_scale, conv_reduction_length

    from bundle_helpers import BUNDLES, purge_scripts_modules

    model, root = authors_run["dir"] / "model.pt", str(BUNDLES / "finetune_seg")
    purge_scripts_modules()
    sys.path.insert(1, root)
    try:
        ckpt_export(net_id="network_def", filepath=str(tmp_path / "model.ts"), ckpt_file=str(model),
                    ckpt_path=str(model), meta_file=root + "/configs/metadata.json",
                    config_file=root + "/configs/inference.json")
    finally:
        sys.path.remove(root)
        purge_scripts_modules()
    scripted = torch.jit.load(str(tmp_path / "model.ts")).eval()
    net = build_unet(out_channels=2, features=SMALL, unet_style="authors").eval()
    net.load_state_dict(torch.load(model, weights_only=True))
    x = torch.rand(2, 1, 64, 48)
    with torch.no_grad():
        assert_close_to_scale(scripted(x), net(x), conv_reduction_length(net), "scripted vs eager")
