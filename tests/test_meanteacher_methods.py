"""Defining properties of the semi-supervised methods of meanteacher_seg (bim.semi_supervised), on the CPU.

EMA teacher, consistency ramp-up, UA-MT threshold and mask, ICT / MixUp targets, teacher-student geometric
alignment, entropy minimisation, adversarial training, pretrained initialisation of both networks.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]

from bim import semi_supervised as ss  # noqa: E402
from bim.network import build_unet  # noqa: E402
from bim.segmentation import SegmentationAugment, load_pretrained  # noqa: E402

TINY = (4, 8, 8, 16, 16, 4)


def _batch(b_l=2, b_u=2, size=48, seed=0, classes=2):
    g = torch.Generator().manual_seed(seed)
    return {"image": torch.rand(b_l, 1, size, size, generator=g),
            "label": torch.randint(0, classes, (b_l, 1, size, size), generator=g).to(torch.uint8),
            "unlabelled": torch.rand(b_u, 1, size, size, generator=g)}


SETTINGS_KEYS = ("rampup_iterations", "supervised_loss_function", "bf16", "channels_last", "compile_teacher",
                 "compile_mode")
TEACHER_METHODS = [name for name, cls in ss.METHODS.items() if cls.uses_teacher]


def _step(method, net, crop=32, **kwargs):
    """The method's class from the registry, built as the bundle builds it (weight 1, UA-MT paced over 1 iteration
    unless given)."""
    cls = ss.method_class(method)
    teacher = ss.ema_teacher(net, kwargs.pop("decay", 0.99)) if cls.uses_teacher else None
    opt = torch.optim.SGD(net.parameters(), lr=kwargs.pop("lr", 0.1))
    aug = kwargs.pop("augment", None) or SegmentationAugment(crop_size=crop, generator=torch.Generator().manual_seed(1))
    settings = ss.StepSettings(aug, opt, kwargs.pop("num_classes", 2), teacher=teacher,
                               **{k: kwargs.pop(k) for k in SETTINGS_KEYS if k in kwargs})
    if cls is ss.Supervised:
        return cls(settings)
    if cls is ss.UncertaintyAwareMeanTeacher:
        kwargs.setdefault("total_iterations", 1)
    return cls(settings, kwargs.pop("weight", 1.0), **kwargs)


def _float_state(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items() if v.is_floating_point()}


class OneHotNet(nn.Module):
    """An identity-like 'segmentation network': logits 20 * one_hot(round(x)) for images of 0/1 values, so its
    prediction is the image itself (pixel-wise: it commutes with any resampling that moves whole pixels)."""

    def __init__(self):
        super().__init__()
        self.dummy = nn.Parameter(torch.zeros(()))

    def forward(self, x):
        fg = x.round().clamp(0, 1)
        return 20 * torch.cat([1 - fg, fg], dim=1) + 0 * self.dummy


# ------------------------------------------------------------------------------------------------ schedules


def test_sigmoid_rampup_values():
    assert ss.sigmoid_rampup(0, 100) == pytest.approx(math.exp(-5))
    assert ss.sigmoid_rampup(50, 100) == pytest.approx(math.exp(-1.25))
    assert ss.sigmoid_rampup(80, 100) == pytest.approx(math.exp(-5 * 0.04))
    assert ss.sigmoid_rampup(100, 100) == 1.0 and ss.sigmoid_rampup(1000, 100) == 1.0
    assert ss.sigmoid_rampup(7, 0) == 1.0
    values = [ss.sigmoid_rampup(i, 100) for i in range(0, 101, 5)]
    assert all(a < b for a, b in zip(values, values[1:]))


def test_step_weight_is_ramped_and_total_loss_is_sup_plus_weighted_reg():
    torch.manual_seed(0)
    net = build_unet(out_channels=2, features=TINY)
    step = _step("entropy_min", net, weight=0.5, rampup_iterations=10)
    for it in (0, 5, 10, 30):
        out = step(net, _batch(), it)
        assert out["weight"] == pytest.approx(0.5 * ss.sigmoid_rampup(it, 10))
        assert float(out["loss"]) == pytest.approx(float(out["loss_sup"]) + out["weight"] * float(out["loss_reg"]), rel=1e-5)


def test_uncertainty_threshold_goes_from_three_quarters_ln_c_to_ln_c():
    for c in (2, 4):
        assert ss.uncertainty_threshold(0, 1000, c) == pytest.approx(0.75 * math.log(c))
        assert ss.uncertainty_threshold(500, 1000, c) == pytest.approx(0.875 * math.log(c))
        assert ss.uncertainty_threshold(1000, 1000, c) == pytest.approx(math.log(c))
        assert ss.uncertainty_threshold(5000, 1000, c) == pytest.approx(math.log(c))
    with pytest.raises(ValueError):
        ss.uncertainty_threshold(0, 10, 1)


# ---------------------------------------------------------------------------------------------- Mean Teacher


def test_teacher_is_the_ema_of_the_student_after_n_steps():
    torch.manual_seed(0)
    net = build_unet(out_channels=2, features=TINY)
    decay = 0.9  # 0.99 in the bundle; a smaller decay makes the EMA differ more from the student
    step = _step("mean_teacher", net, decay=decay, lr=0.5, weight=1.0)
    expected = _float_state(net)  # the teacher starts as the student
    assert all(torch.equal(v, _float_state(step.teacher.module)[k]) for k, v in expected.items())
    for it in range(4):
        step(net, _batch(seed=it), it)
        student = _float_state(net)
        expected = {k: decay * expected[k] + (1 - decay) * student[k] for k in expected}
    teacher = _float_state(step.teacher.module)
    assert set(teacher) == set(expected)
    params = {k for k, _ in step.teacher.module.named_parameters()}
    for k in expected:
        if k in params:  # parameters: the EMA
            torch.testing.assert_close(teacher[k], expected[k], rtol=1e-5, atol=1e-6)
        else:  # BatchNorm running statistics: copied from the student (see ema_teacher)
            torch.testing.assert_close(teacher[k], student[k], rtol=0, atol=0)
    moved = [k for k in params if not torch.allclose(teacher[k], student[k], atol=1e-6)]
    assert len(moved) > len(params) // 2  # the teacher lags the student
    assert not any(p.requires_grad for p in step.teacher.parameters())


def test_bundle_decay_is_099_and_uses_averaged_model():
    net = build_unet(out_channels=2, features=TINY)
    teacher = ss.ema_teacher(net)
    assert isinstance(teacher, torch.optim.swa_utils.AveragedModel) and teacher.decay == 0.99
    assert not teacher.use_buffers and int(teacher.n_averaged) == 1  # buffers copied, not averaged


class _NoHostRead(torch.Tensor):
    """A tensor that fails when read on the host (``bool``): on a GPU such a read waits for the device."""

    def __bool__(self):
        raise AssertionError("read on the host")


def test_the_teachers_ema_update_equals_averaged_models_and_never_reads_its_counter_on_the_host():
    """EMATeacher.update_parameters: AveragedModel's arithmetic and state dict, without AveragedModel's two host
    reads of n_averaged per call (two GPU synchronisations per training step)."""
    torch.manual_seed(0)
    student = build_unet(out_channels=2, features=TINY)
    ours, reference = ss.ema_teacher(student, 0.9), torch.optim.swa_utils.AveragedModel(
        student, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.9), use_buffers=False)
    reference.update_parameters(student)  # the copy
    assert isinstance(ours, ss.EMATeacher) and set(ours.state_dict()) == set(reference.state_dict())
    ours.n_averaged = ours.n_averaged.as_subclass(_NoHostRead)
    for _ in range(3):
        with torch.no_grad():
            for p in student.parameters():
                p.add_(torch.randn_like(p))
        student.train()(torch.rand(2, 1, 32, 32))  # moves BatchNorm's running statistics
        ours.update_parameters(student)
        reference.update_parameters(student)
    for (k, a), b in zip(ours.state_dict().items(), reference.state_dict().values()):
        torch.testing.assert_close(a.as_subclass(torch.Tensor), b, rtol=0, atol=0, msg=k)
    assert int(ours.n_averaged.as_subclass(torch.Tensor)) == 4
    with pytest.raises(AssertionError, match="read on the host"):  # what AveragedModel's own update does
        torch.optim.swa_utils.AveragedModel.update_parameters(ours, student)


def test_teacher_with_the_students_weights_predicts_what_the_student_predicts():
    """Regression: the teacher ran in eval mode on EMA-averaged BatchNorm running statistics, which lag the
    student's (themselves an EMA of batch statistics) by ~1/(1-decay) iterations; from a random initialisation
    (running var 1.0 against true variances ~0.01) its predictions were garbage for hundreds of iterations and
    the consistency pulled the student towards them (validation Dice of the teacher 0.00 for the first 160
    iterations of a CPU ACDC run, Mean Teacher below supervised training). With decay 0 the teacher *is* the
    student after each update, so its prediction must be exactly the student's training-mode prediction."""
    torch.manual_seed(0)
    net = build_unet(out_channels=2, features=(8, 8, 16, 16, 32, 8))
    step = _step("ua_mt", net, lr=0.1, weight=1.0, decay=0.0)  # Mean Teacher, with UA-MT's noisy passes below
    x = 0.5 * torch.rand(4, 1, 32, 32, generator=torch.Generator().manual_seed(5)) + _blobs(4, 32)
    for it in range(3):
        step(net, _batch(seed=it), it)
    with torch.no_grad():
        student = torch.softmax(net.train()(x), dim=1)
    teacher = step.teacher_prob(x)
    torch.testing.assert_close(teacher, student, rtol=0, atol=1e-6)
    assert not step.teacher.training  # back in eval mode between steps
    # UA-MT's noisy passes use the same normalisation: without noise their entropy is the prediction's
    step.uncertainty_noise = 0.0
    torch.testing.assert_close(step.teacher_uncertainty(x), ss.pixel_entropy(student), rtol=0, atol=1e-5)


def _exact_augment(seed=0):
    """Crop + flips only: every resampling moves whole pixels, so warps commute exactly with pixel-wise maps."""
    return SegmentationAugment(crop_size=32, max_rotation_deg=0.0, scale_range=(1.0, 1.0), flip_prob=0.5,
                               brightness=0.0, contrast=0.0, generator=torch.Generator().manual_seed(seed))


def _blobs(n, size=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    yy, xx = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    out = torch.zeros(n, 1, size, size)
    for i in range(n):
        cy, cx, r = (torch.rand(3, generator=g) * torch.tensor([20, 20, 6]) + torch.tensor([14, 14, 5])).tolist()
        out[i, 0] = (((yy - cy) ** 2 + (xx - cx) ** 2) < r * r).float()
    return out


def test_geometric_alignment_with_an_identity_like_network():
    net = OneHotNet()
    step = _step("mean_teacher", net, augment=_exact_augment(), view_rotation_deg=0.0, view_scale_range=(1.0, 1.0),
                 view_flip_prob=0.5)
    step.teacher = net
    x = _blobs(6)
    t_view, s_view, _, a = step.teacher_student_views(x)
    assert not torch.equal(t_view, s_view)  # different views (flips)...
    p_t = torch.softmax(net(t_view), 1)
    p_s = torch.softmax(net(s_view), 1)
    torch.testing.assert_close(ss.warp(p_t, a), p_s)  # ... whose predictions align once the teacher's is warped by A
    assert (p_t - p_s).abs().max() > 0.5

    # the Mean Teacher consistency of the step is therefore exactly 0 for this network
    batch = {"image": _blobs(2, seed=1), "label": _blobs(2, seed=1).to(torch.uint8), "unlabelled": _blobs(3, seed=2)}
    terms = step.losses(net, batch, 0)
    assert float(terms["loss_reg"].detach()) < 1e-10
    assert terms["label"].shape == (2, 1, 32, 32)
    torch.testing.assert_close(terms["label"].float(), terms["image"].round())  # label warped with the student's view


def test_without_the_view_transform_the_labelled_student_sees_the_baselines_augmentation():
    # rotation 0, zoom 1 and no flips make A the identity, so the student's labelled view warp(x, M @ A) is the
    # fine-tuning bundle's warp(x, M) (the view_* keys of the bundle switch the extra view off)
    net = OneHotNet()
    step = _step("mean_teacher", net, augment=_exact_augment(), view_rotation_deg=0.0, view_scale_range=(1.0, 1.0),
                 view_flip_prob=0.0)
    torch.testing.assert_close(step.view_matrices(8), torch.eye(3, dtype=torch.float64).expand(8, 3, 3))
    x = _blobs(4)
    t_view, s_view, m, a = step.teacher_student_views(x)
    torch.testing.assert_close(s_view, t_view)  # jitter aside (none here), teacher and student see one view
    torch.testing.assert_close(s_view, ss.warp(x, m, (32, 32)))
    # the default view transform does move the student's labelled view away from the baseline's
    moved = _step("mean_teacher", net, augment=_exact_augment())
    assert not torch.allclose(moved.view_matrices(8), torch.eye(3, dtype=torch.float64).expand(8, 3, 3))


def test_geometric_alignment_with_rotations_and_zoom():
    """With the bundle's random rotation/zoom (bilinear resampling) the warped teacher prediction matches the
    student's up to interpolation, far better than the unwarped one."""
    torch.manual_seed(0)
    net = nn.Conv2d(1, 2, 1)  # a pixel-wise linear 'network'
    step = _step("mean_teacher", net, augment=SegmentationAugment(crop_size=32, brightness=0.0, contrast=0.0),
                 view_rotation_deg=30.0)
    x = torch.nn.functional.avg_pool2d(_blobs(8), 5, stride=1, padding=2)  # smooth images
    t_view, s_view, _, a = step.teacher_student_views(x)
    with torch.no_grad():
        p_t, p_s = torch.softmax(net(t_view), 1), torch.softmax(net(s_view), 1)
        inside = (ss.warp(torch.ones_like(t_view), a) > 0.999).float()
        aligned = ((ss.warp(p_t, a) - p_s).abs() * inside).sum() / inside.sum()
        unaligned = ((p_t - p_s).abs() * inside).sum() / inside.sum()
    assert aligned < 0.1 * unaligned, (float(aligned), float(unaligned))


# ---------------------------------------------------------------------------------------------------- UA-MT


class RampNet(nn.Module):
    """Pixel-wise logits k * x * (0, 1, ..., C-1): entropy ln C at x = 0, decreasing with x."""

    def __init__(self, classes=4, k=3.0):
        super().__init__()
        self.register_buffer("w", k * torch.arange(classes, dtype=torch.float32).view(1, -1, 1, 1))

    def forward(self, x):
        return x * self.w


def test_ua_mt_mask_grows_as_the_threshold_rises():
    net = RampNet()
    step = _step("ua_mt", build_unet(out_channels=4, features=TINY), num_classes=4, total_iterations=100,
                 uncertainty_noise=0.05)
    step.teacher = net
    x = torch.linspace(0, 1, 32 * 32).view(1, 1, 32, 32).repeat(2, 1, 1, 1)
    unc = step.teacher_uncertainty(x)
    assert unc.shape == (2, 1, 32, 32)
    assert float(unc.max()) <= math.log(4) + 1e-5 and float(unc.min()) < 0.75 * math.log(4)
    fractions = [float((unc < ss.uncertainty_threshold(it, 100, 4)).float().mean()) for it in range(0, 101, 10)]
    assert all(a <= b for a, b in zip(fractions, fractions[1:])), fractions
    assert fractions[0] < 0.9 and fractions[-1] > fractions[0] + 0.05, fractions

    # uncertainty = entropy of the mean of the noisy passes: without noise, the entropy of the prediction
    step.uncertainty_noise = 0.0
    torch.testing.assert_close(step.teacher_uncertainty(x), ss.pixel_entropy(torch.softmax(net(x), 1)))


def test_mean_teacher_consistency_is_the_papers_l_mt():
    """L_MT = 1/(|D_u||Omega|) sum_x sum_i ||p^s_i(x) - p^t_i(x)||^2: summed over classes, averaged over pixels (and
    over the masked-in pixels only with a mask); 0 for identical predictions, at most 2 (two one-hot vectors)."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 4, 5, generator=g)
    teacher = torch.softmax(torch.randn(2, 3, 4, 5, generator=g), 1)
    per_pixel = ((torch.softmax(logits, 1) - teacher) ** 2).sum(1)  # [B, H, W]
    assert float(ss.softmax_mse(logits, teacher)) == pytest.approx(float(per_pixel.mean()), rel=1e-6)
    mask = torch.zeros(2, 1, 4, 5)
    mask[0, 0, :2] = 1
    assert float(ss.softmax_mse(logits, teacher, mask)) == pytest.approx(float(per_pixel[0, :2].mean()), rel=1e-6)
    assert float(ss.softmax_mse(logits, teacher, torch.ones(2, 1, 4, 5))) == pytest.approx(float(per_pixel.mean()), rel=1e-6)
    assert float(ss.softmax_mse(logits, torch.softmax(logits, 1))) < 1e-12
    one_hot = torch.zeros(1, 2, 1, 1)
    one_hot[0, 1] = 1.0
    assert float(ss.softmax_mse(torch.tensor([[[[50.0]], [[-50.0]]]]), one_hot)) == pytest.approx(2.0, rel=1e-6)


def test_ua_mt_step_reports_threshold_and_masks_the_consistency():
    torch.manual_seed(0)
    net = build_unet(out_channels=2, features=TINY)
    step = _step("ua_mt", net, total_iterations=10)
    out0 = step(net, _batch(), 0)
    out9 = step(net, _batch(seed=1), 10)
    assert out0["threshold"] == pytest.approx(0.75 * math.log(2)) and out9["threshold"] == pytest.approx(math.log(2))
    assert 0.0 <= float(out0["certain_fraction"]) <= 1.0 and float(out9["certain_fraction"]) > 0.0


# ------------------------------------------------------------------------------------------------ ICT / MixUp


def test_mixup_pairs_mix_inputs_and_targets_with_the_same_lambda():
    step = _step("ict", build_unet(out_channels=3, features=TINY), num_classes=3)
    torch.manual_seed(3)
    x = torch.arange(4, dtype=torch.float32).view(4, 1, 1, 1).expand(4, 1, 8, 8).clone()  # image i is constant i
    target = torch.nn.functional.one_hot(torch.tensor([0, 1, 2, 1]), 3).float().view(4, 3, 1, 1).expand(4, 3, 8, 8)
    x_mix, t_mix, lam, perm = step.mix_pairs(x, target, alpha=0.1)
    assert sorted(perm.tolist()) == [0, 1, 2, 3] and ((lam >= 0) & (lam <= 1)).all()
    for i in range(4):
        j = int(perm[i])
        torch.testing.assert_close(x_mix[i], lam[i] * x[i] + (1 - lam[i]) * x[j])
        torch.testing.assert_close(t_mix[i], lam[i] * target[i] + (1 - lam[i]) * target[j])
    torch.testing.assert_close(t_mix.sum(1), torch.ones(4, 8, 8))
    # Beta(0.1, 0.1) puts its mass near 0 and 1 (ICT's alpha); Beta(1, 1) is uniform (MixUp)
    draws = ss.sample_beta(0.1, 4000)
    assert float(((draws < 0.1) | (draws > 0.9)).float().mean()) > 0.6
    assert float(ss.sample_beta(1.0, 4000).mean()) == pytest.approx(0.5, abs=0.03)


def test_ict_student_matches_the_mix_of_teacher_predictions(monkeypatch):
    """The ICT regulariser is MSE(softmax(student(mix(x, x'))), mix(p_t(x), p_t(x'))): recomputed by hand from
    the recorded mixing."""
    torch.manual_seed(0)
    net = build_unet(out_channels=2, features=TINY)
    step = _step("ict", net)
    seen = {}
    orig = step.mix_pairs

    def spy(x, target, alpha):
        out = orig(x, target, alpha)
        seen.update(x=x, target=target, out=out, alpha=alpha)
        return out

    monkeypatch.setattr(step, "mix_pairs", spy)
    net.eval()  # BatchNorm in eval mode so the student can be re-run identically below
    terms = step.losses(net, _batch(), 0)
    x_mix, t_mix, lam, perm = seen["out"]
    assert seen["alpha"] == 0.1
    torch.testing.assert_close(seen["target"], step.teacher_prob(seen["x"]))
    torch.testing.assert_close(t_mix, lam.view(-1, 1, 1, 1) * seen["target"] + (1 - lam.view(-1, 1, 1, 1)) * seen["target"][perm])
    with torch.no_grad():
        expected = ((torch.softmax(net(x_mix), 1) - t_mix) ** 2).sum(1).mean()  # L_MT: summed over classes
    assert float(terms["loss_reg"].detach()) == pytest.approx(float(expected), rel=1e-4)


def test_mixup_target_is_the_mix_of_the_two_one_hot_labels(monkeypatch):
    torch.manual_seed(0)
    net = build_unet(out_channels=2, features=TINY)
    step = _step("mixup", net)
    seen = {}
    orig = step.mix_pairs

    def spy(x, target, alpha):
        seen.update(out=orig(x, target, alpha), a=alpha)
        return seen["out"]

    monkeypatch.setattr(step, "mix_pairs", spy)
    terms = step.losses(net, _batch(b_l=4), 0)
    _, t_mix, lam, perm = seen["out"]
    y = terms["label"][:, 0].long()
    assert seen["a"] == 1.0
    for i in range(4):
        j = int(perm[i])
        expected = lam[i] * torch.nn.functional.one_hot(y[i], 2).permute(2, 0, 1) + (1 - lam[i]) * torch.nn.functional.one_hot(y[j], 2).permute(2, 0, 1)
        torch.testing.assert_close(t_mix[i], expected.float())


# ------------------------------------------------------------------------------------------ entropy, adversarial


def test_entropy_loss_is_the_mean_pixel_entropy():
    logits = torch.randn(3, 4, 5, 6, generator=torch.Generator().manual_seed(0))
    p = np.exp(logits.numpy()) / np.exp(logits.numpy()).sum(1, keepdims=True)
    explicit = float(np.mean(-(p * np.log(p)).sum(1)))
    assert float(ss.entropy_loss(logits)) == pytest.approx(explicit, rel=1e-5)
    assert float(ss.pixel_entropy(torch.softmax(logits, 1)).mean()) == pytest.approx(explicit, rel=1e-4)
    uniform = torch.zeros(1, 4, 2, 2)
    assert float(ss.entropy_loss(uniform)) == pytest.approx(math.log(4), rel=1e-6)


def test_entropy_min_step_regularises_the_unlabelled_predictions(monkeypatch):
    torch.manual_seed(0)
    net = build_unet(out_channels=2, features=TINY)
    step = _step("entropy_min", net)
    calls = []
    orig = ss.entropy_loss
    monkeypatch.setattr(ss, "entropy_loss", lambda logits: calls.append(logits.shape) or orig(logits))
    out = step(net, _batch(b_l=2, b_u=3), 0)
    assert calls == [torch.Size([3, 2, 32, 32])]  # the unlabelled part of the batch only
    assert 0 < float(out["loss_reg"]) <= math.log(2)


def test_adversarial_step_trains_the_discriminator():
    torch.manual_seed(0)
    net = build_unet(out_channels=2, features=TINY)
    disc = ss.PredictionDiscriminator(2, features=(8, 16))
    d_opt = torch.optim.Adam(disc.parameters(), lr=1e-3)
    step = _step("adversarial", net, discriminator=disc, discriminator_optimizer=d_opt, weight=0.1)
    d_before = _float_state(disc)
    s_before = _float_state(net)
    for it in range(2):
        out = step(net, _batch(seed=it), it)
        assert all(math.isfinite(float(out[k])) for k in ("loss", "loss_sup", "loss_reg", "loss_disc"))
    assert any(not torch.equal(d_before[k], v) for k, v in _float_state(disc).items())
    assert any(not torch.equal(s_before[k], v) for k, v in _float_state(net).items())
    assert 0.0 < float(out["loss_disc"]) < 2.0


def test_methods_validate_their_arguments():
    net = build_unet(out_channels=2, features=TINY)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    settings = ss.StepSettings(SegmentationAugment(crop_size=32), opt, 2)
    known = "supervised, mean_teacher, ua_mt, ict, entropy_min, mixup, adversarial"
    with pytest.raises(ValueError, match=f"^method must be one of {known}; got 'fixmatch'$"):
        ss.method_class("fixmatch")
    with pytest.raises(ValueError, match="method 'mean_teacher' needs a teacher"):
        ss.MeanTeacher(settings, 1.0)
    with pytest.raises(ValueError, match="discriminator"):
        ss.Adversarial(settings, 0.1, None, None)
    with pytest.raises(ValueError, match="weight must be >= 0"):
        ss.EntropyMinimisation(settings, -1.0)
    with pytest.raises(ValueError, match="settings must be a bim.semi_supervised.StepSettings"):
        ss.EntropyMinimisation({"optimizer": opt}, 1.0)
    with pytest.raises(ValueError, match="^method is 'ict' but train#step is EntropyMinimisation"):
        ss.check_method("ict", ss.EntropyMinimisation(settings, 1.0))
    ss.check_method("entropy_min", ss.EntropyMinimisation(settings, 1.0))
    with pytest.raises(ValueError, match="decay"):
        ss.ema_teacher(net, 1.5)


# ------------------------------------------------------------------------------------------------ pretrained


def test_pretrained_initialises_student_and_teacher(tmp_path):
    torch.manual_seed(1)
    source = build_unet(out_channels=2, features=TINY)
    torch.save({k: v for k, v in source.state_dict().items() if not k.startswith("final_conv.")}, tmp_path / "pre.pt")
    torch.manual_seed(2)
    student = load_pretrained(build_unet(out_channels=2, features=TINY), tmp_path / "pre.pt")
    teacher = ss.ema_teacher(student)
    ckpt = torch.load(tmp_path / "pre.pt", weights_only=True)
    s, t = student.state_dict(), teacher.module.state_dict()
    for k, v in ckpt.items():
        assert torch.equal(s[k], v) and torch.equal(t[k], v), k
    for k in ("final_conv.weight", "final_conv.bias"):  # not pre-trained: the teacher copies the student's init
        assert torch.equal(s[k], t[k]) and not torch.equal(s[k], source.state_dict()[k])


# ------------------------------------------------------------------------------------------------ batch norm


@pytest.mark.parametrize("method", ["mean_teacher", "ua_mt", "ict", "entropy_min", "adversarial"])
def test_labelled_predictions_do_not_depend_on_the_unlabelled_batch(method):
    """The student's labelled logits are BatchNorm'd without the unlabelled images (one forward per batch: the joint
    forward made every method collapse on 1 labelled ACDC scan)."""
    preds = []
    for unlabelled_seed in (1, 2):
        torch.manual_seed(0)
        net = build_unet(out_channels=2, features=TINY)
        kwargs = {"lr": 0.0}
        if method == "adversarial":
            disc = ss.PredictionDiscriminator(2, features=(4, 8))
            kwargs.update(discriminator=disc, discriminator_optimizer=torch.optim.SGD(disc.parameters(), lr=0.0))
        step = _step(method, net, **kwargs)
        batch = _batch(seed=0)
        batch["unlabelled"] = _batch(seed=unlabelled_seed)["unlabelled"] * 3.0
        preds.append(step(net, batch, 0)["pred"])
    torch.testing.assert_close(preds[0], preds[1], rtol=0, atol=1e-6)


@pytest.mark.parametrize("method", ["mean_teacher", "ua_mt"])
def test_the_teachers_unlabelled_targets_do_not_depend_on_the_labelled_images(method, monkeypatch):
    """The teacher's train-mode forwards take the labelled and the unlabelled views one batch each, as the student's
    do, so its targets for the unlabelled images do not depend on the labelled ones (a joint forward normalised them
    with statistics the labelled scan shares)."""
    targets = []
    real_mse = ss.softmax_mse
    monkeypatch.setattr(ss, "softmax_mse", lambda logits, prob, mask=None: targets.append(prob) or real_mse(logits, prob, mask))
    for labelled_scale in (1.0, 3.0):
        torch.manual_seed(0)
        net = build_unet(out_channels=2, features=TINY)
        step = _step(method, net, lr=0.0)
        batch = _batch(seed=0)
        batch["image"] = batch["image"] * labelled_scale
        step(net, batch, 5)
    b_l = batch["image"].shape[0]
    torch.testing.assert_close(targets[0][b_l:], targets[1][b_l:], rtol=0, atol=1e-6)
    assert not torch.allclose(targets[0][:b_l], targets[1][:b_l], atol=1e-6)  # the labelled targets do change


@pytest.mark.parametrize("method", TEACHER_METHODS)
def test_compile_teacher_runs_every_teacher_forward_through_its_compiled_module(method, monkeypatch):
    """``compile_teacher``: the step compiles ``teacher.module`` (with ``compile_mode``) and runs each teacher forward
    through it, in the teacher's train mode, on the parameters the EMA update moves; the targets are the eager
    teacher's. Off, nothing is compiled (the bundle's default is on since 0.7.3). (A stand-in for ``torch.compile``
    records the calls: inductor on the CPU takes half a minute, and its numerics are torch's to test.)"""
    compiled = []

    class Recorder(nn.Module):  # what torch.compile returns here: the same module, its calls recorded
        def __init__(self, module, mode):
            super().__init__()
            self.inner, self.mode, self.calls = module, mode, []

        def forward(self, x):
            self.calls.append((x.shape[0], self.inner.training))
            return self.inner(x)

    def fake_compile(module, mode=None):
        compiled.append(Recorder(module, mode))
        return compiled[-1]

    monkeypatch.setattr(torch, "compile", fake_compile)
    outs = []
    for compile_teacher in (False, True):
        torch.manual_seed(0)
        net = build_unet(out_channels=2, features=TINY)
        step = _step(method, net, compile_teacher=compile_teacher, compile_mode="max-autotune-no-cudagraphs")
        outs.append(step(net, _batch(seed=0), 5)["loss_reg"])
        assert len(compiled) == int(compile_teacher)
    recorder = compiled[0]
    assert recorder.inner is step.teacher.module and recorder.mode == "max-autotune-no-cudagraphs"
    passes = step.uncertainty_passes if method == "ua_mt" else 1
    # separate teacher forwards (the default): the labelled views, then the unlabelled ones (UA-MT: with the noisy
    # copies of each); ICT: one forward of the unlabelled images it mixes
    expected = [2] if method == "ict" else [2 * passes, 2 * passes]
    assert [n for n, _ in recorder.calls][-len(expected):] == expected and all(t for _, t in recorder.calls)
    assert not step.teacher.training  # back in eval mode after the step
    assert torch.allclose(outs[0], outs[1], atol=1e-6)
    with pytest.raises(ValueError, match="compile_teacher"):
        _step(method, build_unet(out_channels=2, features=TINY), compile_teacher="sometimes")


@pytest.mark.parametrize("compile_, compile_teacher", [(True, True), (True, False), (False, True)])
def test_the_bundle_compiles_the_teacher_only_with_compile_and_compile_teacher(compile_, compile_teacher):
    """train.json's ``compile_teacher`` (default true since 0.7.3) reaches the step only where ``compile`` is on too
    (on the CPU ``compile`` defaults to false, and the teacher stays eager with it); ``compile_mode`` is the
    student's, CUDA graphs (reduce-overhead) unless overridden, since 0.7.2."""
    import inspect

    from monai.bundle import ConfigParser

    parser = ConfigParser()
    parser.read_config(str(ROOT / "bundles" / "meanteacher_seg" / "configs" / "train.json"))
    assert parser["compile_teacher"] is True and parser["compile_mode"] == "reduce-overhead"
    assert inspect.signature(ss.StepSettings).parameters["compile_teacher"].default is False
    parser["compile"], parser["compile_teacher"], parser["compile_mode"] = compile_, compile_teacher, "max-autotune"
    assert parser.get_parsed_content("train#step_settings#compile_teacher") is (compile_ and compile_teacher)
    assert parser.get_parsed_content("train#step_settings#compile_mode") == "max-autotune"


@pytest.mark.parametrize("method", sorted(ss.METHODS))
def test_with_compile_on_each_variant_compiles_its_step_as_one_function_where_its_method_can(method):
    """``compile_step`` defaults to true (since 0.10.5) and reaches the step only with ``compile`` (on CUDA): Mean
    Teacher's step is compiled as one function, and each variant of a method that cannot (``compiles_as_one_step``
    false) sets it false, so none of them stops in its check; ``multi_gpu_train.json`` leaves it off."""
    from monai.bundle import ConfigParser

    configs = ROOT / "bundles" / "meanteacher_seg" / "configs"
    parser = ConfigParser()
    parser.read_config([str(configs / "train.json"), str(configs / "variants" / f"{method}.json")])
    parser["compile"] = True
    expected = ss.METHODS[method].compiles_as_one_step
    assert (method == "mean_teacher") is expected and parser["compile_step"] is expected
    assert parser.get_parsed_content("train#step_settings#compile_step") is expected
    parser["compile"] = False
    assert parser.get_parsed_content("train#step_settings#compile_step") is False
    parser.read_config([str(configs / "train.json"), str(configs / "variants" / f"{method}.json"),
                        str(configs / "multi_gpu_train.json")])
    parser["compile"] = True
    assert parser.get_parsed_content("train#step_settings#compile_step") is False


def test_the_unlabelled_forward_updates_the_running_statistics_but_not_the_labelled_loss():
    """Both student forwards update BatchNorm's running statistics (the eval-mode student normalises with them), so
    they depend on the unlabelled images; the batch statistics, and so the labelled loss, do not."""
    states, losses = [], []
    for unlabelled_seed in (1, 2):
        torch.manual_seed(0)
        net = build_unet(out_channels=2, features=TINY)
        step = _step("mean_teacher", net, lr=0.0)
        batch = _batch(seed=0)
        batch["unlabelled"] = _batch(seed=unlabelled_seed)["unlabelled"] * 3.0
        losses.append(float(step(net, batch, 0)["loss_sup"]))
        states.append({k: v for k, v in net.state_dict().items() if "running" in k})
    assert states[0] and losses[0] == pytest.approx(losses[1], abs=1e-6)
    assert not all(torch.allclose(states[0][k], states[1][k]) for k in states[0])


def test_the_steps_views_get_the_fine_tuning_augmentation_gamma_included():
    """The labelled view of the supervised method is exactly ``SegmentationAugment``'s (the fine-tuning bundle's),
    gamma included, and the teacher's and student's views get gamma too (before 0.5.0 they got the jitter only, so
    every semi-supervised run trained without the ACDC tasks' gamma 0.5-2)."""
    def augment():
        return SegmentationAugment(crop_size=32, max_rotation_deg=45.0, scale_range=(0.8, 1.3), gamma_range=(0.5, 2.0),
                                   generator=torch.Generator().manual_seed(3))

    batch = _batch(b_l=4, seed=5)
    x_ref, y_ref = augment()(batch["image"], batch["label"])
    step = _step("supervised", nn.Conv2d(1, 2, 1), augment=augment())
    x, y = step.labelled_view(batch["image"], batch["label"])
    torch.testing.assert_close(x, x_ref)
    torch.testing.assert_close(y, y_ref)
    # without gamma the same draws give other images: gamma is applied, not skipped
    plain = _step("supervised", nn.Conv2d(1, 2, 1), augment=augment())
    plain.augment.gamma_range = None
    assert not torch.allclose(plain.labelled_view(batch["image"], batch["label"])[0], x_ref)
    # teacher and student views (A the identity, no jitter): one geometry, each view with its own gamma draw
    no_jitter = augment()
    no_jitter.brightness = no_jitter.contrast = 0.0
    mt = _step("mean_teacher", build_unet(out_channels=2, features=TINY), augment=no_jitter, view_rotation_deg=0.0,
               view_scale_range=(1.0, 1.0), view_flip_prob=0.0)
    t_view, s_view, _, _ = mt.teacher_student_views(batch["image"])
    assert not torch.allclose(t_view, s_view)
    no_jitter.gamma_range = None
    t_view, s_view, _, _ = mt.teacher_student_views(batch["image"])
    torch.testing.assert_close(t_view, s_view)


def test_boolean_settings_take_command_line_strings_and_refuse_others():
    """``--compile_teacher false`` reaches the step as the string 'false' (bool('false') is True)."""
    from bim.engine import as_flag

    assert [as_flag(v, "k") for v in (True, False, "false", "False", "TRUE", "1", "0", 1, 0)] == \
        [True, False, False, False, True, True, False, True, False]
    for bad in ("no", "", None, 2, 0.5):
        with pytest.raises(ValueError, match="compile_teacher must be true or false"):
            as_flag(bad, "compile_teacher")
    step = _step("mean_teacher", build_unet(out_channels=2, features=TINY), compile_teacher="false", bf16="False")
    assert step.settings.compile_teacher is False and step.settings.bf16 is False
    with pytest.raises(ValueError, match="channels_last"):
        _step("mean_teacher", build_unet(out_channels=2, features=TINY), channels_last="maybe")


@pytest.mark.parametrize("method", ss.METHODS)
def test_every_method_takes_its_labelled_term_from_supervised_loss_function(method):
    """The bundles' ``loss_function`` reaches the labelled term of every method: called with fp32 logits
    [B_l, C, h, w] and class indices [B_l, 1, h, w]; its value is ``loss_sup``. The default is cross-entropy."""
    from bim.segmentation import labelled_cross_entropy

    calls = []

    def recording_loss(logits, label):
        calls.append((logits.dtype, tuple(logits.shape), tuple(label.shape)))
        return labelled_cross_entropy(logits, label) + 1.0  # shifted: only this function gives the +1

    torch.manual_seed(0)
    net = build_unet(out_channels=2, features=TINY)
    extra = {}
    if method == "adversarial":
        disc = ss.PredictionDiscriminator(2, features=(8, 16))
        extra = dict(discriminator=disc, discriminator_optimizer=torch.optim.SGD(disc.parameters(), lr=0.1))
    plain = _step(method, net, **extra)
    assert plain.settings.supervised_loss_function is labelled_cross_entropy
    out = _step(method, net, supervised_loss_function=recording_loss, **extra)(net, _batch(), 0)
    assert calls and all(c == (torch.float32, (2, 2, 32, 32), (2, 1, 32, 32)) for c in calls)
    assert float(out["loss_sup"]) > 1.0  # cross-entropy of 2 classes at init is ~0.7: the +1 came through


def test_each_variant_config_names_its_methods_class_and_no_key_is_picked_by_method_name():
    """The registry and the configs agree: ``variants/<method>.json`` sets ``method`` and builds ``train#step`` as
    that method's class (``mean_teacher``: train.json's own step); no ``$`` expression chooses by ``@method``."""
    import json

    configs = ROOT / "bundles" / "meanteacher_seg" / "configs"
    train = json.loads((configs / "train.json").read_text())
    assert set(ss.METHODS) == {p.stem for p in (configs / "variants").glob("*.json")}
    for name, cls in ss.METHODS.items():
        variant = json.loads((configs / "variants" / f"{name}.json").read_text())
        step = variant.get("train#step", train["train"]["step"])
        assert variant["method"] == name and step["_target_"] == f"bim.semi_supervised.{cls.__name__}", name

    def expressions(node):
        if isinstance(node, dict):
            return [e for v in node.values() for e in expressions(v)]
        if isinstance(node, list):
            return [e for v in node for e in expressions(v)]
        return [node] if isinstance(node, str) and node.startswith("$") else []

    assert expressions(train) and not [e for e in expressions(train) if "@method" in e]


@pytest.mark.parametrize("method", sorted(ss.METHODS))
def test_every_methods_step_runs_under_bf16_autocast_with_fp32_losses(method, monkeypatch):
    """Each method's step as a GPU runs it (the forwards under bf16 autocast, which the CPU path leaves off): the
    student's logits come out fp32, every reported loss term is a finite fp32 scalar, the weights stay finite."""
    monkeypatch.setattr(ss, "bf16_autocast",
                        lambda device, enabled=True: torch.autocast("cpu", dtype=torch.bfloat16, enabled=bool(enabled)))
    torch.manual_seed(0)
    net = build_unet(out_channels=2, features=TINY)
    kwargs = {}
    if method == "adversarial":
        disc = ss.PredictionDiscriminator(2)
        kwargs = {"discriminator": disc, "discriminator_optimizer": torch.optim.Adam(disc.parameters(), lr=1e-4)}
    step = _step(method, net, **kwargs)
    seen = []
    forward = step.forward

    def spy(network, x):
        logits = forward(network, x)
        seen.append(logits.dtype)
        return logits

    monkeypatch.setattr(step, "forward", spy)
    out = step(net, _batch(), 0)
    assert seen and set(seen) == {torch.float32}
    losses = {k: v for k, v in out.items() if k.startswith("loss") and torch.is_tensor(v)}
    assert "loss" in losses and all(v.dtype == torch.float32 and torch.isfinite(v) for v in losses.values()), losses
    assert all(torch.isfinite(p).all() for p in net.parameters())


def test_the_step_trains_a_student_left_in_eval_mode_and_the_teacher_forwards_each_batch_alone():
    """A student left in eval mode (by a validation) is put back in train mode, every module of it; the teacher's
    probabilities for two batches under one mode switch are those of each batch alone (BatchNorm of its own batch),
    and the teacher is back in eval mode after."""
    torch.manual_seed(0)
    net = build_unet(out_channels=2, features=TINY)
    step = _step("mean_teacher", net)
    net.eval()
    step(net, _batch(), 0)
    assert all(m.training for m in net.modules())
    a, b = _batch(seed=1)["image"], _batch(seed=2)["image"]
    both = step.teacher_prob(a, b)
    torch.testing.assert_close(both, torch.cat([step.teacher_prob(a), step.teacher_prob(b)]))
    assert not any(m.training for m in step.teacher.modules())


@pytest.mark.parametrize("hooked", [False, True])
def test_the_teacher_runs_in_train_mode_inside_a_step_and_is_back_in_eval_mode_after(hooked):
    from modules import TrainCounted

    net = TrainCounted(2) if hooked else build_unet(out_channels=2, features=(4, 8, 8, 16, 16, 4))
    step = _step("mean_teacher", net)
    before = getattr(step.teacher.module, "calls", 0)
    with step._teacher_mode():
        assert all(m.training for m in step.teacher.modules())
    assert not any(m.training for m in step.teacher.modules())
    if hooked:  # a module with its own train() is switched through it: train(True), then eval()
        assert step.teacher.module.calls == before + 2
