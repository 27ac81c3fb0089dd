"""Tests of bim/pretrain/losses.py and heads.py (values, bounds, precision, shapes)."""

import math

import pytest
import torch
import torch.nn.functional as F

from bim.pretrain import heads as H  # noqa: E402
from bim.pretrain import losses as L  # noqa: E402


def rand_probs(b, k, h, w, scale=1.0, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, k, h, w, generator=g, dtype=torch.float64) * scale
    return torch.softmax(logits, dim=1).to(dtype)


def one_hot_balanced(b, k, h, w):
    """One-hot maps where each cluster wins exactly the same number of pixels (b*h*w % k == 0)."""
    n = b * h * w
    assert n % k == 0
    labels = torch.arange(n) % k
    labels = labels[torch.randperm(n, generator=torch.Generator().manual_seed(1))]
    return F.one_hot(labels, k).T.reshape(k, b, h, w).transpose(0, 1).to(torch.float64)


def random_mask(b, h, w, seed=3):
    g = torch.Generator().manual_seed(seed)
    m = (torch.rand(b, 1, h, w, generator=g) > 0.3).float()
    m[0, 0, 0, 0] = 1.0
    return m


# --------------------------------------------------------------------------------------------------
# L_MI
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [2, 5, 10, 40])
@pytest.mark.parametrize("use_mask", [False, True])
def test_mi_loss_alpha0_equals_minus_iic(k, use_mask):
    p_hat = rand_probs(2, k, 9, 11, scale=2.0, seed=k)
    p_tilde = rand_probs(2, k, 9, 11, scale=2.0, seed=k + 100)
    # make the views correlated so that the MI is not ~0
    p_tilde = 0.5 * p_tilde + 0.5 * p_hat
    mask = random_mask(2, 9, 11) if use_mask else None
    loss = L.mi_loss(p_hat, p_tilde, alpha=0.0, mask=mask)
    mi = L.iic_mutual_information(p_hat, p_tilde, mask=mask)
    assert loss.dtype == torch.float32
    assert mi.item() > 1e-3
    assert torch.allclose(loss, -mi, atol=1e-5)


def test_mi_loss_alpha0_matches_explicit_iic_formula_in_float64():
    # independent explicit IIC (per-pixel loops over K only) in float64, with eps 1e-5 in the logs
    p_hat = rand_probs(3, 4, 5, 6, scale=3.0, seed=7, dtype=torch.float64)
    p_tilde = rand_probs(3, 4, 5, 6, scale=3.0, seed=8, dtype=torch.float64)
    mask = random_mask(3, 5, 6)
    ph = p_hat.permute(0, 2, 3, 1)[mask[:, 0].bool()]  # [N, K]
    pt = p_tilde.permute(0, 2, 3, 1)[mask[:, 0].bool()]
    P = sum(torch.outer(ph[i], pt[i]) for i in range(ph.shape[0])) / ph.shape[0]
    P = (P + P.T) / 2
    pi, pj = P.sum(1, keepdim=True), P.sum(0, keepdim=True)
    eps = 1e-5
    mi_ref = (P * (torch.log(P + eps) - torch.log(pi + eps) - torch.log(pj + eps))).sum()
    assert torch.allclose(L.joint_distribution(p_hat, p_tilde, mask), P, atol=1e-12)
    assert torch.allclose(L.mi_loss(p_hat, p_tilde, alpha=0.0, mask=mask), -mi_ref, atol=1e-10)


def test_joint_distribution_properties():
    p_hat = rand_probs(2, 6, 7, 8, seed=1)
    p_tilde = rand_probs(2, 6, 7, 8, seed=2)
    mask = random_mask(2, 7, 8)
    for m in (None, mask):
        P = L.joint_distribution(p_hat, p_tilde, mask=m)
        assert P.shape == (6, 6)
        assert torch.allclose(P, P.T)
        assert abs(P.sum().item() - 1.0) < 1e-5
        assert (P >= 0).all()
    # the masked joint equals the joint of the valid pixels only
    sel = mask[:, 0].bool()
    a = p_hat.permute(0, 2, 3, 1)[sel].T.reshape(6, -1, 1, 1).transpose(0, 1)  # [N, K, 1, 1]
    b = p_tilde.permute(0, 2, 3, 1)[sel].T.reshape(6, -1, 1, 1).transpose(0, 1)
    assert torch.allclose(L.joint_distribution(p_hat, p_tilde, mask=mask), L.joint_distribution(a, b), atol=1e-6)


@pytest.mark.parametrize("k", [2, 4, 8])
@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_mi_loss_diagonal_joint_is_analytic_minimum(k, alpha):
    p = one_hot_balanced(2, k, 4, 8)
    eps = 1e-5
    P = L.joint_distribution(p, p)
    assert torch.allclose(P, torch.eye(k, dtype=P.dtype) / k, atol=1e-12)
    # H'_alpha(I/K) = -sum_k ((1-a)/K + a/K) log(1/K + eps) = -log(1/K + eps) for every alpha,
    # H(m) = -log(1/K + eps) for each marginal  =>  L = log(1/K + eps) ~= -log K.
    h_joint = -math.log(1.0 / k + eps)
    expected = h_joint - 2 * h_joint
    loss = L.mi_loss(p, p, alpha=alpha, eps=eps)
    assert abs(loss.item() - expected) < 1e-9
    assert abs(loss.item() - (-math.log(k))) < k * eps
    assert abs(L.pseudo_diagonal_joint_entropy(P, alpha).item() - h_joint) < 1e-9
    # any other prediction is worse than the minimum
    q = rand_probs(2, k, 4, 8, scale=3.0, seed=k, dtype=torch.float64)
    assert L.mi_loss(q, q, alpha=alpha).item() > expected + 1e-3


def test_mi_loss_is_linear_in_alpha_and_alpha1_is_diagonal_cross_entropy():
    p_hat = rand_probs(2, 7, 6, 6, scale=2.0, seed=11)
    p_tilde = rand_probs(2, 7, 6, 6, scale=2.0, seed=12)
    l0 = L.mi_loss(p_hat, p_tilde, alpha=0.0)
    l1 = L.mi_loss(p_hat, p_tilde, alpha=1.0)
    l05 = L.mi_loss(p_hat, p_tilde, alpha=0.5)
    assert torch.allclose(l05, 0.5 * (l0 + l1), atol=1e-5)
    P = L.joint_distribution(p_hat, p_tilde)
    m = P.sum(1)
    assert torch.allclose(l1, L.diagonal_cross_entropy(P) - 2 * L.entropy(m), atol=1e-5)


def test_pseudo_diagonal_joint_entropy_explicit():
    P = torch.tensor([[0.3, 0.1], [0.1, 0.5]])
    alpha, eps = 0.25, 1e-5
    expected = -(
        (0.75 * 0.3 + 0.125) * math.log(0.3 + eps)
        + 2 * 0.75 * 0.1 * math.log(0.1 + eps)
        + (0.75 * 0.5 + 0.125) * math.log(0.5 + eps)
    )
    assert abs(L.pseudo_diagonal_joint_entropy(P, alpha).item() - expected) < 1e-6
    assert abs(L.diagonal_cross_entropy(P).item() + 0.5 * (math.log(0.3 + eps) + math.log(0.5 + eps))) < 1e-6
    assert abs(L.entropy(torch.tensor([0.25, 0.75])).item() + 0.25 * math.log(0.25 + eps) + 0.75 * math.log(0.75 + eps)) < 1e-6


@pytest.mark.parametrize("k", [2, 3, 10, 40])
@pytest.mark.parametrize("scale", [0.1, 1.0, 5.0, 20.0])
def test_proposition_1_bounds(k, scale):
    for seed in range(5):
        p_hat = rand_probs(2, k, 6, 7, scale=scale, seed=seed, dtype=torch.float64)
        p_tilde = rand_probs(2, k, 6, 7, scale=scale, seed=seed + 50, dtype=torch.float64)
        P = L.joint_distribution(p_hat, p_tilde)
        h_exact = L.diagonal_cross_entropy(P, eps=0.0).item()
        h_eps = L.diagonal_cross_entropy(P).item()
        # H(u, p) = -(1/K) sum_k log p_k, averaged over pixels
        upper = (-(torch.log(p_hat).mean(dim=1)) - torch.log(p_tilde).mean(dim=1)).mean().item()
        assert math.log(k) - 1e-9 <= h_exact <= upper + 1e-9
        assert math.log(k) - k * 1e-5 <= h_eps <= h_exact + 1e-12
    # the bounds are tight: lower bound at the balanced diagonal joint, upper bound for uniform p
    p = one_hot_balanced(1, k, 2 * k, 1)
    assert abs(L.diagonal_cross_entropy(L.joint_distribution(p, p), eps=0.0).item() - math.log(k)) < 1e-12
    u = torch.full((1, k, 3, 3), 1.0 / k, dtype=torch.float64)
    assert abs(L.diagonal_cross_entropy(L.joint_distribution(u, u), eps=0.0).item() - 2 * math.log(k)) < 1e-9


def test_cluster_usage_detects_collapse():
    k = 10
    p = one_hot_balanced(2, k, 10, 10)
    usage = L.cluster_usage(p)
    assert usage["clusters_in_use"].item() == k
    assert abs(usage["marginal_entropy"].item() - math.log(k)) < 1e-3
    collapsed = torch.zeros(2, k, 10, 10)
    collapsed[:, 3] = 1.0
    usage = L.cluster_usage(collapsed)
    assert usage["clusters_in_use"].item() == 1
    assert abs(usage["marginal_entropy"].item()) < 1e-3
    # threshold 0.1 %: 1 pixel of 2000 (0.05 %) does not count, 2 pixels (0.1 %) do
    big = torch.zeros(2, k, 40, 25)
    big[:, 0] = 1.0
    big[0, 0, 0, 0], big[0, 5, 0, 0] = 0.0, 1.0
    assert L.cluster_usage(big)["clusters_in_use"].item() == 1
    big[0, 0, 0, 1], big[0, 5, 0, 1] = 0.0, 1.0
    assert L.cluster_usage(big)["clusters_in_use"].item() == 2
    # masked pixels are ignored
    mask = torch.ones(2, 1, 40, 25)
    mask[0, 0, 0, :2] = 0.0
    assert L.cluster_usage(big, mask=mask)["clusters_in_use"].item() == 1


# --------------------------------------------------------------------------------------------------
# precision and finiteness
# --------------------------------------------------------------------------------------------------


LOSS_FNS = {
    "mi_0": lambda ph, pt, img, m: L.mi_loss(ph, pt, alpha=0.0, mask=m),
    "mi_05": lambda ph, pt, img, m: L.mi_loss(ph, pt, alpha=0.5, mask=m),
    "mi_1": lambda ph, pt, img, m: L.mi_loss(ph, pt, alpha=1.0, mask=m),
    "iic": lambda ph, pt, img, m: L.iic_mutual_information(ph, pt, mask=m),
    "cc_sobel": lambda ph, pt, img, m: L.cc_loss(img, ph, edge="sobel", mask=m),
    "cc_grad": lambda ph, pt, img, m: L.cc_loss(img, ph, edge="gradient_power", power=0.5, mask=m),
    "imsat": lambda ph, pt, img, m: L.imsat_loss(ph, pt, mask=m),
}


def _all_losses(p_hat, p_tilde, image, mask=None):
    return {name: fn(p_hat, p_tilde, image, mask) for name, fn in LOSS_FNS.items()}


@pytest.mark.parametrize("kind", ["one_hot", "uniform", "random"])
@pytest.mark.parametrize("use_mask", [False, True])
def test_losses_and_gradients_finite(kind, use_mask):
    b, k, h, w = 2, 4, 12, 12
    if kind == "one_hot":
        base = one_hot_balanced(b, k, h, w).float()
    elif kind == "uniform":
        base = torch.full((b, k, h, w), 1.0 / k)
    else:
        base = rand_probs(b, k, h, w, scale=3.0)
    image = torch.rand(b, 1, h, w, generator=torch.Generator().manual_seed(0))
    mask = random_mask(b, h, w) if use_mask else None
    for name, fn in LOSS_FNS.items():
        p_hat = base.clone().requires_grad_(True)
        p_tilde = base.roll(1, dims=-1).clone().requires_grad_(True)
        value = fn(p_hat, p_tilde, image, mask)
        assert torch.isfinite(value), name
        value.backward()
        assert torch.isfinite(p_hat.grad).all(), name
        if p_tilde.grad is not None:
            assert torch.isfinite(p_tilde.grad).all(), name


def test_gradients_finite_through_softmax_of_saturated_logits():
    logits = (torch.randn(2, 5, 10, 10, generator=torch.Generator().manual_seed(0)) * 200).requires_grad_(True)
    p = torch.softmax(logits, dim=1)
    image = torch.rand(2, 3, 10, 10)
    loss = L.mi_loss(p, p) + L.cc_loss(image, p) + L.imsat_loss(p, p)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logits.grad).all()


def test_edge_maps_have_finite_gradients_on_constant_images():
    for fn in (L.sobel_edge_map, lambda x: L.gradient_power_edge_map(x, power=0.5)):
        image = torch.ones(1, 2, 8, 8, requires_grad=True)
        out = fn(image)
        out.sum().backward()
        assert torch.isfinite(out).all() and torch.isfinite(image.grad).all()
        assert (out == 0).all()


def test_bf16_inputs_compute_in_fp32():
    b, k, h, w = 2, 6, 16, 16
    p32 = rand_probs(b, k, h, w, scale=2.0, seed=4)
    t32 = rand_probs(b, k, h, w, scale=2.0, seed=5)
    image32 = torch.rand(b, 1, h, w, generator=torch.Generator().manual_seed(6))
    mask = random_mask(b, h, w)
    ref = _all_losses(p32, t32, image32, mask)
    p16, t16, image16 = p32.bfloat16(), t32.bfloat16(), image32.bfloat16()
    same_values = _all_losses(p16.float(), t16.float(), image16.float(), mask)
    for use_autocast in (False, True):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_autocast):
            got = _all_losses(p16, t16, image16, mask)
        for name, value in got.items():
            assert value.dtype == torch.float32, name
            assert torch.isfinite(value), name
            # identical to fp32 on the same (bf16-rounded) values: the computation really is fp32
            assert torch.allclose(value, same_values[name], atol=1e-5, rtol=1e-5), name
            # close to the fp32 computation on the un-rounded inputs
            assert torch.allclose(value, ref[name], atol=2e-2, rtol=2e-2), name
    z = F.normalize(torch.randn(8, 16, generator=torch.Generator().manual_seed(0)), dim=1)
    labels = torch.tensor([0, 1, 2, 0, 0, 1, 2, 0])
    f = F.normalize(torch.randn(2, 8, 6, 6, generator=torch.Generator().manual_seed(1)), dim=1)
    for fn, args in (
        (L.supervised_contrastive_loss, (z, labels)),
        (lambda a, b: L.local_contrastive_loss(a, b, grid=6, min_distance=2, generator=torch.Generator().manual_seed(0)), (f, f.roll(1, 0))),
    ):
        ref = fn(*args)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = fn(*[a.bfloat16() if a.is_floating_point() else a for a in args])
        assert low.dtype == torch.float32
        assert torch.allclose(low, ref, atol=5e-2, rtol=2e-2)


def test_bad_arguments_raise_value_error_naming_the_argument():
    p = rand_probs(1, 3, 4, 4)
    with pytest.raises(ValueError, match="p_tilde"):
        L.mi_loss(p, p[:, :2])
    with pytest.raises(ValueError, match="p_hat"):
        L.joint_distribution(p[0], p[0])
    with pytest.raises(ValueError, match="alpha"):
        L.mi_loss(p, p, alpha=1.5)
    with pytest.raises(ValueError, match="mask"):
        L.mi_loss(p, p, mask=torch.ones(1, 4, 4))
    with pytest.raises(ValueError, match="edge"):
        L.cc_loss(torch.rand(1, 1, 4, 4), p, edge="canny")
    with pytest.raises(ValueError, match="window"):
        L.local_cross_correlation(torch.rand(1, 1, 4, 4), torch.rand(1, 1, 4, 4), window=4)
    with pytest.raises(ValueError, match="labels"):
        L.supervised_contrastive_loss(torch.randn(4, 3), torch.zeros(3))
    with pytest.raises(ValueError, match="grid"):
        L.local_contrastive_loss(torch.randn(1, 4, 5, 5), torch.randn(1, 4, 5, 5), grid=20)


# --------------------------------------------------------------------------------------------------
# L_CC
# --------------------------------------------------------------------------------------------------


def _smooth_image(b=2, h=32, w=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    img = torch.rand(b, 1, h // 4, w // 4, generator=g)
    return F.interpolate(img, size=(h, w), mode="bicubic", align_corners=False)


def test_local_cross_correlation_of_a_map_with_itself_is_one():
    a = torch.rand(2, 1, 20, 24, generator=torch.Generator().manual_seed(0))
    cc = L.local_cross_correlation(a, a, window=5)
    assert cc.shape == a.shape
    assert torch.allclose(cc, torch.ones_like(cc), atol=1e-4)
    # affine intensity change of one map: invariant on interior pixels (zero padding breaks the
    # invariance to the offset +2 only within window // 2 of the border)
    cc_affine = L.local_cross_correlation(a, 3 * a + 2, window=5)
    assert torch.allclose(cc_affine[..., 2:-2, 2:-2], torch.ones_like(cc_affine[..., 2:-2, 2:-2]), atol=1e-4)
    b = torch.rand(2, 1, 20, 24, generator=torch.Generator().manual_seed(1))
    assert torch.allclose(
        L.local_cross_correlation(a, 3 * b + 2)[..., 2:-2, 2:-2],
        L.local_cross_correlation(a, b)[..., 2:-2, 2:-2],
        atol=1e-4,
    )
    # anti-correlation counts as no correlation (the cross term is clamped >= eps)
    anti = L.local_cross_correlation(a, -a)
    assert (anti < 1e-3).all()
    # unrelated maps: values in [0, 1] and well below 1 on average
    cc_rand = L.local_cross_correlation(a, b)
    assert (cc_rand >= 0).all() and (cc_rand <= 1 + 1e-5).all()
    assert cc_rand.mean() < 0.3


def test_local_cross_correlation_matches_explicit_windows():
    a = torch.rand(1, 1, 9, 10, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    b = torch.rand(1, 1, 9, 10, generator=torch.Generator().manual_seed(3), dtype=torch.float64) + a
    cc = L.local_cross_correlation(a, b, window=3)
    ap, bp = F.pad(a, (1, 1, 1, 1))[0, 0], F.pad(b, (1, 1, 1, 1))[0, 0]
    for i in (0, 4, 8):
        for j in (0, 5, 9):
            wa, wb = ap[i : i + 3, j : j + 3], bp[i : i + 3, j : j + 3]
            da, db = wa - wa.mean(), wb - wb.mean()
            expected = max((da * db).sum().item(), 1e-5) ** 2 / (
                max((da * da).sum().item(), 1e-5) * max((db * db).sum().item(), 1e-5)
            )
            assert abs(cc[0, 0, i, j].item() - expected) < 1e-9


def _average_pool_box_sum(t, window):
    """L_CC's box sums as they were computed before the separable form: a zero-padded window average x window**2."""
    return F.avg_pool2d(t, window, stride=1, padding=window // 2, count_include_pad=True) * window**2


def test_box_sum_is_zero_padded_at_every_border():
    # an impulse's box sum is the indicator of the window around it, cut at the map's edges; integers: exact
    for h, w, window in ((7, 9, 5), (3, 4, 5), (6, 6, 3)):
        for i, j in ((0, 0), (h - 1, w - 1), (0, w // 2), (h // 2, w - 1)):
            impulse = torch.zeros(1, 1, h, w)
            impulse[0, 0, i, j] = 1.0
            rows = (torch.arange(h) - i).abs() <= window // 2
            cols = (torch.arange(w) - j).abs() <= window // 2
            expected = (rows[:, None] & cols[None, :]).float()[None, None]
            assert torch.equal(L._box_sum(impulse, window), expected)
            assert torch.equal(_average_pool_box_sum(impulse, window), expected)  # the same semantics as before


@pytest.mark.parametrize("h, w, window", [(20, 24, 5), (3, 4, 5), (9, 7, 3), (12, 11, 7)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_separable_box_sum_and_its_gradient_are_the_average_pools_within_rounding(h, w, window, dtype):
    """Same sums in another order. With u = eps / 2 (the dtype's unit roundoff) and S = the window's sum of |t|, to
    first order: the average pool adds window**2 terms (window**2 - 1 roundings, any order), then divides and
    multiplies by window**2 (2 more): <= (window**2 + 1) u S; the separable form adds window terms twice:
    <= 2 (window - 1) u S. So the two differ by at most (window**2 + 2 window - 1) u S, border pixels included (the
    padded zeros add nothing; a wrong padding would be off by whole values). The gradient of either is the box sum
    of the output gradient (a zero-padded box sum is its own adjoint): the same bound with S = the window's sum of
    |grad|. (3, 4, 5): the window is wider than the map on both sides."""
    g = torch.Generator().manual_seed(h * w + window)
    t = torch.randn(2, 3, h, w, generator=g, dtype=dtype).requires_grad_(True)
    grad_out = torch.randn(2, 3, h, w, generator=g, dtype=dtype)
    u = torch.finfo(dtype).eps / 2
    for ours, reference, scale in (
        (L._box_sum(t, window), _average_pool_box_sum(t, window), t.detach().abs()),
        (torch.autograd.grad(L._box_sum(t, window), t, grad_out)[0],
         torch.autograd.grad(_average_pool_box_sum(t, window), t, grad_out)[0], grad_out.abs()),
    ):
        bound = (window**2 + 2 * window - 1) * u * _average_pool_box_sum(scale.double(), window)
        assert bool(((ours.double() - reference.double()).abs() <= bound).all())


def _probs_with_entropy(target):
    """K = 2 probabilities whose (eps-)entropy equals ``target`` [B, 1, H, W] in (0, log 2), by bisection."""
    lo = torch.zeros_like(target, dtype=torch.float64)
    hi = torch.full_like(target, 0.5, dtype=torch.float64)
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        h = L.entropy(torch.cat([mid, 1 - mid], dim=1), dim=1, eps=1e-5).unsqueeze(1)
        below = h < target
        lo = torch.where(below, mid, lo)
        hi = torch.where(below, hi, mid)
    q = 0.5 * (lo + hi)
    return torch.cat([q, 1 - q], dim=1)


@pytest.mark.parametrize("edge", ["sobel", "gradient_power"])
def test_cc_loss_is_minus_one_when_entropy_map_equals_edge_map(edge):
    image = _smooth_image(h=32, w=32).double()
    phi = L.sobel_edge_map(image) if edge == "sobel" else L.gradient_power_edge_map(image, power=0.75)
    target = 0.05 + 0.5 * phi.double()  # inside (0, log 2); min-max normalisation maps it back to phi
    probs = _probs_with_entropy(target)
    assert torch.allclose(L.normalised_entropy_map(probs), phi, atol=1e-4)
    loss = L.cc_loss(image, probs, edge=edge, power=0.75)
    assert abs(loss.item() + 1.0) < 1e-3
    # a mismatched entropy map scores clearly worse
    flipped = _probs_with_entropy(0.05 + 0.5 * phi.double().flip(-1))
    assert L.cc_loss(image, flipped, edge=edge).item() > loss.item() + 0.1
    # with a mask the mean runs over the valid pixels only, all of which are perfect here
    mask = random_mask(2, 32, 32)
    assert abs(L.cc_loss(image, probs, edge=edge, mask=mask).item() + 1.0) < 1e-3


def test_sobel_responds_only_at_vertical_step_edge():
    image = torch.zeros(2, 3, 10, 12)
    image[..., 6:] = 1.0  # step between columns 5 and 6
    edges = L.sobel_edge_map(image)
    assert edges.shape == (2, 1, 10, 12)
    expected = torch.zeros(2, 1, 10, 12)
    expected[..., 5:7] = 1.0
    assert torch.allclose(edges, expected, atol=1e-4)
    # backward differences respond on the column after the step only; no wrap-around at the border
    grad_edges = L.gradient_power_edge_map(image, power=0.75)
    expected = torch.zeros(2, 1, 10, 12)
    expected[..., 6] = 1.0
    assert torch.allclose(grad_edges, expected, atol=1e-4)


def test_sobel_edge_map_is_the_edge_map_of_monais_sobel_gradients():
    """phi of L_CC from MONAI's SobelGradients (replicate padding, unnormalised kernels), applied per slice as the
    channel-first transform it is, then the same magnitude, channel mean and min-max: the same values in float64
    (a changed kernel, padding or normalisation moves them by >= 1e-3). The project keeps its own batched version
    for speed (see sobel_edge_map)."""
    from monai.transforms import SobelGradients

    image = torch.rand(3, 2, 20, 24, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    sobel = SobelGradients(kernel_size=3, padding_mode="replicate", normalize_kernels=False, dtype=torch.float64)
    grads = torch.stack([torch.as_tensor(sobel(slice_)) for slice_ in image])  # [B, 2 * C, H, W]: d/dH, then d/dW
    magnitude = grads.view(3, 2, 2, 20, 24).pow(2).sum(1).sqrt().mean(1, keepdim=True)
    low, high = magnitude.amin(dim=(2, 3), keepdim=True), magnitude.amax(dim=(2, 3), keepdim=True)
    expected = (magnitude - low) / (high - low + L.EPS)
    assert torch.allclose(L.sobel_edge_map(image), expected, rtol=0, atol=64 * torch.finfo(torch.float64).eps)


def test_edge_maps_are_normalised_and_power_is_applied():
    image = torch.rand(3, 2, 16, 16, generator=torch.Generator().manual_seed(4))
    for out in (L.sobel_edge_map(image), L.gradient_power_edge_map(image, power=0.5)):
        assert out.shape == (3, 1, 16, 16)
        assert torch.allclose(out.amin(dim=(2, 3)), torch.zeros(3, 1), atol=1e-6)
        assert torch.allclose(out.amax(dim=(2, 3)), torch.ones(3, 1), atol=1e-4)
    g1 = L.gradient_power_edge_map(image, power=1.0)
    assert torch.allclose(L.gradient_power_edge_map(image, power=0.5), g1.sqrt(), atol=1e-5)
    # entropy map: one-hot -> 0, per-slice min-max normalisation
    p = rand_probs(3, 5, 16, 16, scale=2.0)
    e = L.normalised_entropy_map(p)
    assert e.shape == (3, 1, 16, 16)
    assert torch.allclose(e.amin(dim=(2, 3)), torch.zeros(3, 1), atol=1e-6)
    assert torch.allclose(e.amax(dim=(2, 3)), torch.ones(3, 1), atol=1e-4)


# --------------------------------------------------------------------------------------------------
# L_con
# --------------------------------------------------------------------------------------------------


def _supcon_reference(z, labels, tau):
    z = F.normalize(z.double(), dim=1)
    n = z.shape[0]
    total, anchors = 0.0, 0
    for i in range(n):
        positives = [j for j in range(n) if j != i and labels[j] == labels[i]]
        if not positives:
            continue
        denom = sum(math.exp(z[i] @ z[a] / tau) for a in range(n) if a != i)
        total += -sum(math.log(math.exp(z[i] @ z[j] / tau) / denom) for j in positives) / len(positives)
        anchors += 1
    return total / anchors


@pytest.mark.parametrize("tau", [0.07, 0.5])
def test_supervised_contrastive_matches_double_loop(tau):
    g = torch.Generator().manual_seed(0)
    z = torch.randn(10, 8, generator=g)
    labels = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 3])  # label 3 has no positive: not an anchor
    got = L.supervised_contrastive_loss(F.normalize(z, dim=1), labels, temperature=tau)
    assert abs(got.item() - _supcon_reference(z, labels, tau)) < 1e-4


def test_supervised_contrastive_lower_when_same_label_embeddings_coincide():
    g = torch.Generator().manual_seed(1)
    labels = torch.tensor([0, 1, 2, 0, 1, 2] * 2)
    centres = F.normalize(torch.randn(3, 16, generator=g), dim=1)
    aligned = centres[labels]
    random = F.normalize(torch.randn(12, 16, generator=g), dim=1)
    assert L.supervised_contrastive_loss(aligned, labels).item() < L.supervised_contrastive_loss(random, labels).item() - 1.0
    z = random.clone().requires_grad_(True)
    L.supervised_contrastive_loss(z, labels).backward()
    assert torch.isfinite(z.grad).all()


# --------------------------------------------------------------------------------------------------
# baselines
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [2, 5, 8])
def test_imsat_minimum_for_balanced_confident_predictions(k):
    p = one_hot_balanced(2, k, 5, 8)
    assert abs(L.imsat_loss(p).item() + math.log(k)) < k * 1e-5
    # the smoothness term vanishes for identical views and is positive otherwise
    assert abs(L.imsat_loss(p, p).item() + math.log(k)) < k * 1e-5
    q = rand_probs(2, k, 5, 8, scale=2.0, dtype=torch.float64)
    assert L.imsat_loss(q).item() > -math.log(k) + 1e-3
    assert L.imsat_loss(q, q.roll(1, -1), smoothness_weight=2.0).item() > L.imsat_loss(q).item() + 1e-3
    # explicit value of the KL term
    kl = (q * (torch.log(q + 1e-5) - torch.log(q.roll(1, -1) + 1e-5))).sum(1).mean()
    assert abs(L.imsat_loss(q, q.roll(1, -1), smoothness_weight=0.5).item() - (L.imsat_loss(q).item() + 0.5 * kl.item())) < 1e-9


def test_local_contrastive_identical_views_beat_shuffled_views():
    g = torch.Generator().manual_seed(0)
    f = F.normalize(torch.randn(3, 16, 20, 20, generator=g), dim=1)
    perm = torch.randperm(400, generator=g)
    shuffled = f.flatten(2)[..., perm].reshape(3, 16, 20, 20)
    same = L.local_contrastive_loss(f, f, generator=torch.Generator().manual_seed(1))
    other = L.local_contrastive_loss(f, shuffled, generator=torch.Generator().manual_seed(1))
    assert torch.isfinite(same) and torch.isfinite(other)
    assert same.item() < other.item() - 1.0
    # deterministic given the generator
    again = L.local_contrastive_loss(f, shuffled, generator=torch.Generator().manual_seed(1))
    assert same.item() != other.item() and other.item() == again.item()


def test_local_contrastive_matches_explicit_anchor_computation():
    g = torch.Generator().manual_seed(2)
    fa = F.normalize(torch.randn(1, 4, 5, 5, generator=g, dtype=torch.float64), dim=1)
    fb = F.normalize(torch.randn(1, 4, 5, 5, generator=g, dtype=torch.float64), dim=1)
    tau, md = 0.5, 2
    got = L.local_contrastive_loss(fa, fb, temperature=tau, grid=5, min_distance=md, num_anchors=25)
    va, vb = fa[0].flatten(1).T, fb[0].flatten(1).T  # [25, 4]
    total = 0.0
    for x, y in ((va, vb), (vb, va)):
        for u in range(25):
            pos = math.exp(x[u] @ y[u] / tau)
            neg = sum(
                math.exp(x[u] @ v[t] / tau)
                for v in (va, vb)
                for t in range(25)
                if max(abs(u // 5 - t // 5), abs(u % 5 - t % 5)) >= md
            )
            total += -math.log(pos / (pos + neg))
    assert abs(got.item() - total / 50) < 1e-9


# --------------------------------------------------------------------------------------------------
# heads
# --------------------------------------------------------------------------------------------------


def test_cluster_head_shapes_and_probabilities():
    head = H.ClusterHead(in_channels=32, num_clusters=40, num_subheads=3)
    x = torch.randn(2, 32, 12, 10)
    outs = head(x)
    assert isinstance(outs, list) and len(outs) == 3
    for p in outs:
        assert p.shape == (2, 40, 12, 10) and p.dtype == torch.float32
        assert torch.allclose(p.sum(dim=1), torch.ones(2, 12, 10), atol=1e-5)
        assert (p >= 0).all()
    assert not torch.allclose(outs[0], outs[1])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        p = head(x)[0]
    assert p.dtype == torch.float32 and torch.allclose(p.sum(dim=1), torch.ones(2, 12, 10), atol=1e-5)
    with pytest.raises(ValueError, match="x"):
        head(torch.randn(2, 16, 4, 4))


def test_projectors_shapes_and_unit_norm():
    gp = H.GlobalProjector(in_channels=512, hidden=256, out=256)
    z = gp(torch.randn(4, 512, 7, 7))
    assert z.shape == (4, 256) and z.dtype == torch.float32
    assert torch.allclose(z.norm(dim=1), torch.ones(4), atol=1e-5)
    assert isinstance(gp.mlp[1], torch.nn.LeakyReLU) and gp.mlp[1].negative_slope == 0.01
    dp = H.DenseProjector(in_channels=32, hidden=64, out=64, grid=20)
    f = dp(torch.randn(2, 32, 64, 48))
    assert f.shape == (2, 64, 20, 20) and f.dtype == torch.float32
    assert torch.allclose(f.norm(dim=1), torch.ones(2, 20, 20), atol=1e-5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        f = dp(torch.randn(2, 32, 40, 40))
        z = gp(torch.randn(2, 512, 4, 4))
    assert f.dtype == torch.float32 and torch.allclose(f.norm(dim=1), torch.ones(2, 20, 20), atol=1e-5)
    assert z.dtype == torch.float32 and torch.allclose(z.norm(dim=1), torch.ones(2), atol=1e-5)
    # the dense projector feeds the local contrastive loss directly
    loss = L.local_contrastive_loss(f, f)
    assert torch.isfinite(loss)
