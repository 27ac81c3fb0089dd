"""Float tolerances that follow the arithmetic, not one machine.

A result computed along another path (another summation order or blocking, a batched or scripted kernel, a mean
recomputed from values that are already equal) differs from the reference by rounding errors. Each rounded sum of
``terms`` values is off by at most about ``terms * eps`` of its magnitude, and normalisation layers spread such errors
over a whole tensor, so the bound is relative to the tensor's scale (its largest magnitude), not to each element (an
element near zero gets the same absolute error) and not a fixed absolute number that one machine happened to meet.
"""

from __future__ import annotations

import math

import torch


def rounding_tolerance(expected: torch.Tensor, terms: int) -> float:
    """``terms`` x the dtype's eps x max |expected|: the rounding bound of sums of ``terms`` values at that scale."""
    return float(terms) * torch.finfo(expected.dtype).eps * float(expected.detach().abs().max())


def assert_close_to_scale(actual: torch.Tensor, expected: torch.Tensor, terms: int, what: str = "") -> None:
    """max |actual - expected| <= rounding_tolerance(expected, terms); the message gives both numbers."""
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    diff = float((actual.detach() - expected.detach()).abs().max())
    tol = rounding_tolerance(expected, terms)
    assert diff <= tol, (
        f"{what}: max |difference| {diff:.3g} exceeds {tol:.3g} = {terms} terms x eps "
        f"{torch.finfo(expected.dtype).eps:.3g} x max |value| {float(expected.abs().max()):.3g}"
    )


def conv_reduction_length(net: torch.nn.Module) -> int:
    """The longest sum one output of ``net``'s convolutions adds up: in-channels per group x kernel size."""
    return max(m.in_channels // m.groups * math.prod(m.kernel_size)
               for m in net.modules() if isinstance(m, torch.nn.modules.conv._ConvNd))
