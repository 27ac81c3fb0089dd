"""Batched geometric and intensity augmentation that runs where the data lives (the GPU in training).

All geometric work is expressed as 3x3 homogeneous matrices acting on *normalised* coordinates
([-1, 1], ``align_corners=False``) of the output grid and mapping them to normalised input coordinates, so a
random crop, a flip, a rotation, a scaling and a translation compose into one matrix product and one
``grid_sample`` call per batch. Random parameters are drawn from a CPU :class:`torch.Generator` (cheap: a few
numbers per image), which makes runs reproducible across devices and lets checkpoints store the state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .flags import as_flag, require_choice


def host_to_device(t: torch.Tensor, device: torch.device | str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``t`` (drawn or built on the host) on ``device``, as ``dtype``. To a GPU it goes from page-locked memory
    without blocking: a blocking host-to-device copy synchronises the stream, so the CPU would wait for all the GPU
    work queued before it (augmentation and loss parameters are copied several times per step, some between a
    forward and its loss). A tensor already on the device is only cast; inside ``torch.compile`` a plain copy (the
    compiled code places it)."""
    t = t if dtype is None else t.to(dtype)
    if torch.device(device).type == "cuda" and t.device.type == "cpu" and not torch.compiler.is_compiling():
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def _uniform(n: int, low: float, high: float, generator: torch.Generator | None) -> torch.Tensor:
    return low + (high - low) * torch.rand(n, generator=generator, dtype=torch.float64)


def crop_matrices(
    batch: int,
    in_hw: tuple[int, int],
    out_hw: tuple[int, int],
    generator: torch.Generator | None = None,
    random: bool = True,
) -> torch.Tensor:
    """Matrices [B, 3, 3] that take an ``out_hw`` window from an ``in_hw`` image at integer pixel offsets.

    Where the output is larger than the input the image is padded (zeros) and placed at a random offset.
    ``random=False`` gives the centre crop/pad. Offsets are whole pixels, so no interpolation blur occurs.
    """
    mats = torch.zeros(batch, 3, 3, dtype=torch.float64)
    mats[:, 2, 2] = 1.0
    for axis, (size_in, size_out) in enumerate(zip(in_hw, out_hw)):
        # axis 0 is H (normalised y, row 1 of the matrix), axis 1 is W (normalised x, row 0).
        row = 1 - axis
        slack = size_in - size_out
        if random and slack != 0:
            offset = torch.randint(0, abs(slack) + 1, (batch,), generator=generator).to(torch.float64)
            offset = offset * (1 if slack > 0 else -1)
        else:
            offset = torch.full((batch,), float(slack // 2) if slack > 0 else -float((-slack) // 2), dtype=torch.float64)
        mats[:, row, row] = size_out / size_in
        mats[:, row, 2] = (2 * offset - slack) / size_in
    return mats


def random_affine_matrices(
    batch: int,
    generator: torch.Generator | None = None,
    scale_range: tuple[float, float] = (0.8, 1.3),
    max_rotation_deg: float = 45.0,
    max_translation: float = 0.1,
    flip_prob: float = 0.0,
) -> torch.Tensor:
    """Random similarity transforms [B, 3, 3] of the output grid (the paper's affine part of T).

    Zoom factor s in ``scale_range`` (s > 1 enlarges the content), rotation in ``±max_rotation_deg``,
    translation in ``±max_translation`` of the image size, optional horizontal/vertical flips.
    """
    scale = _uniform(batch, *scale_range, generator)
    angle = _uniform(batch, -max_rotation_deg, max_rotation_deg, generator) * math.pi / 180.0
    shift = _uniform(2 * batch, -max_translation, max_translation, generator).view(batch, 2) * 2.0
    flips = torch.ones(batch, 2, dtype=torch.float64)
    if flip_prob > 0:
        flips = torch.where(torch.rand(batch, 2, generator=generator, dtype=torch.float64) < flip_prob, -1.0, 1.0)
    cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale
    mats = torch.zeros(batch, 3, 3, dtype=torch.float64)
    mats[:, 0, 0], mats[:, 0, 1] = cos * flips[:, 0], -sin * flips[:, 1]
    mats[:, 1, 0], mats[:, 1, 1] = sin * flips[:, 0], cos * flips[:, 1]
    mats[:, :2, 2] = shift
    mats[:, 2, 2] = 1.0
    return mats


def warp(x: torch.Tensor, matrices: torch.Tensor, out_hw: tuple[int, int] | None = None, mode: str = "bilinear",
         fp32_grid: bool = False) -> torch.Tensor:
    """Resample ``x`` [B, C, H, W] on the grid given by ``matrices`` [B, 3, 3] (zero padding outside).

    ``grid_sample`` needs the grid in ``x``'s dtype: a bf16 ``x`` gets a bf16 grid, whose normalised coordinates
    carry 8 significant bits (0.4 px at 224 px near the border). ``fp32_grid`` keeps the sampling positions those
    of an fp32 warp for a low-precision ``x``: "nearest" gathers ``x``'s own values at the positions of the fp32 grid
    (:func:`nearest_gather`; ``x``'s dtype, no fp32 copy of ``x``), "bilinear" samples ``x`` as fp32 and returns fp32.
    The grid itself is computed in fp32 with autocast off: ``affine_grid`` is a batched matmul, which bf16 autocast
    would run in bf16 (positions off by up to half a pixel however ``x`` is sampled)."""
    if x.ndim != 4:
        raise ValueError(f"warp expects a [B, C, H, W] tensor, got shape {tuple(x.shape)}")
    out_hw = tuple(x.shape[-2:]) if out_hw is None else tuple(out_hw)
    theta = host_to_device(matrices[:, :2, :], x.device, torch.float32)
    with torch.autocast(device_type=x.device.type, enabled=False):
        grid = F.affine_grid(theta, [x.shape[0], 1, *out_hw], align_corners=False)
    if x.dtype in (torch.uint8, torch.int64, torch.int32, torch.bool):
        if mode != "nearest":
            raise ValueError("integer tensors (labels) can only be warped with mode='nearest'")
        return F.grid_sample(x.float(), grid, mode="nearest", align_corners=False).to(x.dtype)
    if fp32_grid and x.dtype not in (torch.float32, torch.float64):
        if mode == "nearest":
            return nearest_gather(x, grid)
        x = x.float()
    return F.grid_sample(x, grid.to(x.dtype), mode=mode, padding_mode="zeros", align_corners=False)


def nearest_gather(x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """``grid_sample(x, grid, mode="nearest", padding_mode="zeros", align_corners=False)`` as a gather of ``x``'s
    values, the positions computed from ``grid`` in its own (fp32) precision: x [B, C, H, W], grid [B, H', W', 2]
    -> [B, C, H', W'] in ``x``'s dtype, channels-last. Source pixel ``round(((g + 1) * size - 1) / 2)`` (half to
    even, as grid_sample), zero outside the input. A channels-last ``x`` is read in place; the backward is a
    scatter-add into ``x``'s dtype."""
    b, c, h, w = x.shape
    out_h, out_w = grid.shape[1:3]
    col = torch.round(((grid[..., 0] + 1) * w - 1) / 2).long()
    row = torch.round(((grid[..., 1] + 1) * h - 1) / 2).long()
    inside = ((col >= 0) & (col <= w - 1) & (row >= 0) & (row <= h - 1)).view(b, -1, 1)
    index = (row.clamp(0, h - 1) * w + col.clamp(0, w - 1)).view(b, -1, 1).expand(b, out_h * out_w, c)  # int64: exact
    pixels = x.permute(0, 2, 3, 1).reshape(b, h * w, c)  # a view when x is channels-last
    out = torch.gather(pixels, 1, index).masked_fill(~inside, 0)
    return out.view(b, out_h, out_w, c).permute(0, 3, 1, 2)


def draw_gamma(n: int, generator: torch.Generator | None = None, gamma_range=(0.5, 2.0)) -> torch.Tensor:
    """``n`` gammas, log-uniform in ``gamma_range``, drawn on the host in float64 (:func:`random_gamma`'s draw)."""
    lo, hi = math.log(gamma_range[0]), math.log(gamma_range[1])
    return torch.exp(_uniform(n, lo, hi, generator))


def apply_gamma(x: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    """Per-image gamma correction ``x^gamma`` (``gamma`` [B] on ``x``'s device; x is expected in [0, 1])."""
    return x.clamp_min(0).pow(gamma.to(x.dtype).view(-1, *([1] * (x.ndim - 1))))


def random_gamma(x: torch.Tensor, generator: torch.Generator | None = None, gamma_range=(0.5, 2.0)) -> torch.Tensor:
    """Per-image gamma correction x^gamma, gamma log-uniform in ``gamma_range`` (x is expected in [0, 1])."""
    return apply_gamma(x, host_to_device(draw_gamma(x.shape[0], generator, gamma_range), x.device, x.dtype))


def draw_intensity_jitter(n: int, generator: torch.Generator | None = None, brightness: float = 0.1,
                          contrast: float = 0.1) -> torch.Tensor:
    """[n, 2]: per image the contrast change c in ±contrast, then the brightness shift b in ±brightness, drawn on
    the host in float64 (applied by :func:`apply_intensity_jitter`)."""
    c = _uniform(n, -contrast, contrast, generator)
    return torch.stack([c, _uniform(n, -brightness, brightness, generator)], dim=1)


def apply_intensity_jitter(x: torch.Tensor, contrast_brightness: torch.Tensor) -> torch.Tensor:
    """Per-image contrast and brightness jitter ``x * (1 + c) + b`` (``contrast_brightness`` [B, 2] of (c, b) on
    ``x``'s device)."""
    cb = contrast_brightness.to(x.dtype)
    shape = (-1, *([1] * (x.ndim - 1)))
    return x * (1 + cb[:, 0].view(shape)) + cb[:, 1].view(shape)


def stage_on_device(tensors: dict[str, torch.Tensor], device: torch.device | str) -> dict[str, torch.Tensor]:
    """The host tensors ``tensors`` (random draws of one step, float64) on ``device`` in one copy: flattened into one
    buffer, copied with :func:`host_to_device`, then split into views of the same shapes (and dtype). On a GPU one
    transfer instead of one per tensor; the values are the same bits as tensor-by-tensor copies."""
    names = list(tensors)
    if not names:
        return {}
    dtypes = {tensors[k].dtype for k in names}
    if len(dtypes) != 1:
        raise ValueError(f"stage_on_device: the tensors must share one dtype, got {sorted(map(str, dtypes))}")
    flat = torch.cat([tensors[k].reshape(-1) for k in names])
    staged = host_to_device(flat, device)
    out, start = {}, 0
    for k in names:
        n = tensors[k].numel()
        out[k] = staged[start:start + n].view(tensors[k].shape)
        start += n
    return out


def brightness_contrast_jitter(
    x: torch.Tensor, generator: torch.Generator | None = None, factor_range: tuple[float, float] = (0.5, 1.5)
) -> torch.Tensor:
    """torchvision-style ``ColorJitter(brightness, contrast)`` per image of ``x`` [B, C, H, W] in [0, 1]: brightness
    ``x * b``, then contrast ``c * x + (1 - c) * mean(x)`` (the mean of each image), each clamped to [0, 1], with
    b and c drawn independently from ``U(factor_range)`` for every image (the authors' view jitter: [0.5, 1.5])."""
    lo, hi = float(factor_range[0]), float(factor_range[1])
    shape = (-1, *([1] * (x.ndim - 1)))
    b = host_to_device(_uniform(x.shape[0], lo, hi, generator), x.device, x.dtype).view(shape)
    c = host_to_device(_uniform(x.shape[0], lo, hi, generator), x.device, x.dtype).view(shape)
    x = (x * b).clamp(0.0, 1.0)
    mean = x.mean(dim=tuple(range(1, x.ndim)), keepdim=True)
    return (c * x + (1 - c) * mean).clamp(0.0, 1.0)


def check_factor_range(name: str, value) -> tuple[float, float] | None:
    """``value`` (None or [lo, hi] with 0 <= lo <= hi) as a tuple, or one ValueError naming ``name``."""
    if value is None:
        return None
    if (isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or len(value) != 2
            or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in value)
            or not 0.0 <= float(value[0]) <= float(value[1])):
        raise ValueError(f"{name} must be null or [low, high] with 0 <= low <= high (factors; the authors use "
                         f"[0.5, 1.5]), got {value!r}")
    return float(value[0]), float(value[1])


def pretrain_views(
    image: torch.Tensor,
    crop_size: int,
    generator: torch.Generator | None = None,
    rotation_deg: float = 0.0,
    jitter: tuple[float, float] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The two views (x1, x2) of a pre-training batch of full slices ``image`` [B, 1, H, W].

    One geometric transform per slice, shared by both views: a random ``crop_size`` crop, horizontal and vertical
    flips (p = 0.5 each) and a rotation in ``±rotation_deg`` about the crop's centre (one ``grid_sample``). Then,
    with ``jitter`` = [lo, hi], each view gets its own :func:`brightness_contrast_jitter`; with ``jitter`` None
    there is one view (x1 is x2). The equivariant pair is then p_hat = g(s(T(x2))), p_tilde = g(T(s(x1)))."""
    b = image.shape[0]
    crop = crop_matrices(b, tuple(image.shape[-2:]), (crop_size, crop_size), generator)
    geometry = random_affine_matrices(b, generator, (1.0, 1.0), float(rotation_deg), 0.0, flip_prob=0.5)
    x = warp(image, crop @ geometry, (crop_size, crop_size))
    if jitter is None:
        return x, x
    return brightness_contrast_jitter(x, generator, jitter), brightness_contrast_jitter(x, generator, jitter)


@dataclass
class PairParams:
    """Random state of one draw of the pair transform T, shared by its image and feature branches."""

    affine: torch.Tensor  # [B, 3, 3]
    gamma_image: torch.Tensor | None = None  # [B] gamma applied to the image branch only


INTERPOLATIONS = ("bilinear", "nearest")
GAMMA_SAMPLINGS = ("log_uniform", "uniform")


def mirror_matrices(batch: int, generator: torch.Generator | None = None, prob: float = 0.0) -> torch.Tensor:
    """[B, 3, 3] random mirrors: with probability ``prob`` an image is flipped along one axis, H or W with equal
    chance (the authors' ``Mirror(dims=[0, 1], p_sample=0.9)`` of T); otherwise the identity. Draws nothing from
    ``generator`` when ``prob`` is 0."""
    mats = torch.eye(3, dtype=torch.float64).repeat(batch, 1, 1)
    if prob > 0:
        flip = torch.rand(batch, generator=generator, dtype=torch.float64) < prob
        axis = torch.randint(0, 2, (batch,), generator=generator)  # 0: H (normalised y, row 1), 1: W (x, row 0)
        idx = torch.arange(batch)
        mats[idx[flip], 1 - axis[flip], 1 - axis[flip]] = -1.0
    return mats


class EquivariantPairTransform:
    """The paper's transform T for the pair p_hat = g(s(T(x))), p_tilde = g(T(s(x))).

    On images T is gamma correction (``gamma_range``, log-uniform or, ``gamma_sampling`` "uniform", the authors'
    U(0.5, 2)) followed by a random affine map (zoom ``scale_range``, rotation ``±max_rotation_deg``, translation
    ``±max_translation``) and, with probability ``mirror_prob``, a mirror along one axis (the authors: 0.9); on
    feature maps the *same* geometric map only, with no intensity change. :meth:`sample` draws one random state
    which both branches then use. ``interpolation``: "bilinear" or the authors' "nearest", for both branches.
    ``feature_warp_fp32``: the feature branch samples bf16 features on an fp32 grid (see :func:`warp`), so its
    positions match the image branch's under bf16 autocast.
    """

    def __init__(
        self,
        gamma_range: tuple[float, float] | None = (0.5, 2.0),
        scale_range: tuple[float, float] = (0.8, 1.3),
        max_rotation_deg: float = 45.0,
        max_translation: float = 0.1,
        interpolation: str = "bilinear",
        mirror_prob: float = 0.0,
        gamma_sampling: str = "log_uniform",
        feature_warp_fp32: bool = False,
    ) -> None:
        require_choice("t_interpolation", interpolation, INTERPOLATIONS)
        if isinstance(mirror_prob, bool) or not isinstance(mirror_prob, (int, float)) or not 0.0 <= mirror_prob <= 1.0:
            raise ValueError(f"t_mirror_prob must be a probability in [0, 1], got {mirror_prob!r}")
        require_choice("t_gamma_sampling", gamma_sampling, GAMMA_SAMPLINGS)
        feature_warp_fp32 = as_flag(feature_warp_fp32, "feature_warp_fp32")
        self.gamma_range = tuple(gamma_range) if gamma_range is not None else None
        self.scale_range = tuple(scale_range)
        self.max_rotation_deg = max_rotation_deg
        self.max_translation = max_translation
        self.interpolation, self.mirror_prob = interpolation, float(mirror_prob)
        self.gamma_sampling, self.feature_warp_fp32 = gamma_sampling, feature_warp_fp32

    def sample(self, batch: int, generator: torch.Generator | None = None) -> PairParams:
        affine = random_affine_matrices(batch, generator, self.scale_range, self.max_rotation_deg, self.max_translation)
        gamma = None
        if self.gamma_range is not None:
            if self.gamma_sampling == "uniform":
                gamma = _uniform(batch, self.gamma_range[0], self.gamma_range[1], generator)
            else:
                gamma = draw_gamma(batch, generator, self.gamma_range)
        if self.mirror_prob > 0:  # mirror after the affine map (output side): M = A @ mirror
            affine = affine @ mirror_matrices(batch, generator, self.mirror_prob)
        return PairParams(affine=affine, gamma_image=gamma)

    def apply_image(self, x: torch.Tensor, params: PairParams) -> torch.Tensor:
        if params.gamma_image is not None:
            x = apply_gamma(x, host_to_device(params.gamma_image, x.device, x.dtype))
        return warp(x, params.affine, mode=self.interpolation)

    def apply_features(self, f: torch.Tensor, params: PairParams) -> torch.Tensor:
        return warp(f, params.affine, mode=self.interpolation, fp32_grid=self.feature_warp_fp32)

    def valid_mask(self, params: PairParams, like: torch.Tensor) -> torch.Tensor:
        """[B, 1, H, W] mask of output pixels whose source lies inside the input (1) or in the padding (0)."""
        ones = torch.ones(like.shape[0], 1, *like.shape[-2:], device=like.device, dtype=torch.float32)
        return (warp(ones, params.affine, mode=self.interpolation) > 0.999).to(torch.float32)
