"""Loss functions of the BIM pre-training bundle.

Implements the objectives of "Boundary-aware Information Maximization for Self-supervised Medical
Image Segmentation" (paper sections 2.1-2.3) and the dense / global baselines it is compared to
(IIC, IMSAT, the local contrastive loss of Chaitanya et al. 2020).

Conventions shared by every function of this module
---------------------------------------------------
* One equation of the paper = one function; the docstring shows the equation, the expected shapes
  and the reduction.
* Images and probability maps are NCHW tensors: ``[B, C, H, W]`` / ``[B, K, H, W]``.
* Every loss computes in fp32: inputs in a low-precision dtype (bf16 / fp16) are cast with
  ``x.float()`` and autocast is disabled inside the loss, so the network may run under bf16
  autocast and the returned value is float32.  float64 inputs are kept in float64 (tests).
* Every logarithm has an epsilon inside, ``log(x + eps)`` with ``eps = 1e-5`` by default; inputs are
  never clamped in place.
* Arguments are validated on shape / value only (no data-dependent checks that would force a GPU
  synchronisation); a bad argument raises one ``ValueError`` naming it and what was expected.
* Masks are ``[B, 1, H, W]`` tensors in {0, 1} (bool or float) selecting the valid pixels.
"""

from __future__ import annotations

import contextlib
from typing import Dict, Optional

import torch
import torch.nn.functional as F

from ..gpu_augment import host_to_device

__all__ = [
    "EPS",
    "joint_distribution",
    "entropy",
    "pseudo_diagonal_joint_entropy",
    "diagonal_cross_entropy",
    "mi_loss",
    "iic_mutual_information",
    "cluster_usage",
    "sobel_edge_map",
    "gradient_power_edge_map",
    "normalised_entropy_map",
    "local_cross_correlation",
    "cc_loss",
    "supervised_contrastive_loss",
    "imsat_loss",
    "local_contrastive_loss",
]

EPS = 1e-5

# --------------------------------------------------------------------------------------------------
# helpers (validation, precision)
# --------------------------------------------------------------------------------------------------


def _to_float(x: torch.Tensor) -> torch.Tensor:
    """Cast low-precision floating / integer / bool tensors to fp32; keep fp32 and fp64 as they are."""
    if x.dtype in (torch.float32, torch.float64):
        return x
    return x.float()


def _fp32_context(x: torch.Tensor):
    """Context manager disabling autocast on ``x``'s device so matmuls / convs really run in fp32."""
    try:
        return torch.autocast(device_type=x.device.type, enabled=False)
    except (RuntimeError, ValueError):  # device type without autocast support
        return contextlib.nullcontext()


def _require_tensor(name: str, x) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")


def _require_4d(name: str, x, what: str = "[B, K, H, W]") -> None:
    _require_tensor(name, x)
    if x.dim() != 4:
        raise ValueError(f"{name}: expected a 4-D tensor {what}, got shape {tuple(x.shape)}")
    if not (x.is_floating_point()):
        raise ValueError(f"{name}: expected a floating-point tensor, got dtype {x.dtype}")


def _require_same_shape(name_a: str, a: torch.Tensor, name_b: str, b: torch.Tensor) -> None:
    if a.shape != b.shape:
        raise ValueError(
            f"{name_b}: expected the same shape as {name_a} {tuple(a.shape)}, got {tuple(b.shape)}"
        )


def _require_eps(eps) -> None:
    if not isinstance(eps, (int, float)) or eps < 0:
        raise ValueError(f"eps: expected a non-negative float, got {eps!r}")


def _prepare_mask(mask, ref: torch.Tensor) -> Optional[torch.Tensor]:
    """Validate a ``[B, 1, H, W]`` mask against ``ref`` ``[B, C, H, W]`` and return it as ref's dtype."""
    if mask is None:
        return None
    _require_tensor("mask", mask)
    b, _, h, w = ref.shape
    if mask.dim() != 4 or tuple(mask.shape) != (b, 1, h, w):
        raise ValueError(
            f"mask: expected shape [B, 1, H, W] = {(b, 1, h, w)} with values in {{0, 1}}, "
            f"got {tuple(mask.shape)}"
        )
    return mask.detach().to(dtype=ref.dtype)


def _minmax_normalise(x: torch.Tensor, eps: float) -> torch.Tensor:
    """Per-slice min-max normalisation of ``[B, 1, H, W]``: (x - min) / (max - min + eps)."""
    x_min = x.amin(dim=(-2, -1), keepdim=True)
    x_max = x.amax(dim=(-2, -1), keepdim=True)
    return (x - x_min) / (x_max - x_min + eps)


def _safe_sqrt(x: torch.Tensor) -> torch.Tensor:
    """sqrt(x) for x >= 0 whose gradient is finite (0) at x == 0 (plain sqrt gives inf * 0 = NaN)."""
    positive = x > 0
    return torch.where(positive, torch.sqrt(torch.where(positive, x, torch.ones_like(x))), torch.zeros_like(x))


def _safe_pow(x: torch.Tensor, power: float) -> torch.Tensor:
    """x ** power for x >= 0, 0 < power < 1 without the infinite gradient at x == 0."""
    positive = x > 0
    return torch.where(positive, torch.where(positive, x, torch.ones_like(x)).pow(power), torch.zeros_like(x))


# --------------------------------------------------------------------------------------------------
# L_MI: IIC extended with a pseudo-diagonal joint (paper section 2.1)
# --------------------------------------------------------------------------------------------------


def joint_distribution(
    p_hat: torch.Tensor, p_tilde: torch.Tensor, mask: Optional[torch.Tensor] = None
) -> torch.Tensor:
    r"""Symmetrised joint distribution of the cluster assignments of two pixel-aligned views.

    .. math::
        P = \frac{1}{N} \sum_{i=1}^{N} \hat{p}_i \, \tilde{p}_i^{\top}, \qquad
        P \leftarrow \tfrac{1}{2}(P + P^{\top})

    Plain: ``P[j, k] = mean over valid pixels i of p_hat[i, j] * p_tilde[i, k]``, then symmetrised.

    Args:
        p_hat: ``[B, K, H, W]`` cluster probabilities of the view ``g(s(T(x)))``.
        p_tilde: ``[B, K, H, W]`` cluster probabilities of the view ``g(T(s(x)))``.
        mask: optional ``[B, 1, H, W]`` in {0, 1}; only pixels with mask 1 enter the sum and
            ``N`` = number of valid pixels (e.g. pixels that the affine ``T`` moved in from outside).

    Returns:
        ``[K, K]`` joint (entries sum to 1 when inputs are probability maps), fp32 (fp64 kept).
        Reduction: mean over all (valid) pixels of the whole batch, computed with one matmul of the
        ``[K, B*H*W]`` matrices.
    """
    _require_4d("p_hat", p_hat)
    _require_4d("p_tilde", p_tilde)
    _require_same_shape("p_hat", p_hat, "p_tilde", p_tilde)
    with _fp32_context(p_hat):
        a = _to_float(p_hat)
        b = _to_float(p_tilde).to(a.dtype)
        k = a.shape[1]
        m = _prepare_mask(mask, a)
        if m is not None:
            a = a * m  # mask in {0, 1}: masking one factor masks the product
            n = m.sum().clamp_min(1.0)
        else:
            n = float(a.shape[0] * a.shape[2] * a.shape[3])
        a2 = a.transpose(0, 1).reshape(k, -1)  # [K, B*H*W]
        b2 = b.transpose(0, 1).reshape(k, -1)
        joint = (a2 @ b2.transpose(0, 1)) / n
        return 0.5 * (joint + joint.transpose(0, 1))


def entropy(p: torch.Tensor, dim: int = -1, eps: float = EPS) -> torch.Tensor:
    r"""Shannon entropy of distributions stored along ``dim``.

    .. math:: H(p) = -\sum_k p_k \log(p_k + \epsilon)

    Args:
        p: probabilities, any shape; the distribution lies along ``dim``.
        dim: dimension holding the distribution (default last).
        eps: added inside the log.

    Returns:
        ``p`` with ``dim`` reduced (sum over ``dim``), fp32 (fp64 kept).
    """
    _require_tensor("p", p)
    if not p.is_floating_point():
        raise ValueError(f"p: expected a floating-point tensor of probabilities, got dtype {p.dtype}")
    if p.dim() == 0:
        raise ValueError("p: expected a tensor with at least one dimension, got a scalar")
    _require_eps(eps)
    with _fp32_context(p):
        q = _to_float(p)
        return -(q * torch.log(q + eps)).sum(dim=dim)


def pseudo_diagonal_joint_entropy(P: torch.Tensor, alpha: float, eps: float = EPS) -> torch.Tensor:
    r"""Modified joint entropy with the pseudo-diagonal target (paper eq. ``mod-joint-entropy``).

    .. math::
        H'_\alpha(P) = -\sum_{j=1}^{K}\sum_{k=1}^{K}
            \big((1-\alpha) P_{jk} + \tfrac{\alpha}{K} I_{jk}\big) \log(P_{jk} + \epsilon)

    ``alpha = 0`` gives the joint entropy H(P); ``alpha = 1`` the cross-entropy H(I/K, P).
    The target ``(1 - alpha) P`` is not detached (as in the authors' code).

    Args:
        P: ``[K, K]`` joint distribution.
        alpha: mixing coefficient in [0, 1].
        eps: added inside the log.

    Returns:
        scalar (sum over the K x K entries), fp32.
    """
    _require_tensor("P", P)
    if P.dim() != 2 or P.shape[0] != P.shape[1] or not P.is_floating_point():
        raise ValueError(f"P: expected a floating-point square [K, K] matrix, got {tuple(P.shape)} {P.dtype}")
    if not isinstance(alpha, (int, float)) or not 0.0 <= float(alpha) <= 1.0:
        raise ValueError(f"alpha: expected a float in [0, 1], got {alpha!r}")
    _require_eps(eps)
    with _fp32_context(P):
        q = _to_float(P)
        k = q.shape[0]
        eye = torch.eye(k, dtype=q.dtype, device=q.device)
        target = (1.0 - alpha) * q + (alpha / k) * eye
        return -(target * torch.log(q + eps)).sum()


def diagonal_cross_entropy(P: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    r"""Cross-entropy between the diagonal pseudo-joint I/K and P (Proposition 1's term).

    .. math:: H(\tfrac{1}{K} I_K, P) = -\frac{1}{K}\sum_{k=1}^{K} \log(P_{kk} + \epsilon)

    Proposition 1: ``log K <= H(I/K, P) <= mean_i [H(u, p_hat_i) + H(u, p_tilde_i)]`` (exact for
    ``eps = 0``; with ``eps > 0`` the value can be below ``log K`` by at most ~``K * eps``).

    Args:
        P: ``[K, K]`` joint distribution.
        eps: added inside the log (pass 0 for the exact term).

    Returns:
        scalar (mean over the K diagonal entries), fp32.
    """
    _require_tensor("P", P)
    if P.dim() != 2 or P.shape[0] != P.shape[1] or not P.is_floating_point():
        raise ValueError(f"P: expected a floating-point square [K, K] matrix, got {tuple(P.shape)} {P.dtype}")
    _require_eps(eps)
    with _fp32_context(P):
        return -torch.log(torch.diagonal(_to_float(P)) + eps).mean()


def mi_loss(
    p_hat: torch.Tensor,
    p_tilde: torch.Tensor,
    alpha: float = 0.5,
    mask: Optional[torch.Tensor] = None,
    eps: float = EPS,
) -> torch.Tensor:
    r"""The paper's MI loss (negative pseudo-diagonal mutual information).

    .. math::
        L_{MI} = -I'_\alpha(P) = H'_\alpha(P) - H(\hat{m}) - H(\tilde{m}),\quad
        \hat{m}_j = \sum_k P_{jk},\ \tilde{m}_k = \sum_j P_{jk}

    with P the symmetrised joint of :func:`joint_distribution` (so both marginals coincide) and
    :math:`H'_\alpha` of :func:`pseudo_diagonal_joint_entropy`.  ``alpha = 0`` is IIC's ``-I(X; Y)``
    (equal to ``-iic_mutual_information``); the minimum, for a balanced diagonal joint, is
    ``-log K`` for every alpha.  The authors average this loss over the sub-heads of
    :class:`heads.ClusterHead`; do that in the caller.

    Args:
        p_hat, p_tilde: ``[B, K, H, W]`` pixel-aligned cluster probabilities of the two branches.
        alpha: pseudo-diagonal weight in [0, 1] (paper default 0.5).
        mask: optional ``[B, 1, H, W]`` valid-pixel mask.
        eps: added inside every log.

    Returns:
        scalar fp32 loss (the joint is a mean over the valid pixels of the batch).
    """
    _require_eps(eps)
    joint = joint_distribution(p_hat, p_tilde, mask=mask)
    m_hat = joint.sum(dim=1)
    m_tilde = joint.sum(dim=0)
    return (
        pseudo_diagonal_joint_entropy(joint, alpha, eps=eps)
        - entropy(m_hat, dim=0, eps=eps)
        - entropy(m_tilde, dim=0, eps=eps)
    )


def iic_mutual_information(
    p_hat: torch.Tensor, p_tilde: torch.Tensor, mask: Optional[torch.Tensor] = None, eps: float = EPS
) -> torch.Tensor:
    r"""IIC's mutual information in KL form (for tests, logging and the IIC baseline).

    .. math::
        I(X; Y) = \sum_{j,k} P_{jk}\,\big(\log(P_{jk}+\epsilon) - \log(P_{j\cdot}+\epsilon)
                  - \log(P_{\cdot k}+\epsilon)\big)

    Args:
        p_hat, p_tilde: ``[B, K, H, W]`` pixel-aligned cluster probabilities.
        mask: optional ``[B, 1, H, W]`` valid-pixel mask.
        eps: added inside every log.

    Returns:
        scalar fp32 MI in nats (sum over the K x K joint). ``mi_loss(alpha=0) == -this``.
    """
    _require_eps(eps)
    joint = joint_distribution(p_hat, p_tilde, mask=mask)
    with _fp32_context(joint):
        row = joint.sum(dim=1, keepdim=True)  # P_j.  [K, 1]
        col = joint.sum(dim=0, keepdim=True)  # P_.k  [1, K]
        return (joint * (torch.log(joint + eps) - torch.log(row + eps) - torch.log(col + eps))).sum()


@torch.no_grad()
def cluster_usage(
    p: torch.Tensor, mask: Optional[torch.Tensor] = None, min_fraction: float = 1e-3, eps: float = EPS
) -> Dict[str, torch.Tensor]:
    r"""Collapse diagnostics of a cluster probability map (no gradient).

    * ``marginal_entropy`` = :math:`H(m)`, :math:`m = \frac{1}{N}\sum_i p_i` (max ``log K``).
    * ``clusters_in_use`` = :math:`\#\{k : \frac{1}{N}\#\{i: \arg\max_c p_{ic} = k\} \ge 10^{-3}\}`,
      i.e. clusters winning the argmax for at least 0.1 % of the (valid) pixels.

    Args:
        p: ``[B, K, H, W]`` cluster probabilities.
        mask: optional ``[B, 1, H, W]`` valid-pixel mask.
        min_fraction: share of pixels a cluster must win to count as used (default 0.1 %).

    Returns:
        dict with two detached scalar tensors: ``marginal_entropy`` (float32) and
        ``clusters_in_use`` (int64).
    """
    _require_4d("p", p)
    if not isinstance(min_fraction, (int, float)) or not 0.0 <= min_fraction <= 1.0:
        raise ValueError(f"min_fraction: expected a float in [0, 1], got {min_fraction!r}")
    with _fp32_context(p):
        q = _to_float(p)
        k = q.shape[1]
        m = _prepare_mask(mask, q)
        if m is None:
            m = torch.ones_like(q[:, :1])
        n = m.sum().clamp_min(1.0)
        marginal = (q * m).sum(dim=(0, 2, 3)) / n
        winners = q.argmax(dim=1).reshape(-1)
        counts = torch.zeros(k, dtype=q.dtype, device=q.device).index_add_(0, winners, m.reshape(-1))
        in_use = (counts / n >= min_fraction).sum()
        return {"marginal_entropy": entropy(marginal, dim=0, eps=eps), "clusters_in_use": in_use}


# --------------------------------------------------------------------------------------------------
# L_CC: boundary-aware alignment (paper section 2.2)
# --------------------------------------------------------------------------------------------------


def sobel_edge_map(image: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    r"""Sobel edge map of an image, the :math:`\phi` of L_CC as written in the paper.

    .. math::
        \phi = \mathrm{minmax}\Big(\frac{1}{C}\sum_c \sqrt{(S_x * I_c)^2 + (S_y * I_c)^2}\Big),\quad
        \mathrm{minmax}(x) = \frac{x - \min x}{\max x - \min x + \epsilon}

    with the 3x3 Sobel kernels ``S_x = [[-1,0,1],[-2,0,2],[-1,0,1]]``, ``S_y = S_x^T``, replicate
    padding (no spurious edges at the image border), magnitude per channel then averaged over
    channels, min-max normalised per slice.

    Kept rather than MONAI's :class:`~monai.transforms.SobelGradients` (``padding_mode="replicate"``,
    ``normalize_kernels=False``: the same values, tests/test_losses.py): that transform takes one channel-first image,
    not a batch, and returns a MetaTensor, which breaks ``torch.compile`` of the dense losses (the bundle's
    ``compile_losses``) into 8 graphs where this function is one; it also rounds ~10x more (2.7e-6 against 2.4e-7
    from a float64 result at 24 x 224^2). In eager mode on a CPU thread it is ~2x faster than this one.

    Args:
        image: ``[B, C, H, W]``.
        eps: in the min-max denominator.

    Returns:
        ``[B, 1, H, W]`` in [0, 1], fp32.
    """
    _require_4d("image", image, "[B, C, H, W]")
    _require_eps(eps)
    with _fp32_context(image):
        x = _to_float(image)
        b, c, h, w = x.shape
        sx = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]], dtype=x.dtype, device=x.device)
        kernels = torch.stack([sx, sx.t()]).unsqueeze(1)  # [2, 1, 3, 3]
        padded = F.pad(x.reshape(b * c, 1, h, w), (1, 1, 1, 1), mode="replicate")
        grad = F.conv2d(padded, kernels)  # [B*C, 2, H, W]
        magnitude = _safe_sqrt(grad.pow(2).sum(dim=1)).reshape(b, c, h, w).mean(dim=1, keepdim=True)
        return _minmax_normalise(magnitude, eps)


def gradient_power_edge_map(image: torch.Tensor, power: float = 0.75, eps: float = EPS) -> torch.Tensor:
    r"""The authors' edge map variant: powered gradient magnitude from backward differences.

    .. math::
        \phi = \mathrm{minmax}\Big(\frac{1}{C}\sum_c \sqrt{(I_c[y,x]-I_c[y,x-1])^2
               + (I_c[y,x]-I_c[y-1,x])^2}\Big)^{\gamma}

    The authors' code computes the differences with ``torch.roll``, which wraps around the border
    and creates a spurious edge between the first and the last row / column.  Here the previous
    pixel of the first row / column is taken from **replicate padding** instead (the difference is 0
    there).  Magnitude per channel, averaged over channels, min-max normalised per slice, then
    raised to ``power`` (0.75 in the authors' code, 0.5 for the prostate data).

    Args:
        image: ``[B, C, H, W]``.
        power: exponent gamma > 0 applied after normalisation.
        eps: in the min-max denominator.

    Returns:
        ``[B, 1, H, W]`` in [0, 1], fp32.
    """
    _require_4d("image", image, "[B, C, H, W]")
    if not isinstance(power, (int, float)) or power <= 0:
        raise ValueError(f"power: expected a positive float, got {power!r}")
    _require_eps(eps)
    with _fp32_context(image):
        x = _to_float(image)
        padded = F.pad(x, (1, 0, 1, 0), mode="replicate")  # previous row / column for index 0
        dx = x - padded[:, :, 1:, :-1]
        dy = x - padded[:, :, :-1, 1:]
        magnitude = _safe_sqrt(dx.pow(2) + dy.pow(2)).mean(dim=1, keepdim=True)
        return _safe_pow(_minmax_normalise(magnitude, eps), float(power))


def normalised_entropy_map(p: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    r"""Pixel-wise cluster entropy, the :math:`\varphi` of L_CC (high on cluster boundaries).

    .. math:: \varphi_i = \mathrm{minmax}\big(-\textstyle\sum_k p_{ik}\log(p_{ik}+\epsilon)\big)

    Args:
        p: ``[B, K, H, W]`` cluster probabilities.
        eps: inside the log and in the min-max denominator.

    Returns:
        ``[B, 1, H, W]`` in [0, 1] (per-slice min-max), fp32; differentiable w.r.t. ``p``.
    """
    _require_4d("p", p)
    _require_eps(eps)
    h = entropy(p, dim=1, eps=eps).unsqueeze(1)
    return _minmax_normalise(h, eps)


def _box_sum(t: torch.Tensor, window: int) -> torch.Tensor:
    """Sum of ``t`` over the ``window x window`` box around each pixel, zero outside the map: what
    ``F.avg_pool2d(t, window, 1, window // 2, count_include_pad=True) * window**2`` gives (its divisor is
    ``window**2`` at every pixel, border included: with stride 1 and padding ``window // 2`` no window reaches
    beyond the padding), up to rounding.

    Computed as a ``(window, 1)`` then a ``(1, window)`` window sum (``divisor_override=1``: sums, no
    division), so each pixel adds ``2 x window`` terms instead of ``window**2``, in the forward and in the
    backward (a zero-padded box sum is its own adjoint). On a 224 x 224 pre-training step (H200, compiled) the
    backward of L_CC's three 5 x 5 box sums that need a gradient, one fused kernel, took ~10 % of the GPU time:
    per pixel 75 gathered terms, each with its own window-bounds arithmetic."""
    pad = window // 2
    rows = F.avg_pool2d(t, (window, 1), stride=1, padding=(pad, 0), divisor_override=1)
    return F.avg_pool2d(rows, (1, window), stride=1, padding=(0, pad), divisor_override=1)


def local_cross_correlation(
    a: torch.Tensor, b: torch.Tensor, window: int = 5, eps: float = EPS
) -> torch.Tensor:
    r"""Squared local normalised cross-correlation map (the summand of the paper's L_CC).

    .. math::
        cc_i = \frac{\Big(\sum_{j\in\mathcal{N}(i)}(a_j-\bar a_i)(b_j-\bar b_i)\Big)^2}
                    {\sum_{j\in\mathcal{N}(i)}(a_j-\bar a_i)^2\ \sum_{j\in\mathcal{N}(i)}(b_j-\bar b_i)^2}

    :math:`\mathcal{N}(i)` is a ``window x window`` box with zero padding ``window // 2``
    (VoxelMorph style, ``n = window**2`` even at the border).  With box sums
    ``S_a, S_b, S_ab, S_aa, S_bb`` (:func:`_box_sum`, separable) and means ``u_a = S_a / n``:
    ``cross = S_ab - u_b S_a - u_a S_b + u_a u_b n``, ``var_a = S_aa - 2 u_a S_a + u_a^2 n``
    (same for b).  As in the authors' code, ``cross``, ``var_a`` and ``var_b`` are clamped
    (out-of-place) to >= ``eps`` = 1e-5, so: negative correlation counts as none (0), and a window
    where all three are below eps (flat in both maps) scores 1 with zero gradient.

    Args:
        a, b: ``[B, 1, H, W]`` maps (any channel count works, channel-wise).
        window: odd box size (authors: 5).
        eps: lower clamp of cross and both variances.

    Returns:
        per-pixel map of the same shape as ``a`` with values in [0, 1] (up to rounding), fp32.
        No reduction.
    """
    _require_4d("a", a, "[B, 1, H, W]")
    _require_4d("b", b, "[B, 1, H, W]")
    _require_same_shape("a", a, "b", b)
    if not isinstance(window, int) or window < 1 or window % 2 == 0:
        raise ValueError(f"window: expected a positive odd int, got {window!r}")
    if not isinstance(eps, (int, float)) or eps <= 0:
        raise ValueError(f"eps: expected a positive float, got {eps!r}")
    with _fp32_context(a):
        x = _to_float(a)
        y = _to_float(b).to(x.dtype)
        n = float(window * window)
        s_a, s_b = _box_sum(x, window), _box_sum(y, window)
        s_ab, s_aa, s_bb = _box_sum(x * y, window), _box_sum(x * x, window), _box_sum(y * y, window)
        u_a, u_b = s_a / n, s_b / n
        cross = s_ab - u_b * s_a - u_a * s_b + u_a * u_b * n
        var_a = s_aa - 2.0 * u_a * s_a + u_a * u_a * n
        var_b = s_bb - 2.0 * u_b * s_b + u_b * u_b * n
        cross = torch.clamp(cross, min=eps)
        var_a = torch.clamp(var_a, min=eps)
        var_b = torch.clamp(var_b, min=eps)
        return cross * cross / (var_a * var_b)


_EDGE_MAPS = ("sobel", "gradient_power")


def cc_loss(
    image: torch.Tensor,
    probs: torch.Tensor,
    edge: str = "sobel",
    power: float = 0.75,
    window: int = 5,
    mask: Optional[torch.Tensor] = None,
    eps: float = EPS,
) -> torch.Tensor:
    r"""Boundary-aware alignment loss L_CC (paper section 2.2), as a mean.

    .. math:: L_{CC} = -\frac{1}{|\Omega|}\sum_{i\in\Omega} cc_i(\phi(I), \varphi(p))

    ``phi`` = edge map of the image (:func:`sobel_edge_map` as in the paper, or the authors'
    :func:`gradient_power_edge_map` with ``power``), ``varphi`` = :func:`normalised_entropy_map` of the cluster
    probabilities, ``cc`` = :func:`local_cross_correlation`.  The paper writes a sum over pixels;
    the mean (the authors' choice) keeps lambda_CC = 1 independent of the image size.  The edge map
    is a data-only target and is detached.  ``image`` and ``probs`` must be pixel-aligned (e.g.
    ``T(x)`` with ``p_hat = g(s(T(x)))``).

    Args:
        image: ``[B, C, H, W]`` image.
        probs: ``[B, K, H, W]`` cluster probabilities.
        edge: ``"sobel"`` or ``"gradient_power"``.
        power: exponent of the ``"gradient_power"`` edge map (0.75; 0.5 for prostate).
        window: odd local window size (5).
        mask: optional ``[B, 1, H, W]``; the mean is then over valid pixels only.
        eps: see the component functions.

    Returns:
        scalar fp32 loss in [-1, 0].
    """
    _require_4d("image", image, "[B, C, H, W]")
    _require_4d("probs", probs)
    if image.shape[0] != probs.shape[0] or image.shape[-2:] != probs.shape[-2:]:
        raise ValueError(
            f"probs: expected the batch size and spatial size of image {tuple(image.shape)}, "
            f"got {tuple(probs.shape)}"
        )
    if edge not in _EDGE_MAPS:
        raise ValueError(f"edge: expected one of {_EDGE_MAPS}, got {edge!r}")
    with torch.no_grad():
        if edge == "sobel":
            phi = sobel_edge_map(image, eps=eps)
        else:
            phi = gradient_power_edge_map(image, power=power, eps=eps)
    varphi = normalised_entropy_map(probs, eps=eps)
    cc = local_cross_correlation(phi, varphi, window=window, eps=eps)
    m = _prepare_mask(mask, cc)
    if m is None:
        return -cc.mean()
    return -(cc * m).sum() / m.sum().clamp_min(1.0)


# --------------------------------------------------------------------------------------------------
# L_con: global supervised contrastive loss with meta-labels (paper section 2.3)
# --------------------------------------------------------------------------------------------------


def supervised_contrastive_loss(
    z: torch.Tensor, labels: torch.Tensor, temperature: float = 0.07
) -> torch.Tensor:
    r"""Supervised contrastive loss over an augmented batch with meta-labels (paper eq. ``sup-con``).

    .. math::
        L_{con} = -\frac{1}{|\mathcal{A}|}\sum_{i\in\mathcal{A}}\frac{1}{|S_i|}\sum_{j\in S_i}
            \log\frac{\exp(z_i^\top z_j/\tau)}{\sum_{a\ne i}\exp(z_i^\top z_a/\tau)}

    ``S_i = {j != i : G(j) = G(i)}`` (same meta-label, self excluded), ``A`` = anchors with
    ``|S_i| >= 1``.  The paper averages over all 2N anchors; the two are equal whenever every
    anchor has a positive (always true with two views per image).  Vectorised with a
    ``[2N, 2N]`` similarity matrix and a masked logsumexp.

    Args:
        z: ``[2N, D]`` embeddings, L2-normalised (re-normalised here, which is idempotent).
        labels: ``[2N]`` integer meta-labels (e.g. slice-position partition).
        temperature: tau > 0 (authors 0.07).

    Returns:
        scalar fp32 loss (mean over anchors with at least one positive; 0 if there is none).
    """
    _require_tensor("z", z)
    if z.dim() != 2 or z.shape[0] < 2 or not z.is_floating_point():
        raise ValueError(f"z: expected a floating-point [2N, D] tensor with 2N >= 2, got {tuple(z.shape)} {z.dtype}")
    _require_tensor("labels", labels)
    if labels.dim() != 1 or labels.shape[0] != z.shape[0]:
        raise ValueError(f"labels: expected a 1-D tensor of length {z.shape[0]}, got shape {tuple(labels.shape)}")
    if not isinstance(temperature, (int, float)) or temperature <= 0:
        raise ValueError(f"temperature: expected a positive float, got {temperature!r}")
    with _fp32_context(z):
        x = F.normalize(_to_float(z), dim=1)
        m = x.shape[0]
        sim = (x @ x.t()) / temperature
        self_mask = torch.eye(m, dtype=torch.bool, device=x.device)
        log_denominator = torch.logsumexp(sim.masked_fill(self_mask, float("-inf")), dim=1, keepdim=True)
        log_prob = sim - log_denominator
        lab = host_to_device(labels, x.device)
        positives = (lab.unsqueeze(0) == lab.unsqueeze(1)) & ~self_mask
        n_pos = positives.sum(dim=1)
        mean_log_prob = torch.where(positives, log_prob, torch.zeros_like(log_prob)).sum(dim=1) / n_pos.clamp_min(1)
        valid = (n_pos > 0).to(x.dtype)
        return -(mean_log_prob * valid).sum() / valid.sum().clamp_min(1.0)


# --------------------------------------------------------------------------------------------------
# Baselines
# --------------------------------------------------------------------------------------------------


def imsat_loss(
    p: torch.Tensor,
    p_aug: Optional[torch.Tensor] = None,
    mask: Optional[torch.Tensor] = None,
    smoothness_weight: float = 1.0,
    detach_target: bool = True,
    eps: float = EPS,
) -> torch.Tensor:
    r"""IMSAT (Hu et al. 2017) adapted to dense cluster maps: -I(X; Y) + w * self-augmentation term.

    .. math::
        L_{IMSAT} = -\Big(H\big(\tfrac{1}{N}\textstyle\sum_i p_i\big)
                    - \tfrac{1}{N}\textstyle\sum_i H(p_i)\Big)
                    + w\,\frac{1}{N}\sum_i \mathrm{KL}\big(p_i \,\|\, p^{aug}_i\big)

    * First term: the mutual information between a pixel and its cluster,
      ``I(X; Y) = H(marginal) - mean conditional entropy`` (balanced *and* confident clusters),
      maximised; its minimum ``-log K`` is reached by balanced one-hot predictions.
    * Second term (only when ``p_aug`` is given): the self-augmented-training smoothness,
      ``KL(p_i || p_aug_i) = sum_k p_ik (log(p_ik + eps) - log(p_aug_ik + eps))``, with ``p_aug`` the
      pixel-aligned prediction of an augmented view (instead of IMSAT's virtual adversarial
      perturbation).  As in IMSAT/VAT, ``p`` is a fixed target there (``detach_target=True``).
      ``smoothness_weight`` (w) balances the two terms.

    Args:
        p: ``[B, K, H, W]`` cluster probabilities.
        p_aug: optional ``[B, K, H, W]`` probabilities of the augmented view, pixel-aligned with p.
        mask: optional ``[B, 1, H, W]``; all means over valid pixels only.
        smoothness_weight: w >= 0.
        detach_target: detach ``p`` inside the KL term.
        eps: inside every log.

    Returns:
        scalar fp32 loss (means over the valid pixels of the batch).
    """
    _require_4d("p", p)
    if p_aug is not None:
        _require_4d("p_aug", p_aug)
        _require_same_shape("p", p, "p_aug", p_aug)
    if not isinstance(smoothness_weight, (int, float)) or smoothness_weight < 0:
        raise ValueError(f"smoothness_weight: expected a non-negative float, got {smoothness_weight!r}")
    _require_eps(eps)
    with _fp32_context(p):
        q = _to_float(p)
        m = _prepare_mask(mask, q)
        if m is None:
            m = torch.ones_like(q[:, :1])
        n = m.sum().clamp_min(1.0)
        marginal = (q * m).sum(dim=(0, 2, 3)) / n
        conditional = (entropy(q, dim=1, eps=eps).unsqueeze(1) * m).sum() / n
        loss = -(entropy(marginal, dim=0, eps=eps) - conditional)
        if p_aug is not None:
            target = q.detach() if detach_target else q
            r = _to_float(p_aug).to(q.dtype)
            kl = (target * (torch.log(target + eps) - torch.log(r + eps))).sum(dim=1, keepdim=True)
            loss = loss + smoothness_weight * (kl * m).sum() / n
        return loss


def local_contrastive_loss(
    f_hat: torch.Tensor,
    f_tilde: torch.Tensor,
    temperature: float = 0.1,
    grid: Optional[int] = 20,
    min_distance: int = 3,
    num_anchors: int = 64,
    generator: Optional[torch.Generator] = None,
) -> torch.Tensor:
    r"""Local (dense) contrastive loss of Chaitanya et al. 2020 on a g x g grid of embeddings.

    For an anchor position ``u`` of image ``b`` in view ``v`` (the other view being ``v'``):

    .. math::
        \ell(u) = -\log\frac{\exp(f^{v}_u{}^\top f^{v'}_u/\tau)}
            {\exp(f^{v}_u{}^\top f^{v'}_u/\tau) + \sum_{w\in\{v,v'\}}\sum_{t:\,d(u,t)\ge d_{min}}
             \exp(f^{v}_u{}^\top f^{w}_t/\tau)}

    positive = same grid position in the other view (views are pixel-aligned), negatives = positions
    of the same image, in both views, at Chebyshev grid distance ``d(u, t) = max(|dy|, |dx|) >=
    min_distance``.  ``num_anchors`` positions per image are sampled without replacement (the same
    positions serve as anchors in both views); the loss is symmetrised over the two views.
    Memory: ``O(B * num_anchors * g^2)``.

    Args:
        f_hat, f_tilde: ``[B, D, g, g]`` dense projector outputs, L2-normalised over D
            (re-normalised here, idempotent).
        temperature: tau > 0 (Chaitanya: 0.1).
        grid: expected g (``None``: take it from the input).
        min_distance: minimal grid distance of a negative (>= 1).
        num_anchors: anchors sampled per image (capped at g*g).
        generator: optional ``torch.Generator`` for the anchor sampling.

    Returns:
        scalar fp32 loss, mean over images, anchors and the two directions.
    """
    _require_4d("f_hat", f_hat, "[B, D, g, g]")
    _require_4d("f_tilde", f_tilde, "[B, D, g, g]")
    _require_same_shape("f_hat", f_hat, "f_tilde", f_tilde)
    if grid is not None and tuple(f_hat.shape[-2:]) != (grid, grid):
        raise ValueError(f"f_hat: expected a {grid} x {grid} grid (argument grid), got {tuple(f_hat.shape[-2:])}")
    if not isinstance(temperature, (int, float)) or temperature <= 0:
        raise ValueError(f"temperature: expected a positive float, got {temperature!r}")
    if not isinstance(min_distance, int) or min_distance < 1:
        raise ValueError(f"min_distance: expected an int >= 1, got {min_distance!r}")
    if not isinstance(num_anchors, int) or num_anchors < 1:
        raise ValueError(f"num_anchors: expected an int >= 1, got {num_anchors!r}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"generator: expected a torch.Generator or None, got {type(generator).__name__}")
    with _fp32_context(f_hat):
        fa = F.normalize(_to_float(f_hat), dim=1).flatten(2).transpose(1, 2)  # [B, G, D]
        fb = F.normalize(_to_float(f_tilde).to(fa.dtype), dim=1).flatten(2).transpose(1, 2)
        bsz, g2, dim = fa.shape
        gw = f_hat.shape[-1]
        n_anchor = min(num_anchors, g2)
        rand_device = generator.device if generator is not None else fa.device
        noise = host_to_device(torch.rand(bsz, g2, generator=generator, device=rand_device), fa.device)
        idx = noise.argsort(dim=1)[:, :n_anchor]  # [B, A]
        gather_idx = idx.unsqueeze(-1).expand(-1, -1, dim)
        anchors_a = fa.gather(1, gather_idx)  # [B, A, D]
        anchors_b = fb.gather(1, gather_idx)
        positions = torch.arange(g2, device=fa.device)
        ys, xs = positions // gw, positions % gw
        dist = torch.maximum(
            (ys[idx].unsqueeze(-1) - ys).abs(), (xs[idx].unsqueeze(-1) - xs).abs()
        )  # [B, A, G]
        too_close = (dist < min_distance).repeat(1, 1, 2)  # negatives from both views
        positive = (anchors_a * anchors_b).sum(-1, keepdim=True) / temperature  # [B, A, 1]

        def direction(anchors: torch.Tensor) -> torch.Tensor:
            negatives = torch.cat([anchors @ fa.transpose(1, 2), anchors @ fb.transpose(1, 2)], dim=-1)
            negatives = (negatives / temperature).masked_fill(too_close, float("-inf"))
            logits = torch.cat([positive, negatives], dim=-1)
            return (torch.logsumexp(logits, dim=-1, keepdim=True) - positive).mean()

        return 0.5 * (direction(anchors_a) + direction(anchors_b))
