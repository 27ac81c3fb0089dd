"""The paper's U-Net and the decoder blocks its dense embedding can be taken from.

The network is MONAI's :class:`monai.networks.nets.BasicUNet` with 2D blocks of widths 32-64-128-256-512
(5 encoder blocks ``conv_0``, ``down_1`` ... ``down_4``; 4 decoder blocks ``upcat_4`` ... ``upcat_1``;
each block (3x3 conv, BatchNorm, ReLU) x 2) and a final 1x1 convolution ``final_conv``. Pre-training
(:class:`bim.pretrain.model.BIMClusterNet`) keeps it as ``unet`` with BasicUNet's names, so the fine-tuning network
loads its weights by name (:func:`bim.segmentation.load_pretrained`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F

from .flags import as_flag, require_choice
from monai.networks.nets import BasicUNet
from monai.networks.nets.basic_unet import UpCat
from torch import nn

PAPER_FEATURES = (32, 64, 128, 256, 512, 32)
UNET_STYLES = ("monai", "authors")
# the weight of a decoder block's upsampling: BasicUNet's 2x2 transposed conv, or the authors' 3x3 conv after a
# nearest-neighbour x2 (authors_upsample: NearestUpsample2x, Conv2d, ...), whatever prefix the names carry
_UPSAMPLE_WEIGHT = re.compile(r"(?:^|\.)upcat_[1-4]\.upsample\.(deconv|1)\.weight$")
_UPSAMPLE_STYLE = {"deconv": ("monai", (2, 2)), "1": ("authors", (3, 3))}
# the tensors whose first dimension is each of the 6 widths (5 encoder blocks, the last decoder block)
_WIDTH_TENSORS = ("conv_0.conv_0.conv.weight", "down_1.convs.conv_1.conv.weight", "down_2.convs.conv_1.conv.weight",
                  "down_3.convs.conv_1.conv.weight", "down_4.convs.conv_1.conv.weight",
                  "upcat_1.convs.conv_1.conv.weight")


def build_unet(
    in_channels: int = 1,
    out_channels: int = 2,
    features: Sequence[int] = PAPER_FEATURES,
    norm: str = "batch",
    dropout: float = 0.0,
    bn_momentum: float | None = None,
    unet_style: str = "monai",
) -> BasicUNet:
    """Build the paper's 2D U-Net (BatchNorm by default, as in the paper). ``bn_momentum`` sets BatchNorm's
    running-statistics momentum (None: PyTorch's 0.1, an average over the last ~10 batches).

    ``unet_style`` "monai": MONAI's BasicUNet as it is (LeakyReLU 0.1, convolutions with bias, 2x2 transposed
    convolutions to upsample). "authors": the U-Net of the paper's public code, kept in BasicUNet's layout and
    module names: ReLU everywhere, convolutions without bias, BatchNorm momentum 0.01 (unless ``bn_momentum`` says
    otherwise), and each decoder block upsamples by nearest-neighbour x2 then a 3x3 conv + BatchNorm + ReLU
    (:func:`authors_upsample`). The two styles' weights do not load into each other: fine-tune with the same style."""
    if len(features) != 6:
        raise ValueError(f"features must have 6 widths (5 encoder + last decoder), got {tuple(features)}")
    require_choice("unet_style", unet_style, UNET_STYLES)
    authors = unet_style == "authors"
    if authors and bn_momentum is None and norm == "batch":
        bn_momentum = 0.01
    if bn_momentum is not None:
        if norm != "batch":
            raise ValueError(f"bn_momentum is only meaningful with norm 'batch', got norm {norm!r}")
        if not 0.0 < float(bn_momentum) <= 1.0:
            raise ValueError(f"bn_momentum must be in (0, 1], got {bn_momentum}")
        norm = ("batch", {"momentum": float(bn_momentum)})
    net = BasicUNet(
        spatial_dims=2,
        in_channels=in_channels,
        out_channels=out_channels,
        features=tuple(features),
        norm=norm,
        dropout=dropout,
        **({"act": "relu", "bias": False} if authors else {}),
    )
    if authors:
        batch_norm = (norm[0] if isinstance(norm, tuple) else norm) == "batch"
        momentum = (0.1 if bn_momentum is None else float(bn_momentum)) if batch_norm else None
        for block in (net.upcat_4, net.upcat_3, net.upcat_2, net.upcat_1):
            deconv = block.upsample.deconv
            block.upsample = authors_upsample(deconv.in_channels, deconv.out_channels, momentum)
    return set_decoder_padding(net, always=False)


def authors_upsample(in_channels: int, out_channels: int, bn_momentum: float | None = 0.01) -> nn.Sequential:
    """The authors' decoder upsampling: nearest-neighbour x2 (:class:`NearestUpsample2x`), then 3x3 conv (no bias)
    + BatchNorm + ReLU (``bn_momentum`` None: no BatchNorm). It replaces BasicUNet's 2x2 transposed convolution with
    the same input and output widths, so the block's two convolutions after the concatenation are unchanged."""
    layers = [NearestUpsample2x(),
              nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1, bias=False)]
    if bn_momentum is not None:
        layers.append(nn.BatchNorm2d(out_channels, momentum=bn_momentum))
    layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class NearestUpsample2x(nn.Upsample):
    """Nearest-neighbour x2 upsampling of ``[N, C, H, W]`` as a broadcast copy: each pixel repeated into a 2 x 2 block.

    The values are those of ``nn.Upsample(scale_factor=2, mode="nearest")`` (each output pixel a copy of one input
    pixel, so bit for bit the same). What differs is the backward: ``upsample_nearest2d``'s backward is a scatter, and
    under ``torch.compile`` a scatter with atomic adds (on an H200 pre-training step its three kernels took 8 % of the
    GPU time, and atomic adds sum in no fixed order, so the gradient is not reproducible). Here the forward is
    ``expand`` + ``reshape``, so the backward is ``expand``'s: a sum over each 2 x 2 block, a reduction in a fixed
    order. A channels-last input is expanded in its NHWC layout, so the output stays channels-last as the
    interpolation's does (and the convolution after it gets the layout it was given). A subclass of ``nn.Upsample``
    without parameters or buffers: code that looks for an ``nn.Upsample`` still finds one, and the state dict's keys
    (``upcat_<k>.upsample.1.weight`` ...) are those of the checkpoints written with ``nn.Upsample``."""

    def __init__(self) -> None:
        super().__init__(scale_factor=2.0, mode="nearest")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        n, c, h, w = input.shape[0], input.shape[1], input.shape[2], input.shape[3]
        # channels-last only when the strides say so (a tensor that is both, e.g. of 1 x 1 pixels, is taken as
        # contiguous, as the interpolation does); contiguous() after reshape: where a size is 1, reshape of the
        # expanded tensor is a view with stride 0, not a copy
        if input.is_contiguous(memory_format=torch.channels_last) and not input.is_contiguous():
            nhwc = input.permute(0, 2, 3, 1)[:, :, None, :, None, :].expand(n, h, 2, w, 2, c)
            return nhwc.reshape(n, 2 * h, 2 * w, c).contiguous().permute(0, 3, 1, 2)
        return input[:, :, :, None, :, None].expand(n, c, h, 2, w, 2).reshape(n, c, 2 * h, 2 * w).contiguous()


class UpCatPadIfNeeded(UpCat):
    """MONAI's decoder block, padding the upsampled features only where their size differs from the skip's.

    ``UpCat`` replicate-pads the upsampled features before concatenating them with the skip connection, by one
    pixel along each axis whose size differs (odd sizes after max-pooling), and by zero pixels otherwise. The
    zero-pixel pad is still a copy of the whole tensor, and its backward a replication-pad backward: on a
    224 x 224 pre-training step (H100, NCHW) the fused pad + concatenation of the 4 blocks took 8.5 % of the GPU
    time and the pad's backward another 3.0 % (``tools/benchmark_pretrain.py --profile``). Here the pad runs
    only when a size differs, so the outputs are the same for every input size. No parameters of its own: the
    state dict is BasicUNet's."""

    def forward(self, x: torch.Tensor, x_e: torch.Tensor | None):
        upsampled = self.upsample(x)
        if x_e is None:
            return self.convs(upsampled)
        grow = [0] * (2 * (upsampled.ndim - 2))  # F.pad's order: last axis first, (before, after) per axis
        for axis in range(upsampled.ndim - 2):
            if x_e.shape[-axis - 1] != upsampled.shape[-axis - 1]:
                grow[2 * axis + 1] = 1
        if any(grow):
            upsampled = F.pad(upsampled, grow, mode="replicate")
        return self.convs(torch.cat([x_e, upsampled], dim=1))


def set_decoder_padding(net: BasicUNet, always: bool) -> BasicUNet:
    """Make the decoder blocks of ``net`` pad as MONAI's ``UpCat`` does (``always``: a pad even of zero
    pixels, kept for benchmarks) or only where a size differs (:class:`UpCatPadIfNeeded`, the default of
    :func:`build_unet`). Swaps the blocks' class in place (neither has state of its own) and returns ``net``."""
    target = UpCat if always else UpCatPadIfNeeded
    for module in net.modules():
        if isinstance(module, UpCat) and getattr(module, "is_pad", True):
            module.__class__ = target
    return net


DENSE_LEVELS = {1: "upcat_1", 2: "upcat_2", 3: "upcat_3", 4: "upcat_4"}


def check_dense_level(dense_level) -> int:
    """``dense_level`` as an int, or a ValueError saying what is expected."""
    if isinstance(dense_level, bool) or dense_level not in DENSE_LEVELS:
        raise ValueError(f"dense_level must be one of {sorted(DENSE_LEVELS)} (the decoder block upcat_<level> the "
                         f"dense embedding is taken from; 1, the last, is the paper's), got {dense_level!r}")
    return int(dense_level)


def dense_channels(features: Sequence[int], dense_level: int = 1) -> int:
    """Channels of the decoder block ``upcat_<dense_level>`` of a U-Net of widths ``features``: the last block
    (``upcat_1``, full resolution) has ``features[5]``; ``upcat_k`` for k = 2, 3, 4 (1/2, 1/4, 1/8 resolution) has
    the width of encoder level k - 1."""
    k = check_dense_level(dense_level)
    return int(features[5] if k == 1 else features[k - 1])


def backbone_state_dict(net: BasicUNet) -> dict[str, torch.Tensor]:
    """A U-Net's weights without its ``final_conv``: the ``model.pt`` pre-training runs wrote before pretrain_bim 0.3.0
    (fine-tuning still loads them; since 0.3.0 ``model.pt`` is a :class:`bim.pretrain.model.BIMClusterNet`'s)."""
    return {k: v.detach().cpu() for k, v in net.state_dict().items() if not k.startswith("final_conv.")}


def unet_style_of(state_dict: Mapping[str, torch.Tensor]) -> str | None:
    """The style (:data:`UNET_STYLES`) of the :func:`build_unet` U-Net whose weights ``state_dict`` holds, read from its
    decoder's upsampling weights: ``upcat_<k>.upsample.deconv.weight`` (2x2 transposed conv) is "monai",
    ``upcat_<k>.upsample.1.weight`` (3x3 conv, :func:`authors_upsample`) "authors". Any prefix of the names is fine
    (``module.``, ``_orig_mod.``, ``unet.``, ``cluster_net.unet.`` of a pre-training checkpoint ...). None when it
    holds no such weight (no U-Net of this project); a ``ValueError`` when it holds both styles."""
    found = set()
    for key, value in state_dict.items():
        match = _UPSAMPLE_WEIGHT.search(str(key))
        if match is None or not isinstance(value, torch.Tensor) or value.ndim != 4:
            continue
        style, kernel = _UPSAMPLE_STYLE[match.group(1)]
        if tuple(value.shape[-2:]) == kernel:
            found.add(style)
    if len(found) > 1:
        raise ValueError("the weights hold U-Nets of both styles (monai and authors decoder blocks)")
    return found.pop() if found else None


def unet_features_of(state_dict: Mapping[str, torch.Tensor]) -> list[int] | None:
    """The 6 widths (``features`` of :func:`build_unet`) of the U-Net whose weights ``state_dict`` holds, under any
    prefix of the names, as :func:`unet_style_of`; None when a width tensor is missing; a ``ValueError`` when it holds
    U-Nets of different widths."""
    first = _WIDTH_TENSORS[0]
    prefixes = {k[: len(k) - len(first)] for k in map(str, state_dict) if k == first or k.endswith("." + first)}
    found = set()
    for prefix in prefixes:
        tensors = [state_dict.get(prefix + name) for name in _WIDTH_TENSORS]
        if all(isinstance(t, torch.Tensor) and t.ndim == 4 for t in tensors):
            found.add(tuple(int(t.shape[0]) for t in tensors))
    if len(found) > 1:
        raise ValueError(f"the weights hold U-Nets of different widths: {sorted(found)}")
    return list(found.pop()) if found else None


def to_channels_last(network: nn.Module, enabled: bool = True) -> nn.Module:
    """``network`` in channels_last memory format when ``enabled`` and off the CPU (on CUDA the tensor cores'
    layout: in NCHW, cuDNN converts every bf16 convolution's tensors to NHWC and back); as is otherwise (on the CPU,
    channels_last convolutions bring nothing here). The bundles' ``channels_last`` key."""
    param = next(network.parameters(), None)
    if as_flag(enabled, "channels_last") and param is not None and param.device.type != "cpu":
        network.to(memory_format=torch.channels_last)
    return network
