"""Input specs for `losslab.objectives.reductions`: masked reductions, logsumexp, log_softmax."""

from __future__ import annotations

import math
from typing import Any

import torch

from losslab.conformance.input_specs._shared import (
    Args,
    Draw,
    _e,
    _spec,
)


def _masked_random(d: Draw) -> Args:
    """values, mask and a valid axis (None, int, negative int or tuple) for masked reductions."""
    shape = d.shape()
    values, mask = d.randn(*shape), d.mask(*shape)
    nd = len(shape)
    axes: list[Any] = [None, *range(nd), -1]
    if nd >= 2:
        axes.append(tuple(range(1, nd)))
    return values, mask, d.choice(axes)


def _row_masked(d: Draw) -> Args:
    values, mask = d.randn(3, 4), d.mask(3, 4, keep=0.8)
    mask[1] = 0.0
    return values, mask, 1


_spec(
    "masked_mean",
    _masked_random,
    _e("empty-mask", lambda d: (d.randn(6), torch.zeros(6), None), "Σmask = 0: 0, not NaN"),
    _e("default-axis", lambda d: (d.randn(2, 3), d.mask(2, 3)), "axis left at its default"),
    _e("masked-row-axis", _row_masked, "a fully masked row with axis=1"),
    _e("tuple-axis", lambda d: (d.randn(2, 3, 4), d.mask(2, 3, 4), (1, 2)), "axis=(1, 2)"),
    _e("negative-axis", lambda d: (d.randn(3, 5), d.mask(3, 5), -1), "axis=-1"),
    _e("bool-mask", lambda d: (d.randn(7), d.mask(7) > 0, None), "bool mask"),
    _e(
        "soft-mask-sum-below-1",
        lambda d: (d.randn(3), torch.tensor([0.25, 0.5, 0.0]), None),
        "Σmask = 0.75: where(den==0) vs clamp(min=1)",
    ),
)
_spec(
    "masked_sum",
    _masked_random,
    _e("empty-mask", lambda d: (d.randn(5), torch.zeros(5), None), "Σmask = 0"),
    _e("default-axis", lambda d: (d.randn(4), d.mask(4)), "axis left at its default"),
    _e("tuple-axis", lambda d: (d.randn(2, 3, 4), d.mask(2, 3, 4), (0, 2)), "axis=(0, 2)"),
    _e("negative-axis", lambda d: (d.randn(3, 5), d.mask(3, 5), -1), "axis=-1"),
)


def _lse_random(d: Draw) -> Args:
    shape = d.shape(max_len=6)
    return d.randn(*shape, scale=3.0), d.choice([*range(len(shape)), -1])


def _neg_inf_row(d: Draw) -> Args:
    x = d.randn(3, 4)
    x[0] = -math.inf
    return x, 1


def _some_neg_inf(d: Draw) -> Args:
    x = d.randn(3, 5)
    x[:, 1] = -math.inf
    return x, -1


_spec(
    "logsumexp",
    _lse_random,
    _e("all-neg-inf-row", _neg_inf_row, "a row that is entirely -inf", may_raise=True),
    _e("large-values", lambda d: (d.randn(2, 5, scale=1e4), -1), "overflow without max-shift"),
    _e("1-D", lambda d: (d.randn(6), 0), "1-D input"),
)
_spec(
    "log_softmax",
    _lse_random,
    _e("some-neg-inf", _some_neg_inf, "banned tokens (-inf)"),
    _e("large-values", lambda d: (d.randn(2, 5, scale=1e4), -1), "overflow without max-shift"),
    _e("ties", lambda d: (torch.zeros(2, 4), 1), "uniform rows"),
)


def _mmax_random(d: Draw) -> Args:
    shape = d.shape(max_dims=2)
    return d.randn(*shape), d.mask(*shape, keep=0.7)


_spec(
    "masked_max",
    _mmax_random,
    _e("empty-mask", lambda d: (d.randn(5), torch.zeros(5)), "Σmask = 0: 0"),
    _e("2-D", lambda d: (d.randn(3, 4), d.mask(3, 4, keep=0.7)), "global on 2-D"),
    _e(
        "all-negative",
        lambda d: (-1.0 - d.rand(6), torch.tensor([1.0, 0, 1, 0, 0, 1])),
        "values·mask would give 0",
    ),
)
