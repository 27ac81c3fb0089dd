"""Projection heads of the BIM pre-training bundle.

* :class:`ClusterHead` - the dense cluster projection ``g``: 1x1 conv 32 -> K + K-way softmax on the
  last decoder block (``upconv2``); the authors use several such sub-heads and average L_MI over them.
* :class:`GlobalProjector` - projector of the encoder output (``conv5``) for the global
  contrastive loss: global average pool -> Linear -> LeakyReLU(0.01) -> Linear -> L2 normalisation.
* :class:`DenseProjector` - dense projector of the local contrastive baseline (Chaitanya et al.
  2020): adaptive average pool to g x g -> 1x1 conv -> LeakyReLU -> 1x1 conv -> L2 normalisation.

Softmax and normalisation run in fp32 (autocast disabled) so the heads can sit under bf16 autocast.
"""

from __future__ import annotations

import contextlib
from typing import List

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["ClusterHead", "GlobalProjector", "DenseProjector"]


def _fp32_context(x: torch.Tensor):
    try:
        return torch.autocast(device_type=x.device.type, enabled=False)
    except (RuntimeError, ValueError):
        return contextlib.nullcontext()


def _check_positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: expected a positive int, got {value!r}")


def _check_input(x, channels: int, ndims=(4,)) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() not in ndims or x.shape[1] != channels:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x: expected a tensor [B, {channels}, H, W], got {shape}")


class ClusterHead(nn.Module):
    """Dense cluster projection: per sub-head a 1x1 conv ``in_channels -> num_clusters`` + softmax.

    Args:
        in_channels: channels of the dense embedding (32 for ``upconv2``).
        num_clusters: K (40 in the paper).
        num_subheads: number of independent heads (authors: 3; the loss is averaged over them).

    Forward:
        ``x`` ``[B, in_channels, H, W]`` -> list of ``num_subheads`` probability maps
        ``[B, K, H, W]`` (softmax over K computed in fp32).
    """

    def __init__(self, in_channels: int = 32, num_clusters: int = 40, num_subheads: int = 1) -> None:
        super().__init__()
        _check_positive_int("in_channels", in_channels)
        _check_positive_int("num_clusters", num_clusters)
        _check_positive_int("num_subheads", num_subheads)
        self.in_channels = in_channels
        self.num_clusters = num_clusters
        self.heads = nn.ModuleList(
            nn.Conv2d(in_channels, num_clusters, kernel_size=1) for _ in range(num_subheads)
        )

    @torch.jit.unused  # eager only; a TorchScript export of a network holding the head uses ``heads`` (logits)
    def forward(self, x: torch.Tensor) -> List[torch.Tensor]:
        _check_input(x, self.in_channels)
        outputs = []
        for head in self.heads:
            logits = head(x)
            with _fp32_context(logits):
                outputs.append(torch.softmax(logits.float(), dim=1))
        return outputs


class GlobalProjector(nn.Module):
    """Global projector: avg pool -> Linear -> LeakyReLU(0.01) -> Linear -> L2 normalisation.

    Args:
        in_channels: channels of the encoder output (512 for ``conv5``).
        hidden: hidden width (256).
        out: output dimension (256).

    Forward:
        ``x`` ``[B, in_channels, H, W]`` (or already pooled ``[B, in_channels]``) -> ``[B, out]``
        with unit L2 norm (fp32).
    """

    def __init__(self, in_channels: int = 512, hidden: int = 256, out: int = 256) -> None:
        super().__init__()
        _check_positive_int("in_channels", in_channels)
        _check_positive_int("hidden", hidden)
        _check_positive_int("out", out)
        self.in_channels = in_channels
        self.mlp = nn.Sequential(
            nn.Linear(in_channels, hidden),
            nn.LeakyReLU(0.01),
            nn.Linear(hidden, out),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_input(x, self.in_channels, ndims=(2, 4))
        if x.dim() == 4:
            x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        z = self.mlp(x)
        with _fp32_context(z):
            return F.normalize(z.float(), dim=1)


class DenseProjector(nn.Module):
    """Dense projector of the local contrastive baseline.

    adaptive avg pool to ``grid x grid`` -> 1x1 conv -> LeakyReLU(0.01) -> 1x1 conv -> L2
    normalisation over channels.

    Args:
        in_channels: channels of the dense embedding (32).
        hidden: hidden width (64).
        out: output channels (64).
        grid: pooled spatial size g (20).

    Forward:
        ``x`` ``[B, in_channels, H, W]`` -> ``[B, out, grid, grid]`` with unit norm over channels
        at every grid position (fp32).
    """

    def __init__(self, in_channels: int = 32, hidden: int = 64, out: int = 64, grid: int = 20) -> None:
        super().__init__()
        _check_positive_int("in_channels", in_channels)
        _check_positive_int("hidden", hidden)
        _check_positive_int("out", out)
        _check_positive_int("grid", grid)
        self.in_channels = in_channels
        self.grid = grid
        self.pool = nn.AdaptiveAvgPool2d(grid)
        self.mlp = nn.Sequential(
            nn.Conv2d(in_channels, hidden, kernel_size=1),
            nn.LeakyReLU(0.01),
            nn.Conv2d(hidden, out, kernel_size=1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_input(x, self.in_channels)
        z = self.mlp(self.pool(x))
        with _fp32_context(z):
            return F.normalize(z.float(), dim=1)
