"""Unit tests of the pieces finetune_seg shares through bim: tasks, pre-trained loading, augmentation,
slice-wise inference, labelled subsets and bad-input errors (all in-process, a few seconds)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

from bim.network import build_unet  # noqa: E402
from bim.tasks import TASKS, MapTaskLabelsd, get_task, labelled_key  # noqa: E402
from tolerance import assert_close_to_scale, conv_reduction_length  # noqa: E402

SMALL = (8, 16, 32, 64, 128, 8)
ACDC_NAMES = {0: "background", 1: "RV", 2: "Myo", 3: "LV"}  # data_prep's ACDC labels


# ------------------------------------------------------------------------------------------------------ tasks


def test_binary_acdc_tasks_pick_one_structure():
    label = torch.arange(4).repeat(3, 1)  # every ACDC label value
    for name, structure in (("lv", "LV"), ("rv", "RV"), ("myo", "Myo")):
        task = get_task(name)
        out = task.map_labels(label)
        assert out.dtype == torch.uint8 and out.shape == label.shape
        # exactly the label value named like the task's foreground class becomes 1
        expected = torch.tensor([1 if ACDC_NAMES[v] == structure else 0 for v in range(4)]).repeat(3, 1)
        assert torch.equal(out.long(), expected)
        assert task.num_classes == 2 and task.class_names[1] == structure


def test_multiclass_and_prostate_tasks():
    label = np.array([[0, 1], [2, 3]], dtype=np.uint8)
    out = get_task("acdc").map_labels(label)
    assert isinstance(out, np.ndarray) and out.tolist() == label.tolist()
    assert [get_task("acdc").class_names[i] for i in range(4)] == [ACDC_NAMES[i] for i in range(4)]
    assert get_task("prostate").map_labels(np.array([0, 1, 1])).tolist() == [0, 1, 1]
    assert get_task("prostate").max_rotation_deg == 10.0


def test_acdc_tasks_augment_with_t_ranges_and_prostate_keeps_the_light_ones():
    # measured at the paper's length (docs/results/acdc_paper_length): T's ranges lift the ACDC baseline by 20+ points
    for name in ("lv", "rv", "myo", "acdc"):
        task = get_task(name)
        assert (task.max_rotation_deg, task.scale_range, task.gamma_range) == (45.0, (0.8, 1.3), (0.5, 2.0)), name
    prostate = get_task("prostate")
    assert (prostate.max_rotation_deg, prostate.scale_range, prostate.gamma_range) == (10.0, (0.9, 1.1), None)


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_task_maps_into_its_classes(name):
    task = get_task(name)
    values = torch.tensor(sorted(task.label_map), dtype=torch.uint8)
    out = task.map_labels(values)
    assert set(out.tolist()) == set(range(task.num_classes))  # onto: every class reachable
    assert task.channel_def == {str(i): n for i, n in enumerate(task.class_names)}
    assert task.map_labels(torch.zeros(2, 2)).sum() == 0  # background stays background


def test_unmappable_label_values_are_refused():
    with pytest.raises(ValueError, match=r"label values \[5\] cannot be mapped by task 'lv'.*accepted values: \[0, 1, 2, 3\]"):
        get_task("lv").map_labels(torch.tensor([0, 3, 5]), source="scan7.nii.gz")
    with pytest.raises(ValueError, match="scan7.nii.gz"):
        get_task("lv").map_labels(torch.tensor([0, 3, 5]), source="scan7.nii.gz")
    with pytest.raises(ValueError, match=r"\[2, 3\] cannot be mapped by task 'prostate'"):
        get_task("prostate").map_labels(np.array([0, 1, 2, 3]))


def test_unknown_task_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown task 'liver'.*\['acdc', 'lv', 'myo', 'prostate', 'rv'\]"):
        get_task("liver")
    assert get_task("LV") is TASKS["lv"]
    assert labelled_key(2, 4) == "labelled_seed2_4"
    with pytest.raises(ValueError, match="labelled_scans must be >= 1"):
        labelled_key(0, 0)


def test_map_task_labels_dict_transform_keeps_meta():
    from monai.data import MetaTensor

    lab = MetaTensor(torch.tensor([[[0, 3], [2, 3]]]), affine=torch.diag(torch.tensor([2.0, 2.0, 5.0, 1.0])))
    out = MapTaskLabelsd("label", "lv")({"label": lab, "scan": "p1", "prepared": True})["label"]
    assert isinstance(out, MetaTensor) and out.tolist() == [[[0, 1], [0, 1]]]
    assert torch.equal(out.affine, lab.affine)
    with pytest.raises(ValueError, match="p1: label values"):
        MapTaskLabelsd("label", "lv")({"label": torch.tensor([9]), "scan": "p1", "prepared": True})


def test_raw_scan_labels_hold_the_class_indices():
    """A raw scan's label (e.g. from a MONAI Label datastore) is in the model's output encoding: for lv, 1 is the
    LV and is kept; ACDC's values 2 and 3 do not fit and are an error naming the file, never background."""
    out = MapTaskLabelsd("label", "lv")({"label": torch.tensor([[0, 1], [1, 0]]), "scan": "p1"})["label"]
    assert out.tolist() == [[0, 1], [1, 0]]
    with pytest.raises(ValueError, match=r"lab\.nii\.gz: label values \[2, 3\] do not fit task 'lv': the label of a "
                                         r"raw scan holds the class indices the model predicts \(0 background, 1 LV\)"):
        get_task("lv").map_labels(torch.tensor([0, 1, 2, 3]), source="lab.nii.gz", prepared=False)


# --------------------------------------------------------------------------------------------- pre-trained loading


def _save(obj, path):
    torch.save(obj, path)
    return path


def test_load_pretrained_copies_matching_tensors_only(tmp_path):
    from bim.network import backbone_state_dict
    from bim.segmentation import load_pretrained

    torch.manual_seed(0)
    source = build_unet(out_channels=1, features=SMALL)
    path = _save(backbone_state_dict(source), tmp_path / "model.pt")
    net = build_unet(out_channels=4, features=SMALL)
    final_before = net.final_conv.weight.detach().clone()
    load_pretrained(net, path)
    report = net.pretrained_report
    assert report["not_loaded"] == ["final_conv.bias", "final_conv.weight"]
    assert torch.equal(net.conv_0.conv_0.conv.weight, source.conv_0.conv_0.conv.weight)
    assert torch.equal(net.upcat_1.convs.conv_1.conv.weight, source.upcat_1.convs.conv_1.conv.weight)
    assert torch.equal(net.final_conv.weight, final_before)


def test_load_pretrained_accepts_wrapped_checkpoints(tmp_path):
    from bim.segmentation import load_pretrained

    source = build_unet(out_channels=2, features=SMALL)
    # a bundle checkpoint: {"network": state dict of a model holding the U-Net as ``unet``}
    wrapped = {"network": {f"unet.{k}": v for k, v in source.state_dict().items()}, "optimizer": {}}
    net = load_pretrained(build_unet(out_channels=2, features=SMALL), _save(wrapped, tmp_path / "ckpt.pt"))
    assert net.pretrained_report["not_loaded"] == []  # same out_channels: everything matched
    assert torch.equal(net.final_conv.weight, source.final_conv.weight)
    net = load_pretrained(build_unet(out_channels=2, features=SMALL), _save({"state_dict": source.state_dict()}, tmp_path / "sd.pt"))
    assert len(net.pretrained_report["loaded"]) == len(source.state_dict())


def test_load_pretrained_finds_every_backbone_tensor_of_a_cluster_network(tmp_path):
    # model.pt of pretrain_bim (>= 0.3.0) is a BIMClusterNet's state dict (unet.* without final_conv, cluster_head.*);
    # its checkpoints hold it as cluster_net.*; the fine-tuning U-Net takes every backbone tensor from either
    from bim.network import backbone_state_dict
    from bim.pretrain.model import BIMClusterNet, BIMPretrainNet
    from bim.segmentation import load_pretrained

    torch.manual_seed(0)
    cluster_net = BIMClusterNet(num_clusters=7, num_subheads=2, features=SMALL)
    backbone = backbone_state_dict(build_unet(out_channels=4, features=SMALL))
    files = {"model.pt": cluster_net.state_dict(),
             "checkpoint_final.pt": {"network": BIMPretrainNet(cluster_net, 16).state_dict(), "optimizer": {}}}
    for name, obj in files.items():
        net = load_pretrained(build_unet(out_channels=4, features=SMALL), _save(obj, tmp_path / name))
        report = net.pretrained_report
        assert sorted(report["loaded"]) == sorted(backbone) and len(report["loaded"]) == len(backbone) == 134, name
        assert report["not_loaded"] == ["final_conv.bias", "final_conv.weight"] and report["shape_mismatch"] == []
        for k in backbone:
            assert torch.equal(net.state_dict()[k], cluster_net.unet.state_dict()[k]), (name, k)


def test_load_pretrained_refuses_another_architecture(tmp_path):
    from bim.segmentation import load_pretrained

    other = _save(build_unet(out_channels=1, features=(4, 8, 16, 32, 64, 4)).state_dict(), tmp_path / "other.pt")
    with pytest.raises(ValueError, match=r"other\.pt matches no tensor of the network.*pass the --features"):
        load_pretrained(build_unet(out_channels=2, features=SMALL), other)
    lin = _save(torch.nn.Linear(3, 2).state_dict(), tmp_path / "linear.pt")
    with pytest.raises(ValueError, match="linear.pt matches no tensor"):
        load_pretrained(build_unet(out_channels=2, features=SMALL), lin)
    with pytest.raises(FileNotFoundError, match="missing.pt does not exist"):
        load_pretrained(build_unet(out_channels=2, features=SMALL), tmp_path / "missing.pt")
    net = load_pretrained(build_unet(out_channels=2, features=SMALL), None)  # Baseline: random init
    assert net.pretrained_report["loaded"] == []


# ------------------------------------------------------------------------------------------------- augmentation


def test_augment_keeps_image_and_label_aligned_and_pads_small_images():
    from bim.segmentation import SegmentationAugment

    g = torch.Generator().manual_seed(3)
    label = torch.zeros(6, 1, 40, 50, dtype=torch.uint8)
    label[:, :, 10:30, 15:40] = 1
    image = label.float()
    aug = SegmentationAugment(crop_size=64, max_rotation_deg=15, brightness=0.0, contrast=0.0, generator=g)
    x, y = aug(image, label)
    assert x.shape == (6, 1, 64, 64) and y.shape == (6, 1, 64, 64) and y.dtype == torch.uint8
    assert set(torch.unique(y).tolist()) <= {0, 1}
    agree = ((x > 0.5) == (y == 1)).float().mean().item()
    assert agree > 0.99  # same matrix for both
    # foreground area is preserved up to the zoom range (0.9-1.1) and interpolation
    ratio = y.float().sum((1, 2, 3)) / (20 * 25)
    assert torch.all(ratio > 0.75) and torch.all(ratio < 1.3)
    jitter = SegmentationAugment(crop_size=32, generator=torch.Generator().manual_seed(0))
    xs = jitter(torch.ones(4, 1, 32, 32))
    assert xs.shape == (4, 1, 32, 32) and not torch.allclose(xs[0], xs[1])


def test_augment_is_reproducible_from_the_generator():
    from bim.segmentation import SegmentationAugment

    img = torch.rand(3, 1, 48, 48)
    lab = (img > 0.5).to(torch.uint8)
    a = SegmentationAugment(crop_size=32, generator=torch.Generator().manual_seed(7))(img, lab)
    b = SegmentationAugment(crop_size=32, generator=torch.Generator().manual_seed(7))(img, lab)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_gamma_augmentation_changes_intensities_per_image_but_not_labels():
    from bim.segmentation import SegmentationAugment

    img = torch.rand(4, 1, 48, 48) * 0.8 + 0.1
    lab = (img > 0.5).to(torch.uint8)
    kw = dict(crop_size=32, max_rotation_deg=0.0, scale_range=(1.0, 1.0), flip_prob=0.0, brightness=0.0, contrast=0.0)
    plain_x, plain_y = SegmentationAugment(**kw, generator=torch.Generator().manual_seed(5))(img, lab)
    x, y = SegmentationAugment(**kw, gamma_range=(0.5, 2.0), generator=torch.Generator().manual_seed(5))(img, lab)
    assert torch.equal(y, plain_y)  # the geometry draws come first, so gamma leaves the crop and the label alone
    # each image is plain ** gamma with its own gamma in [0.5, 2]: recover it from one pixel and check every pixel
    inside = (plain_x > 0.05) & (plain_x < 0.95)
    gammas = []
    for i in range(4):
        p, q = plain_x[i][inside[i]], x[i][inside[i]]
        g = (q.log() / p.log()).median()
        assert 0.5 - 1e-4 <= g <= 2.0 + 1e-4 and torch.allclose(q, p ** g, atol=1e-4)
        gammas.append(float(g))
    assert max(gammas) - min(gammas) > 0.05  # drawn per image
    with pytest.raises(ValueError, match="gamma_range"):
        SegmentationAugment(gamma_range=(2.0, 0.5))


# --------------------------------------------------------------------------------------------- slice inference


def test_slice_batch_inferer_runs_every_slice_and_restores_the_size():
    from bim.inference import SliceBatchInferer

    torch.manual_seed(0)
    net = build_unet(out_channels=3, features=SMALL).eval()
    vol = torch.rand(1, 1, 40, 37, 5)
    with torch.no_grad():
        out = SliceBatchInferer(divisor=16)(vol, net)
        assert out.shape == (1, 3, 40, 37, 5) and out.dtype == torch.float32
        # slice 2 alone, padded by hand to 48 x 48 the same way
        sl = torch.nn.functional.pad(vol[..., 2], (5, 6, 4, 4))
        ref = net(sl)[..., 4:44, 5:42]
        # batched and single-slice convolutions may sum in another order: rounding of the longest conv sum
        assert_close_to_scale(out[..., 2], ref, conv_reduction_length(net), "slice 2 vs by hand")
        chunked = SliceBatchInferer(divisor=16, max_slices=2)(vol, net)
        assert_close_to_scale(out, chunked, conv_reduction_length(net), "2-slice chunks vs all at once")
    with pytest.raises(ValueError, match="expects"):
        SliceBatchInferer()(torch.rand(1, 4, 4), net)


# ------------------------------------------------------------------------------------------- data and bad input


def test_labelled_items_names_the_missing_subset():
    from bim.segmentation import labelled_items

    items = labelled_items(None, 0, 1)  # demo data set
    assert len(items) == 1 and Path(items[0]["label"]).is_file()
    with pytest.raises(ValueError, match=r"no key 'labelled_seed0_3'.*labelled_seed0_1, labelled_seed0_2, labelled_seed0_4"):
        labelled_items(None, 0, 3)


def test_dataset_dir_without_datalist(tmp_path):
    from bim.segmentation import evaluation_items, labelled_items

    with pytest.raises(FileNotFoundError, match="no datalist.json"):
        labelled_items(tmp_path, 0, 1)
    with pytest.raises(FileNotFoundError, match="no datalist.json"):
        evaluation_items(tmp_path, "test")


def test_task_store_refuses_labels_the_task_cannot_map(tmp_path):
    import nibabel as nib
    from monai.data import Dataset

    from bim.data import volume_loader
    from bim.segmentation import task_slice_store

    img = np.random.rand(16, 16, 3).astype(np.float32)
    lab = np.zeros((16, 16, 3), np.uint8)
    lab[4:8, 4:8, 1] = 5
    nib.save(nib.Nifti1Image(img, np.eye(4)), tmp_path / "img.nii.gz")
    nib.save(nib.Nifti1Image(lab, np.eye(4)), tmp_path / "lab.nii.gz")
    item = {"image": str(tmp_path / "img.nii.gz"), "label": str(tmp_path / "lab.nii.gz"), "scan": "s0", "prepared": True}
    with pytest.raises(ValueError, match=r"lab\.nii\.gz: label values \[5\] cannot be mapped by task 'lv'"):
        task_slice_store(Dataset([item], transform=volume_loader(True)), "lv")
    lab[lab == 5] = 3
    nib.save(nib.Nifti1Image(lab, np.eye(4)), tmp_path / "lab.nii.gz")
    store = task_slice_store(Dataset([item], transform=volume_loader(True)), "lv")
    assert store.label.shape == (3, 1, 16, 16) and int(store.label.sum()) == 16


def test_empty_evaluation_list_is_a_clear_error(tmp_path):
    (tmp_path / "datalist.json").write_text(json.dumps({"training": [], "validation": [], "test": []}))
    from bim.segmentation import evaluation_items

    with pytest.raises(ValueError, match="'validation' list .* is empty"):
        evaluation_items(tmp_path, "validation")


def test_mask_outline_is_the_border_of_the_mask():
    from bim.images import mask_outline

    mask = np.zeros((7, 7), bool)
    mask[1:6, 1:6] = True
    edge = mask_outline(mask)
    assert edge.sum() == 16 and not edge[2:5, 2:5].any() and edge[1, 1:6].all() and edge[1:6, 5].all()
    assert not mask_outline(np.zeros((4, 4), bool)).any()
    assert mask_outline(np.ones((3, 3), bool)).sum() == 8  # the image border counts as outside


@pytest.mark.parametrize("order, shown", [("worst", ["s1", "s3"]), ("first", ["s0", "s1"])])
def test_prediction_panel_shows_the_lowest_dice_scans_first_or_the_first_scans(tmp_path, order, shown):
    from types import SimpleNamespace

    from bim.inference import PredictionPanelWriter
    from PIL import Image

    writer = PredictionPanelWriter(str(tmp_path), "lv", max_scans=2, order=order)
    engine = SimpleNamespace(state=SimpleNamespace(metric_details={}))
    writer.reset()
    for k in range(4):  # one scan per iteration, as the evaluator runs them
        label = torch.zeros(2, 8, 8, 3)
        label[0], label[1, 2:6, 2:6, 1] = 1, 1
        label[0, 2:6, 2:6, 1] = 0
        engine.state.output = [{"image": torch.rand(1, 8, 8, 3), "label": label, "pred": label}]
        engine.state.batch = [{"scan": f"s{k}"}]
        writer.collect(engine)
    engine.state.metric_details = {"val_mean_dice": torch.tensor([[0.9], [0.1], [0.5], [0.3]])}
    path = writer.write(engine)
    assert writer.written_scans == shown
    assert np.asarray(Image.open(path)).shape == (2 * 8, 2 * 8, 3)
    engine.state.metric_details = {}  # no per-scan Dice: the first scans, whatever the order
    writer.write(engine)
    assert writer.written_scans == ["s0", "s1"]
    with pytest.raises(ValueError, match="order must be one of"):
        PredictionPanelWriter(str(tmp_path), "lv", order="best")


@pytest.mark.parametrize("bundle", ["finetune_seg", "meanteacher_seg"])
@pytest.mark.parametrize("task", ["lv", "prostate"])
def test_bundles_take_the_labelled_augmentation_from_the_task(bundle, task):
    from bundle_helpers import purge_scripts_modules
    from monai.bundle import ConfigParser

    sys.path.insert(1, str(ROOT / "bundles" / bundle))
    purge_scripts_modules()
    try:
        parser = ConfigParser()
        parser.read_config(str(ROOT / "bundles" / bundle / "configs" / "train.json"))
        parser["task"] = task
        got = tuple(parser.get_parsed_content(k) for k in ("max_rotation_deg", "scale_range", "gamma_range"))
    finally:
        sys.path.remove(str(ROOT / "bundles" / bundle))
        purge_scripts_modules()
    spec = get_task(task)
    assert got == (spec.max_rotation_deg, spec.scale_range, spec.gamma_range)


@pytest.mark.parametrize("size", [(64, 64), (50, 70), (33, 47)])
def test_decoder_pads_only_where_needed_and_matches_monai_upcat(size):
    """The U-Net's decoder blocks skip MONAI's zero-pixel pad; outputs and gradients equal MONAI's for every input
    size, the odd sizes included, and the state dict keeps BasicUNet's keys."""
    from monai.networks.nets import BasicUNet
    from monai.networks.nets.basic_unet import UpCat
    from bim.network import UpCatPadIfNeeded, set_decoder_padding

    torch.manual_seed(0)
    net = build_unet(out_channels=3, features=SMALL).eval()
    blocks = [m for m in net.modules() if isinstance(m, UpCat)]
    assert len(blocks) == 4 and all(type(m) is UpCatPadIfNeeded for m in blocks)
    reference = BasicUNet(spatial_dims=2, in_channels=1, out_channels=3, features=tuple(SMALL), norm="batch").eval()
    assert set(reference.state_dict()) == set(net.state_dict())
    reference.load_state_dict(net.state_dict())
    x = torch.rand(2, 1, *size)
    ours, theirs = net(x.clone().requires_grad_()), reference(x.clone().requires_grad_())
    assert ours.shape == (2, 3, *size) and torch.equal(ours, theirs)
    ours.square().sum().backward()
    theirs.square().sum().backward()
    # gradients reach thousands: compare at each gradient's scale; a weight's gradient sums over batch x pixels
    for (name, p), q in zip(net.named_parameters(), reference.parameters()):
        assert_close_to_scale(p.grad, q.grad, x.shape[0] * x.shape[-2] * x.shape[-1], name)
    set_decoder_padding(net, always=True)
    assert all(type(m) is UpCat for m in net.modules() if isinstance(m, UpCat))


@pytest.mark.parametrize("bundle", ["pretrain_bim", "finetune_seg", "meanteacher_seg"])
@pytest.mark.parametrize("deterministic", [True, False])
def test_every_training_bundle_applies_cudnn_deterministic_in_initialize(bundle, deterministic):
    """Each train.json's ``initialize`` seeds and sets cuDNN from its ``cudnn_deterministic`` key (finetune_seg's
    default True, where autotuning measured slower; False for pretrain_bim since 0.2.6 and meanteacher_seg since
    0.7.1, where cuDNN's autotuning measured 1.13-1.21x and 1.15x faster on an H100).
    MONAI runs ``initialize`` before it puts the bundle's folder on sys.path, so these expressions may use only
    what the config imports (torch, monai), not the bundle's ``scripts``: the parser here gets no path either."""
    from monai.bundle import ConfigParser

    saved = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    try:
        parser = ConfigParser()
        parser.read_config(str(ROOT / "bundles" / bundle / "configs" / "train.json"))
        assert parser["cudnn_deterministic"] is (bundle == "finetune_seg")
        parser["cudnn_deterministic"] = deterministic
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = (not deterministic), deterministic
        parser.get_parsed_content("initialize", instantiate=True)
        assert torch.backends.cudnn.deterministic is deterministic and torch.backends.cudnn.benchmark is (not deterministic)
        first = torch.rand(2)
        parser.get_parsed_content("initialize", lazy=False)  # run again (not from the cache): seeded again, the same draw
        assert torch.equal(first, torch.rand(2))
        for name in ("train.json", "multi_gpu_train.json", "evaluate.json"):  # one definition, used by every entry point
            path = ROOT / "bundles" / bundle / "configs" / name
            initialize = json.loads(path.read_text()).get("initialize") if path.exists() else None
            if initialize is not None:  # a file without its own list runs train.json's
                assert "@determinism" in initialize, name
    finally:
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved


def test_the_fine_tuning_step_minimises_the_loss_function_given_and_the_bundles_default_is_cross_entropy():
    """``train#trainer#loss_function`` is what the fine-tuning step (MONAI's SupervisedTrainer iteration on the batch
    that :class:`bim.finetune.AugmentBatch` augments) minimises (a MONAI loss works as an override); both training
    bundles default to the paper's cross-entropy."""
    import torch.nn.functional as F
    from monai.bundle import ConfigParser
    from monai.losses import DiceCELoss

    from bim.finetune import FineTuneTrainer
    from bim.segmentation import SegmentationAugment, labelled_cross_entropy

    torch.manual_seed(0)
    batch = {"image": torch.rand(2, 1, 48, 48), "label": torch.randint(0, 2, (2, 1, 48, 48)).to(torch.uint8)}
    initial = build_unet(out_channels=2, features=SMALL).state_dict()

    def run(loss_function=labelled_cross_entropy):
        net = build_unet(out_channels=2, features=SMALL)
        net.load_state_dict(initial)
        augment = SegmentationAugment(crop_size=32, generator=torch.Generator().manual_seed(1))
        trainer = FineTuneTrainer(device="cpu", max_epochs=1, epoch_length=1, train_data_loader=[batch], network=net,
                                  optimizer=torch.optim.SGD(net.parameters(), lr=0.0), loss_function=loss_function,
                                  augment=augment)
        trainer.run()
        return trainer.state.output

    ce, dice_ce = run(), run(DiceCELoss(to_onehot_y=True, softmax=True))
    assert ce["label"].dtype == torch.long and ce["image"].shape == ce["label"].shape == (2, 1, 32, 32)
    assert torch.equal(ce["image"], dice_ce["image"])  # the same augmentation draw
    assert torch.allclose(ce["loss"], F.cross_entropy(ce["pred"], ce["label"][:, 0]))
    assert float(dice_ce["loss"]) > float(ce["loss"]) + 0.1  # the Dice term was added (same augmentation, same net)
    for bundle in ("finetune_seg", "meanteacher_seg"):
        sys.path.insert(0, str(ROOT / "bundles" / bundle))  # MONAI puts the bundle folder on sys.path in run()
        try:
            parser = ConfigParser()
            parser.read_config(str(ROOT / "bundles" / bundle / "configs" / "train.json"))
            assert parser.get_parsed_content("train#trainer#loss_function") is labelled_cross_entropy
            if bundle == "meanteacher_seg":  # the semi-supervised step's labelled term is that same loss
                assert parser["train#step_settings#supervised_loss_function"].replace("::", "#") == "@train#trainer#loss_function"
        finally:
            sys.path.remove(str(ROOT / "bundles" / bundle))


def test_cluster_net_ablate_levels_removes_only_that_levels_spatial_information():
    # the path-dependence probe of pretrain_bim: a level reaches the decoder as its per-channel spatial mean
    from bim.pretrain.model import BIMClusterNet

    torch.manual_seed(0)
    net = BIMClusterNet(num_clusters=6, num_subheads=1, features=SMALL).train()  # batch statistics: levels well scaled
    x = torch.randn(2, 1, 64, 64)
    glob, dense = net.embeddings(x)
    assert torch.equal(net.embeddings(x, [])[1], dense)
    for level in range(5):
        g, d = net.embeddings(x, [level])
        assert torch.equal(g, glob) and d.shape == dense.shape  # the global embedding is never ablated
        assert (d - dense).abs().max() > 1e-3, f"ablating level {level} must change the dense embedding"
    # an image whose level-4 features are already spatially constant is unchanged by ablating level 4
    net.unet.down_4.register_forward_hook(lambda m, i, o: o.mean((-2, -1), keepdim=True).expand_as(o).contiguous())
    # ablating recomputes the mean of the level's already equal values: a sum of (64 / 16)^2 rounded terms, whose
    # relative error the decoder (batch statistics) carries to every output at the output's scale
    level4_terms = (x.shape[-2] // 16) * (x.shape[-1] // 16)
    assert_close_to_scale(net.embeddings(x, [4])[1], net.embeddings(x)[1], level4_terms, "level 4 ablated")
    with pytest.raises(ValueError, match="ablate_levels must be encoder levels 0-4"):
        net.embeddings(x, [5])


def test_cluster_net_dense_level_takes_a_deeper_decoder_block():
    from bim.network import dense_channels
    from bim.pretrain.model import BIMClusterNet

    torch.manual_seed(0)
    net = BIMClusterNet(num_clusters=6, num_subheads=1, features=SMALL).eval()
    x = torch.randn(2, 1, 64, 64)
    glob, last = net.embeddings(x)
    assert tuple(last.shape) == (2, SMALL[5], 64, 64)  # the paper's block (upcat_1) is the default
    for level, (channels, size) in {2: (16, 32), 3: (32, 16), 4: (64, 8)}.items():
        deeper = BIMClusterNet(num_clusters=6, num_subheads=1, features=SMALL, dense_level=level).eval()
        deeper.unet.load_state_dict(net.unet.state_dict())  # the same U-Net (the head's input width differs)
        g, d = deeper.embeddings(x)
        assert torch.equal(g, glob) and tuple(d.shape) == (2, channels, size, size) == (2, dense_channels(SMALL, level), size, size)
        assert tuple(deeper(x).shape) == (2, 6, 64, 64)  # the logits are upsampled to the image
    assert dense_channels(SMALL, 1) == SMALL[5]
    for bad in (0, 5, True, "2"):
        with pytest.raises(ValueError, match="dense_level must be one of"):
            dense_channels(SMALL, bad)


def test_cpu_inference_runs_in_bf16_only_where_the_cpu_has_it_and_keeps_the_segmentation():
    """inference.json's ``cpu_bf16``: on a CPU with native bf16 the slices run under bf16 autocast in channels-last
    layout (about 3x faster, ``tools/benchmark_inference.py``); elsewhere the output is exactly fp32's."""
    from bim.engine import cpu_has_native_bf16
    from bim.inference import SliceBatchInferer

    torch.manual_seed(0)
    net = build_unet(out_channels=2, features=SMALL).eval()
    scan = torch.rand(1, 1, 40, 40, 3)
    with torch.inference_mode():
        fp32 = SliceBatchInferer(amp=True)(scan, net)
        fp32_in_twos = SliceBatchInferer(amp=True, max_slices=2)(scan, net)  # the same chunks as ``mixed``
        off = SliceBatchInferer(amp=False, cpu_bf16=True)(scan, net)
        mixed = SliceBatchInferer(amp=True, cpu_bf16=True, max_slices=2)(scan, net)  # may make net channels-last
    assert mixed.dtype == fp32.dtype == torch.float32 and mixed.shape == fp32.shape
    torch.testing.assert_close(off, fp32, rtol=0, atol=0)
    if not cpu_has_native_bf16():
        # bit for bit against fp32 run in the same chunks (a batch of 2 and one of 3 may take different convolution
        # kernels on some CPUs, e.g. AVX2 without AVX-512, which moves the 7th digit)
        torch.testing.assert_close(mixed, fp32_in_twos, rtol=0, atol=0)
        return
    assert not torch.equal(mixed, fp32)  # bf16 really ran
    # bf16 keeps 8 bits of mantissa: the logits move by a few parts in 2**8 of their scale, the argmax hardly at all
    assert float((mixed - fp32).abs().max()) <= 0.05 * float(fp32.abs().max())
    assert float((mixed.argmax(1) == fp32.argmax(1)).float().mean()) >= 0.98


# ---------------------------------------------------------------------------------------- resume and best model


@pytest.mark.parametrize("epochs, interval, stop_at, validated", [
    (5, 2, None, [2, 4, 5]),  # the last epoch is not a multiple of the interval: validated when training completes
    (4, 2, None, [2, 4]),  # it is: validated once
    (3, 1, None, [1, 2, 3]),
    (6, 2, 4, [2, 4]),  # an early stop after the validation of epoch 4: nothing more
])
def test_validation_runs_every_interval_and_once_after_the_last_epoch(epochs, interval, stop_at, validated):
    from unittest import mock

    from ignite.engine import Engine
    from monai.engines import Evaluator

    from bim.inference import LastEpochValidationHandler

    trainer = Engine(lambda e, b: None)
    validator = mock.MagicMock(spec=Evaluator)
    validator.run.side_effect = lambda epoch: trainer.terminate() if epoch == stop_at else None
    LastEpochValidationHandler(interval, validator).attach(trainer)
    trainer.run(range(2), max_epochs=epochs)
    assert [c.args[0] for c in validator.run.call_args_list] == validated
    with pytest.raises(ValueError, match="val_interval must be >= 1, got 0"):
        LastEpochValidationHandler(0, validator)


def test_resume_takes_only_an_interrupted_run_of_the_same_settings(tmp_path, caplog):
    from ignite.engine import Engine

    from bim.engine import ResumeFromCheckpoint, settings_fingerprint

    engine = Engine(lambda e, b: None)
    engine.state.max_epochs, engine.state.epoch_length = 2, 3
    fingerprint = settings_fingerprint(task="lv", epochs=2, data=[{"image": "a.nii.gz"}])
    assert fingerprint == settings_fingerprint(data=[{"image": "a.nii.gz"}], epochs=2, task="lv")  # order-free
    assert fingerprint != settings_fingerprint(task="lv", epochs=3, data=[{"image": "a.nii.gz"}])
    path = tmp_path / "checkpoint_last.pt"
    resume = ResumeFromCheckpoint("auto", {}, save_dir=str(tmp_path), fingerprint=fingerprint)
    other = settings_fingerprint(task="rv", epochs=2, data=[{"image": "a.nii.gz"}])
    for iteration, stored, expected in ((4, fingerprint, True), (4, other, False), (4, "0123456789abcdef", False),
                                        (6, fingerprint, False)):
        torch.save({"trainer": {"iteration": iteration}, "fingerprint": stored}, path)
        with caplog.at_level("INFO", logger="bim"):
            assert resume.resumable(path, engine) is expected
    assert 'is of a run with other settings (task: "rv" -> "lv"): not resuming it' in caplog.text
    assert "is of a run with other settings (unrecorded settings)" in caplog.text
    assert f"(--resume_from {path} resumes it anyway; another output_dir keeps both runs)" in caplog.text
    assert "is of a finished run (6 of 6 iterations): training again from the start" in caplog.text


def test_best_metric_saver_keeps_a_better_earlier_model(tmp_path, caplog):
    import os
    import stat
    from types import SimpleNamespace

    from bim.inference import BestMetricSaver

    net = torch.nn.Linear(2, 1)
    earlier = {k: torch.zeros_like(v) for k, v in net.state_dict().items()}
    torch.save(earlier, tmp_path / "model.pt")
    (tmp_path / "best_metric.json").write_text(json.dumps({"metric": "val_mean_dice", "value": 0.8, "epoch": 7}))
    saver = BestMetricSaver(net, str(tmp_path), info={"task": "lv"})
    validation = lambda dice, epoch: SimpleNamespace(state=SimpleNamespace(metrics={"val_mean_dice": dice}, epoch=epoch))  # noqa: E731
    with caplog.at_level("INFO", logger="bim"):
        saver(validation(0.5, 1))
    assert "val_mean_dice 0.5000 is this run's best but not above the 0.8000 of the model.pt" in caplog.text
    kept = torch.load(tmp_path / "model.pt", weights_only=True)
    assert all(torch.equal(kept[k], earlier[k]) for k in earlier)
    assert json.loads((tmp_path / "best_metric.json").read_text())["value"] == 0.8
    assert json.loads((tmp_path / "best_metric_new.json").read_text())["value"] == 0.5
    assert (tmp_path / "model_new.pt").is_file()
    saver(validation(0.9, 2))  # better than the earlier model: replaces it
    replaced = torch.load(tmp_path / "model.pt", weights_only=True)
    assert all(torch.equal(replaced[k], v) for k, v in net.state_dict().items())
    assert json.loads((tmp_path / "best_metric.json").read_text())["value"] == 0.9
    for name in ("model.pt", "best_metric.json", "model_new.pt", "best_metric_new.json"):
        assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == 0o644, name


def test_atomic_save_removes_what_a_killed_save_left_and_keeps_a_running_ones(tmp_path):
    """A save killed mid-write leaves ``.NAME.HOST.PID-*.tmp``; the next save of that file removes it when that
    process is gone, never while it runs."""
    import socket
    import subprocess
    import sys

    from bim.engine import atomic_save

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    host = socket.gethostname()
    stale = tmp_path / f".model.pt.{host}.{int(dead.stdout)}-abc.tmp"
    live = tmp_path / f".model.pt.{host}.{__import__('os').getpid()}-def.tmp"
    other_host = tmp_path / f".model.pt.elsewhere.{int(dead.stdout)}-ghi.tmp"
    for f in (stale, live, other_host):
        f.write_bytes(b"half")
    atomic_save({"w": torch.ones(1)}, tmp_path / "model.pt")
    assert not stale.exists() and live.exists() and other_host.exists()
    assert (tmp_path / "model.pt").stat().st_mode & 0o777 == 0o644
    assert torch.load(tmp_path / "model.pt", weights_only=True)["w"].item() == 1.0


def test_weights_of_other_widths_end_with_a_line_naming_the_features_option():
    """A ``model.pt`` trained with other ``--features`` fails in ``load_state_dict`` with one "size mismatch" line per
    tensor, wrapped by MONAI; the last line names the option to set."""
    from bim.errors import last_line

    small = build_unet(out_channels=2, features=SMALL)
    try:
        try:
            build_unet(out_channels=2).load_state_dict(small.state_dict())
        except RuntimeError as inner:
            raise RuntimeError("Failed to instantiate component 'CheckpointLoader'") from inner
    except RuntimeError as outer:
        line = last_line(outer)
    assert line.startswith("error: the weights do not fit this network (size mismatch for ")
    assert line.endswith("pass the --features (and --unet_style, --num_clusters) the model was trained with")
    assert last_line(ValueError("one line")) is None


def _recorded_run(tmp_path, patience, dices=(0.5, 0.6, 0.55, 0.58, 0.7)):
    """An ``EarlyStopRecord`` of ``patience`` watching a one-weight network whose weight is the epoch number, over
    validations of ``dices``; returns it, its saver and its trainer after the run's end."""
    from types import SimpleNamespace

    from ignite.engine import Engine

    from bim.inference import BestMetricSaver, EarlyStopRecord

    net = torch.nn.Linear(1, 1, bias=False)
    saver = BestMetricSaver(net, str(tmp_path))
    trainer = Engine(lambda engine, batch: None)
    recorder = EarlyStopRecord(patience, saver, validator=None)
    recorder.trainer = trainer
    recorder._start(trainer)
    for epoch, dice in enumerate(dices, start=1):
        trainer.state.epoch, trainer.state.iteration = epoch, 10 * epoch
        net.weight.data.fill_(float(epoch))
        validator = SimpleNamespace(state=SimpleNamespace(epoch=epoch, metrics={"val_mean_dice": dice}))
        saver(validator)
        recorder._validated(validator)
    recorder._completed(trainer)
    return recorder, saver, trainer


def test_early_stop_record_copies_the_best_weights_at_the_stop_and_ignores_later_gains(tmp_path):
    """Validation Dice 0.5, 0.6, 0.55, 0.58, 0.7 with patience 2: early stopping would end after epoch 4 with the
    weights of epoch 2; the record keeps those although epoch 5 then beats them (model.pt moves on)."""
    from bim.inference import EarlyStopRecord

    recorder, saver, trainer = _recorded_run(tmp_path, 2)
    [record] = json.loads((tmp_path / "early_stop_record.json").read_text())
    assert (record["stopped"], record["epoch"], record["iteration"], record["best_epoch"], record["run_epochs"]) == (
        True, 4, 40, 2, 5)
    assert record["best_value"] == pytest.approx(0.6)
    assert float(torch.load(tmp_path / "model_patience2.pt", weights_only=True)["weight"]) == 2.0
    assert float(torch.load(tmp_path / "model.pt", weights_only=True)["weight"]) == 5.0
    # a run resumed after the stop keeps the record; its seconds are of another process, so no time share
    resumed = EarlyStopRecord(2, saver, validator=None)
    resumed.load_state_dict(recorder.state_dict())
    resumed.trainer = trainer
    resumed._start(trainer)
    resumed._completed(trainer)
    [again] = json.loads((tmp_path / "early_stop_record.json").read_text())
    assert (again["epoch"], again["best_epoch"], again["run_seconds"]) == (4, 2, None)
    for bad in (0, [], [1, 0], True, "5"):
        with pytest.raises(ValueError, match="record_early_stop"):
            EarlyStopRecord(bad, saver, None)


def test_early_stop_record_of_several_patiences_records_each_on_the_same_run(tmp_path):
    """Validation Dice 0.5, 0.6, 0.55, 0.7, 0.6, 0.65 with patiences [3, 1, 2]: patience 1 would stop after
    epoch 3 (best epoch 2), patience 2 after epoch 6 (best 4); patience 3 never runs out and keeps the run's best
    (epoch 4). One record each, ascending, each with its own weights; the run's own epochs in all three."""
    _recorded_run(tmp_path, [3, 1, 2], dices=(0.5, 0.6, 0.55, 0.7, 0.6, 0.65))
    records = json.loads((tmp_path / "early_stop_record.json").read_text())
    assert [(r["patience"], r["stopped"], r["epoch"], r["best_epoch"], r["run_epochs"]) for r in records] == [
        (1, True, 3, 2, 6), (2, True, 6, 4, 6), (3, False, 6, 4, 6)]
    weights = [float(torch.load(tmp_path / f"model_patience{n}.pt", weights_only=True)["weight"]) for n in (1, 2, 3)]
    assert weights == [2.0, 4.0, 4.0]
    assert records[0]["seconds"] <= records[1]["seconds"] <= records[2]["seconds"] <= records[2]["run_seconds"]


def test_channels_last_converts_an_accelerators_network_only_and_checks_the_flag():
    """The bundles' ``channels_last`` key: a network off the CPU (here on the meta device, which stands for CUDA)
    gets its 4-D weights in channels-last layout; on the CPU, or with the key false, the network is left as it is."""
    from bim.network import to_channels_last

    def layouts(net):
        return {p.is_contiguous(memory_format=torch.channels_last) and not p.is_contiguous()
                for p in net.parameters() if p.dim() == 4 and p.shape[1] > 1 and p.shape[2] > 1}

    tiny = (4, 4, 8, 8, 16, 4)
    accelerated = to_channels_last(build_unet(out_channels=2, features=tiny).to("meta"), True)
    assert layouts(accelerated) == {True}
    assert layouts(to_channels_last(build_unet(out_channels=2, features=tiny).to("meta"), "false")) == {False}
    assert layouts(to_channels_last(build_unet(out_channels=2, features=tiny), True)) == {False}
    with pytest.raises(ValueError, match="channels_last"):
        to_channels_last(build_unet(out_channels=2, features=tiny), "maybe")
