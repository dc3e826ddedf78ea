"""Comparisons of tensors computed along two fp32 paths.

Two ways of computing the same gradient (a scaled advantage against a weighted one, one large batch
against accumulated micro-batches) round differently, and how much depends on the machine's vector
width (AVX2 against AVX-512 sums in different orders). An element-wise ``atol`` smaller than the
rounding of the tensor's largest entries then fails on one machine and passes on another; so compare
each difference with the scale of the tensor it belongs to."""

from __future__ import annotations

import torch


def scaled_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``max |actual - expected| / max |expected|`` (0 for two zero tensors)."""
    scale = float(expected.abs().max()) if expected.numel() else 0.0
    diff = float((actual.double() - expected.double()).abs().max()) if expected.numel() else 0.0
    if scale == 0.0:
        return diff
    return diff / scale


def assert_close_to_scale(actual: torch.Tensor, expected: torch.Tensor, rel: float, what: str = "") -> None:
    """Every element within ``rel`` of ``expected``'s largest magnitude."""
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    err = scaled_error(actual, expected)
    assert err <= rel, f"{what}: max difference {err:.3g} of the tensor's scale (allowed {rel:g})"
