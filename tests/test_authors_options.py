"""The pre-training options that follow the authors' code, one test each: what the option changes, on
small CPU tensors. They are the bundle's defaults; ``configs/earlier_defaults.json`` turns all of them off."""

import json

import pytest
import torch
from torch import nn

from bim.gpu_augment import (
    nearest_gather,
    EquivariantPairTransform,
    brightness_contrast_jitter,
    check_factor_range,
    crop_matrices,
    mirror_matrices,
    pretrain_views,
    random_affine_matrices,
    warp,
)
from bim.network import NearestUpsample2x, build_unet, unet_style_of
from bim.pretrain.heads import ClusterHead
from bim.pretrain import losses as L
from bim.pretrain.trainer import dense_objectives

from bundle_helpers import BUNDLES


# ---------------------------------------------------------------------------------------------- the two views


def test_without_jitter_there_is_one_view_made_as_before():
    image = torch.rand(3, 1, 40, 40)
    x1, x2 = pretrain_views(image, 24, torch.Generator().manual_seed(5))
    assert x1 is x2
    g = torch.Generator().manual_seed(5)  # the earlier code: a crop with flips, same random stream
    crop = crop_matrices(3, (40, 40), (24, 24), g)
    flips = random_affine_matrices(3, g, (1.0, 1.0), 0.0, 0.0, flip_prob=0.5)
    assert torch.equal(x1, warp(image, crop @ flips, (24, 24)))


def test_jittered_views_share_the_geometry_and_differ_by_an_affine_intensity_map():
    image = torch.rand(6, 1, 48, 48) * 0.4 + 0.3  # mid-grey: factors in [0.5, 1.5] never clamp at 0 or 1
    x1, x2 = pretrain_views(image, 32, torch.Generator().manual_seed(0), rotation_deg=45.0, jitter=(0.5, 1.5))
    differ = 0
    for a, b in zip(x1.flatten(1), x2.flatten(1)):
        inside = (a > 0) & (b > 0)  # a rotated crop can reach the zero padding
        slope, intercept = torch.linalg.lstsq(torch.stack([a[inside], torch.ones_like(a[inside])], 1), b[inside, None]).solution[:, 0]
        assert torch.allclose(slope * a[inside] + intercept, b[inside], atol=1e-5), "same pixels, other intensities"
        differ += int(abs(float(slope) - 1) > 1e-3)
    assert differ >= 5, "each view draws its own brightness and contrast"


def test_brightness_contrast_jitter_factors_lie_in_their_range():
    x = torch.rand(200, 1, 8, 8) * 0.2 + 0.4  # no clamping for factors in [0.5, 1.5]
    y = brightness_contrast_jitter(x, torch.Generator().manual_seed(1), (0.5, 1.5))
    # y = c * b * x + (1 - c) * b * mean(x): the slope against x is b * c in [0.25, 2.25], the mean is b * mean(x)
    slope = (y - y.mean((1, 2, 3), keepdim=True)).flatten(1).norm(dim=1) / (x - x.mean((1, 2, 3), keepdim=True)).flatten(1).norm(dim=1)
    b = y.mean((1, 2, 3)) / x.mean((1, 2, 3))
    assert 0.5 - 1e-5 <= float(b.min()) and float(b.max()) <= 1.5 + 1e-5 and float(b.max() - b.min()) > 0.8
    c = slope / b
    assert 0.5 - 1e-4 <= float(c.min()) and float(c.max()) <= 1.5 + 1e-4 and float(c.max() - c.min()) > 0.8


def test_view_rotation_rotates_the_crop_by_up_to_its_angle():
    g = torch.Generator().manual_seed(2)
    image = torch.zeros(1, 1, 41, 41)
    image[..., 20, 20:] = 1.0  # a ray from the centre to the right
    angles = []
    for _ in range(60):
        x, _ = pretrain_views(image, 41, g, rotation_deg=30.0)
        ys, xs = torch.nonzero(x[0, 0] > 0.2, as_tuple=True)
        far = (ys - 20.0) ** 2 + (xs - 20.0) ** 2 > 100
        angle = torch.rad2deg(torch.atan2(ys[far] - 20.0, xs[far] - 20.0)).median()
        angles.append(float(min(abs(angle), 180 - abs(angle))))  # flips mirror the ray
    assert max(angles) <= 30.0 + 3.0 and max(angles) > 20.0


@pytest.mark.parametrize("bad", [[1.5, 0.5], [-0.1, 1.0], "0.5", [0.5], [True, 1.0]])
def test_a_bad_view_jitter_names_the_key(bad):
    with pytest.raises(ValueError, match="view_jitter"):
        check_factor_range("view_jitter", bad)


# ------------------------------------------------------------------------------------------- the transform T


def test_mirror_flips_one_axis_with_its_probability_and_draws_nothing_at_zero():
    g = torch.Generator().manual_seed(0)
    m = mirror_matrices(4000, g, 0.9)
    diag = torch.diagonal(m[:, :2, :2], dim1=1, dim2=2)
    flipped = (diag < 0).sum(1)
    assert set(flipped.tolist()) <= {0, 1}, "one axis at a time"
    assert abs(float(flipped.float().mean()) - 0.9) < 0.02
    assert abs(float((diag[:, 0] < 0).float().mean()) - 0.45) < 0.03  # W and H equally often
    state = g.get_state()
    assert torch.equal(mirror_matrices(3, g, 0.0), torch.eye(3, dtype=torch.float64).repeat(3, 1, 1))
    assert torch.equal(g.get_state(), state)


def test_default_transform_draws_the_same_states_as_before():
    old = EquivariantPairTransform().sample(5, torch.Generator().manual_seed(3))
    g = torch.Generator().manual_seed(3)
    affine = random_affine_matrices(5, g, (0.8, 1.3), 45.0, 0.1)
    assert torch.equal(old.affine, affine)


def test_authors_transform_uses_nearest_uniform_gamma_and_mirror_on_both_branches():
    t = EquivariantPairTransform(interpolation="nearest", mirror_prob=1.0, gamma_sampling="uniform")
    p = t.sample(400, torch.Generator().manual_seed(0))
    assert float(p.gamma_image.min()) >= 0.5 and float(p.gamma_image.max()) <= 2.0
    assert abs(float((p.gamma_image < 1.25).double().mean()) - 0.5) < 0.08, "uniform on [0.5, 2], median 1.25"
    assert bool((torch.linalg.det(p.affine[:, :2, :2]) < 0).all()), "every state mirrored"
    x = torch.randint(1, 50, (400, 1, 16, 16)).float() / 50  # values of the image (gamma 1 keeps them)
    p.gamma_image = torch.ones(400, dtype=torch.float64)
    out = t.apply_image(x, p)
    for a, b in zip(x, out):  # nearest: every output pixel is an input pixel or the zero padding
        assert set(b.unique().tolist()) <= set(a.unique().tolist()) | {0.0}
    feats = t.apply_features(x, p)
    assert torch.equal(feats, out), "the feature branch samples the same pixels"


@pytest.mark.parametrize("key,kwargs", [("t_interpolation", {"interpolation": "bicubic"}),
                                        ("t_mirror_prob", {"mirror_prob": 1.5}),
                                        ("t_gamma_sampling", {"gamma_sampling": "normal"}),
                                        ("feature_warp_fp32", {"feature_warp_fp32": "yes"})])
def test_a_bad_transform_setting_names_its_key(key, kwargs):
    with pytest.raises(ValueError, match=key):
        EquivariantPairTransform(**kwargs)


# ------------------------------------------------------------------------- precision of the equivariance target


def test_fp32_feature_warp_of_bf16_features_lands_within_a_hundredth_of_a_pixel_of_the_image_warp():
    t_old, t_new = EquivariantPairTransform(), EquivariantPairTransform(feature_warp_fp32=True)
    p = t_old.sample(6, torch.Generator().manual_seed(0))
    h = 224  # integer ramps are exact in bf16 up to 256: the warped value is the sampled position in pixels
    xs = torch.arange(h, dtype=torch.float32).view(1, 1, 1, h).expand(6, 1, h, h)
    ramps = torch.cat([xs, xs.transpose(-1, -2)], 1)
    image_warp = warp(ramps, p.affine)  # where the image branch samples (fp32)
    inside = t_old.valid_mask(p, ramps)[:, 0] > 0
    with torch.autocast("cpu", dtype=torch.bfloat16):  # as in training: the feature warp runs under bf16 autocast
        new = t_new.apply_features(ramps.bfloat16(), p)
    assert new.dtype == torch.float32
    offset = (new - image_warp).norm(dim=1)[inside]
    assert float(offset.max()) < 0.01
    # the default path casts the grid to the features' dtype: sampled on that bf16-rounded grid, the positions are
    # off by a fraction of a pixel (measured on fp32 ramps, so that only the grid's rounding counts)
    grid = torch.nn.functional.affine_grid(p.affine[:, :2].float(), [6, 1, h, h], align_corners=False)
    rounded = torch.nn.functional.grid_sample(ramps, grid.bfloat16().float(), align_corners=False)
    assert float((rounded - image_warp).norm(dim=1)[inside].mean()) > 0.05


def test_nearest_feature_warp_gathers_the_bf16_features_at_the_fp32_positions_of_the_image_warp():
    """With the authors' nearest interpolation the fp32-grid feature warp returns the bf16 features themselves
    (channels-last, no fp32 copy), each taken from the pixel the fp32 image warp samples: integer ramps come out
    equal to the image warp of the same ramps wherever T lands inside the image, zero outside."""
    t = EquivariantPairTransform(interpolation="nearest", mirror_prob=0.9, feature_warp_fp32=True)
    p = t.sample(6, torch.Generator().manual_seed(0))
    h = 224
    xs = torch.arange(h, dtype=torch.float32).view(1, 1, 1, h).expand(6, 1, h, h)
    ramps = torch.cat([xs, xs.transpose(-1, -2)], 1)
    image_warp = t.apply_image(ramps, type(p)(affine=p.affine))  # geometry only: no gamma
    inside = t.valid_mask(p, ramps)[:, 0] > 0
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast would run affine_grid's matmul in bf16
        new = t.apply_features(ramps.bfloat16().contiguous(memory_format=torch.channels_last), p)
    assert new.dtype == torch.bfloat16 and new.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(new.float().permute(0, 2, 3, 1)[inside], image_warp.permute(0, 2, 3, 1)[inside])
    assert not new.float().permute(0, 2, 3, 1)[~inside].any()


def test_nearest_gather_is_grid_sample_nearest_forward_and_backward():
    """nearest_gather = grid_sample(mode="nearest", zeros, align_corners=False) in value and gradient. Positions
    within 1e-3 px of a half-integer may round either way (a fused multiply-add changes the last bit), so they are
    left out of the comparison."""
    g = torch.Generator().manual_seed(1)
    theta = torch.randn(3, 2, 3, generator=g) * 0.3 + torch.tensor([[1.0, 0, 0], [0, 1.0, 0]])
    grid = torch.nn.functional.affine_grid(theta, [3, 1, 40, 56], align_corners=False)
    x = torch.randn(3, 5, 48, 64, generator=g, requires_grad=True)
    out = nearest_gather(x, grid)
    ref = torch.nn.functional.grid_sample(x, grid, mode="nearest", align_corners=False)
    pos = torch.stack([((grid[..., 0] + 1) * 64 - 1) / 2, ((grid[..., 1] + 1) * 48 - 1) / 2])
    clear = ((pos - pos.floor() - 0.5).abs() > 1e-3).all(0)
    assert clear.float().mean() > 0.99
    assert torch.equal(out.permute(0, 2, 3, 1)[clear], ref.permute(0, 2, 3, 1)[clear])
    upstream = torch.randn(out.shape, generator=g) * clear[:, None]
    (grad,) = torch.autograd.grad((out * upstream).sum(), x)
    (grad_ref,) = torch.autograd.grad((ref * upstream).sum(), x)
    torch.testing.assert_close(grad, grad_ref, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------------------------- the decoder


def test_authors_unet_has_relu_no_bias_bn_momentum_001_and_nearest_upsampling():
    net = build_unet(1, 2, features=(8, 8, 16, 16, 32, 8), unet_style="authors")
    convs = [m for n, m in net.named_modules() if isinstance(m, nn.Conv2d) and not n.startswith("final_conv")]
    assert convs and all(c.bias is None for c in convs)
    bns = [m for m in net.modules() if isinstance(m, nn.BatchNorm2d)]
    assert bns and all(bn.momentum == 0.01 for bn in bns)
    assert not any(isinstance(m, (nn.LeakyReLU, nn.ConvTranspose2d)) for m in net.modules())
    for block in (net.upcat_4, net.upcat_3, net.upcat_2, net.upcat_1):
        up, conv = block.upsample[0], block.upsample[1]
        assert isinstance(up, NearestUpsample2x) and up.mode == "nearest" and conv.kernel_size == (3, 3)
    x = torch.rand(2, 1, 32, 32)
    assert net(x).shape == (2, 2, 32, 32)
    # weights round-trip into a fresh network of the same style (what a fine-tune loads)
    other = build_unet(1, 2, features=(8, 8, 16, 16, 32, 8), unet_style="authors")
    assert other.load_state_dict(net.state_dict()) is not None
    monai_keys = set(build_unet(1, 2, features=(8, 8, 16, 16, 32, 8)).state_dict())
    assert set(net.state_dict()) != monai_keys, "the styles' weights differ: fine-tune with the same style"


def test_authors_decoder_features_are_post_relu():
    from bim.pretrain.model import BIMClusterNet

    net = BIMClusterNet(num_clusters=4, num_subheads=1, features=(8, 8, 16, 16, 32, 8), unet_style="authors").eval()
    _, dense = net.embeddings(torch.rand(2, 1, 32, 32))
    assert float(dense.min()) >= 0.0
    assert torch.jit.script(net)(torch.rand(1, 1, 32, 32)).shape == (1, 4, 32, 32)  # the authors' decoder exports too


def test_a_bad_unet_style_names_the_key():
    with pytest.raises(ValueError, match="unet_style"):
        build_unet(1, 2, unet_style="keras")


UPSAMPLE_INPUTS = [(shape, fmt) for shape in ((2, 3, 5, 7), (2, 3, 4, 6), (2, 1, 5, 7), (2, 3, 1, 1))
                   for fmt in (torch.contiguous_format, torch.channels_last)]


@pytest.mark.parametrize("shape, fmt", UPSAMPLE_INPUTS)
def test_nearest_upsample_is_the_interpolation_bit_for_bit_in_its_memory_format(shape, fmt):
    # odd and even sizes, one channel (both formats at once) and 1 x 1 pixels (both formats at once, and where
    # reshape alone would return a stride-0 view)
    x = torch.randn(shape).contiguous(memory_format=fmt)
    ours, reference = NearestUpsample2x()(x), nn.functional.interpolate(x, scale_factor=2, mode="nearest")
    assert torch.equal(ours, reference)  # copies of the input's values: no rounding anywhere
    for layout in (torch.contiguous_format, torch.channels_last):
        assert ours.is_contiguous(memory_format=layout) == reference.is_contiguous(memory_format=layout), layout
    if fmt == torch.channels_last and shape[1] > 1 and shape[2] > 1:
        assert ours.is_contiguous(memory_format=torch.channels_last) and not ours.is_contiguous()


@pytest.mark.parametrize("shape, fmt", UPSAMPLE_INPUTS)
def test_nearest_upsample_gradient_is_the_interpolations(shape, fmt):
    """Each input pixel's gradient is the sum of its 2 x 2 block's output gradients, here and in the interpolation;
    only the order of the 3 additions may differ. In float64 with integer gradients every partial sum is exact, so
    the two are equal. In float32 with real gradients each order is within 3 u sum|g| of the exact sum (u = eps / 2,
    the unit roundoff, first order), so the two are within 2 x 3 u sum|g| = 3 eps sum|g| of each other, per pixel."""
    g64 = torch.randint(-1000, 1000, (shape[0], shape[1], 2 * shape[2], 2 * shape[3]), dtype=torch.float64)
    for g, exact in ((g64, True), (torch.randn(g64.shape), False)):
        x = torch.randn(shape, dtype=g.dtype).contiguous(memory_format=fmt).requires_grad_(True)
        (ours,) = torch.autograd.grad(NearestUpsample2x()(x), x, g)
        (reference,) = torch.autograd.grad(nn.functional.interpolate(x, scale_factor=2, mode="nearest"), x, g)
        if exact:
            assert torch.equal(ours, reference)
            continue
        block_abs = nn.functional.avg_pool2d(g.double().abs(), 2) * 4  # sum|g| over each 2 x 2 block
        bound = 3 * torch.finfo(torch.float32).eps * block_abs
        assert bool(((ours.double() - reference.double()).abs() <= bound).all())


def test_nearest_upsample_backward_is_a_sum_not_the_interpolations_scatter():
    """The reason for the module: traced as torch.compile traces it (AOT autograd), the interpolation's backward is
    an ``index_put`` with accumulation (a scatter; under inductor atomic adds, in no fixed order) and ours a ``sum``
    over each 2 x 2 block."""
    from functorch.compile import aot_function, make_boxed_func

    def backward_graph(module: nn.Module) -> str:
        graphs = {}

        def keep(name):
            def compiler(gm, _inputs):
                graphs[name] = gm.code
                return make_boxed_func(gm.forward)
            return compiler

        x = torch.rand(2, 3, 5, 7).contiguous(memory_format=torch.channels_last).requires_grad_(True)
        aot_function(module, fw_compiler=keep("forward"), bw_compiler=keep("backward"))(x).sum().backward()
        return graphs["backward"]

    reference, ours = backward_graph(nn.Upsample(scale_factor=2, mode="nearest")), backward_graph(NearestUpsample2x())
    assert "index_put" in reference
    assert "index_put" not in ours and "aten.sum" in ours


def test_authors_checkpoints_written_with_nn_upsample_load_strictly():
    features = (8, 8, 16, 16, 32, 8)
    old = build_unet(1, 2, features=features, unet_style="authors")
    for block in (old.upcat_4, old.upcat_3, old.upcat_2, old.upcat_1):
        block.upsample[0] = nn.Upsample(scale_factor=2, mode="nearest")  # the decoder as it was written before
    state = old.state_dict()
    assert unet_style_of(state) == "authors"
    new = build_unet(1, 2, features=features, unet_style="authors")
    new.load_state_dict(state, strict=True)
    x = torch.rand(2, 1, 32, 32)
    assert torch.equal(new.eval()(x), old.eval()(x))  # the same weights, the same copies: the same output


# ----------------------------------------------------------------------------------- L_CC on both maps, masks


def _tiny_dense_inputs(seed=0):
    """A seeded head and feature pair whose out-of-image band (the first 4 columns, outside ``mask``) holds the same
    constant features in both views, as zero padding gives after a warp: with the mask off they form a cluster."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # the head's initialisation
    head = ClusterHead(4, 5, 2)
    d_hat, d_tilde = torch.randn(2, 4, 16, 16, generator=g), torch.randn(2, 4, 16, 16, generator=g)
    d_hat[..., :4] = d_tilde[..., :4] = 3.0
    image = torch.rand(2, 1, 16, 16, generator=g)
    mask = torch.ones(2, 1, 16, 16)
    mask[..., :4] = 0
    return head, d_hat, d_tilde, image, mask


def test_cc_on_both_maps_averages_p_hat_and_p_tilde_of_every_subhead():
    head, d_hat, d_tilde, image, mask = _tiny_dense_inputs()
    kw = dict(use_mi=False, use_cc=True, use_imsat=False, edge="gradient_power", edge_power=0.75, bf16=False)
    one = dense_objectives(head, d_hat, d_tilde, image, mask, cc_maps="p_hat", **kw)[0]["cc"]
    both = dense_objectives(head, d_hat, d_tilde, image, mask, cc_maps="both", **kw)[0]["cc"]
    heads = head(torch.cat([d_hat, d_tilde]))
    cc = [float(L.cc_loss(image, h[i * 2:(i + 1) * 2], "gradient_power", 0.75)) for i in (0, 1) for h in heads]
    assert float(one) == pytest.approx(sum(cc[:2]) / 2, abs=1e-6)
    assert float(both) == pytest.approx(sum(cc) / 4, abs=1e-6)
    assert abs(float(both) - float(one)) > 1e-4


def test_without_the_mask_out_of_image_pixels_enter_the_joint():
    head, d_hat, d_tilde, image, mask = _tiny_dense_inputs(1)
    kw = dict(use_mi=True, use_cc=False, use_imsat=False, bf16=False)
    masked = dense_objectives(head, d_hat, d_tilde, image, mask, **kw)[0]["mi"]
    kept = dense_objectives(head, d_hat, d_tilde, image, None, **kw)[0]["mi"]
    heads = head(torch.cat([d_hat, d_tilde]))
    expected = sum(float(L.mi_loss(h[:2], h[2:], 0.5)) for h in heads) / 2
    assert float(kept) == pytest.approx(expected, abs=1e-6)
    assert abs(float(kept) - float(masked)) > 1e-4


# ---------------------------------------------------------------------------------------------- the bundle


def test_the_defaults_are_the_authors_options_and_train(demo_dataset, tmp_path):
    from test_pretrain_bundle import _train_workflow

    wf = _train_workflow(demo_dataset, tmp_path, ("train.json", "variants/ours_mi_cc.json"))
    trainer = wf.parser.get_parsed_content("train#trainer")
    t = trainer.pair_transform
    assert (t.interpolation, t.mirror_prob, t.gamma_sampling, t.feature_warp_fp32) == ("nearest", 0.9, "uniform", True)
    assert trainer.view_jitter == (0.5, 1.5) and trainer.view_rotation_deg == 45.0
    assert trainer.cc_maps == "both" and trainer.mask_out_of_image is False and trainer.edge == "gradient_power"
    assert isinstance(trainer.model.unet.upcat_1.upsample[0], nn.Upsample)
    trainer.run()
    out = trainer.state.output
    assert {"mi", "cc"} <= set(out) and all(torch.isfinite(out[k]) for k in ("mi", "cc"))


def test_earlier_defaults_config_turns_every_option_off(demo_dataset, tmp_path):
    from test_pretrain_bundle import _train_workflow

    wf = _train_workflow(demo_dataset, tmp_path, ("train.json", "variants/ours_mi_cc.json", "earlier_defaults.json"))
    options = json.loads((BUNDLES / "pretrain_bim" / "configs" / "earlier_defaults.json").read_text())
    trainer = wf.parser.get_parsed_content("train#trainer")
    t = trainer.pair_transform
    assert (t.interpolation, t.mirror_prob, t.gamma_sampling, t.feature_warp_fp32) == (
        options["t_interpolation"], options["t_mirror_prob"], options["t_gamma_sampling"], options["feature_warp_fp32"])
    assert trainer.view_jitter is None and trainer.view_rotation_deg == 0.0
    assert (trainer.cc_maps, trainer.mask_out_of_image, trainer.edge) == ("p_hat", True, "sobel")
    assert not isinstance(trainer.model.unet.upcat_1.upsample[0], nn.Upsample)
    defaults = json.loads((BUNDLES / "pretrain_bim" / "configs" / "train.json").read_text())
    assert {k for k in options if not k.startswith("_")} <= set(defaults), "each option is a key of train.json"


def test_a_bad_option_in_the_bundle_names_its_key(demo_dataset, tmp_path):
    from test_pretrain_bundle import _train_workflow

    wf = _train_workflow(demo_dataset, tmp_path, ("train.json", "variants/ours_mi_cc.json"), cc_maps="p_bar")
    with pytest.raises(Exception) as info:  # MONAI wraps the component's error in a RuntimeError
        wf.parser.get_parsed_content("train#trainer")
    error = info.value
    while error is not None and not isinstance(error, ValueError):
        error = error.__cause__
    assert error is not None and "cc_maps must be one of ('p_hat', 'both'), got 'p_bar'" in str(error)


# --------------------------------------------------------------------------------- the evaluation field of view


def test_center_crop_evaluation_keeps_the_centre_window_of_every_slice():
    from bim.inference import CenterCropSlicesd

    image = torch.arange(40 * 36 * 3, dtype=torch.float32).view(1, 40, 36, 3)
    label = (image % 4).to(torch.uint8)
    out = CenterCropSlicesd(["image", "label"], 24)({"image": image, "label": label, "name": "scan"})
    assert torch.equal(out["image"], image[:, 8:32, 6:30]) and torch.equal(out["label"], label[:, 8:32, 6:30])
    assert out["label"].dtype == torch.uint8 and out["name"] == "scan"
    small = CenterCropSlicesd("image", 48)({"image": image})["image"]  # a smaller slice is zero-padded
    assert small.shape == (1, 48, 48, 3) and float(small.sum()) == float(image.sum())
    whole = {"image": image}
    assert CenterCropSlicesd("image", None)(whole) is whole


def test_a_bad_center_crop_names_the_key():
    from bim.inference import CenterCropSlicesd

    with pytest.raises(ValueError, match="eval_center_crop"):
        CenterCropSlicesd("image", 0)


# ------------------------------------------------------------------------------------------------- the length


def test_the_authors_length_is_50_epochs_of_300_iterations(demo_dataset, tmp_path):
    from test_pretrain_bundle import _train_workflow

    wf = _train_workflow(demo_dataset, tmp_path, epochs=50, iters_per_epoch=300, warmup_epochs=10)
    trainer = wf.parser.get_parsed_content("train#trainer")
    assert trainer.state.max_epochs * trainer.state.epoch_length == 15_000
    lr = wf.parser.get_parsed_content("lr_scheduler").lr_lambdas[0]
    assert lr(3_000) == pytest.approx(1.0) and lr(1_500) < 1.0  # warm-up over 10 epochs of 300
    assert lr(14_999) < lr(9_000) < 1.0


@pytest.mark.parametrize("bundle", ["finetune_seg", "meanteacher_seg"])
def test_segmentation_bundles_score_the_centre_crop_and_build_the_authors_unet(bundle):
    from monai.bundle import ConfigParser

    from bim.inference import CenterCropSlicesd

    parser = ConfigParser()
    parser.read_config(str(BUNDLES / bundle / "configs" / "train.json"))
    parser["eval_center_crop"], parser["unet_style"] = 64, "authors"
    crops = [t for t in parser.get_parsed_content("validate#preprocessing").transforms if isinstance(t, CenterCropSlicesd)]
    assert len(crops) == 1 and crops[0].size == 64 and crops[0].keys == ["image", "label"]
    net = parser.get_parsed_content("network_def")
    assert isinstance(net.upcat_1.upsample[0], nn.Upsample)
