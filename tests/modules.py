"""Small modules the tests build."""

from __future__ import annotations

import torch


class TrainCounted(torch.nn.Module):
    """A 1x1 convolution whose ``train`` does more than set flags: it counts its calls."""

    def __init__(self, out_channels: int = 1) -> None:
        super().__init__()
        self.conv, self.calls = torch.nn.Conv2d(1, out_channels, 1), 0

    def train(self, mode: bool = True):
        self.calls += 1
        return super().train(mode)

    def forward(self, x):
        return self.conv(x)
