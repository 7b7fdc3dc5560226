"""Masked reductions and numerically stable softmax helpers.

Conventions (see docs/conventions.md): a mask is a weight tensor broadcastable with the values
(bool or float, usually 0/1); masked slots never contribute, even when they hold NaN or inf; an
empty reduction (mask sums to 0) is 0.0, never NaN.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from losslab.objectives._checks import (
    masked_values,
    normalize_axis,
    require_broadcast,
    require_tensor,
    safe_div,
)

Tensor = torch.Tensor
Axis = int | Sequence[int] | None


def _as_weights(values: Tensor, mask: Tensor) -> Tensor:
    dtype = values.dtype if values.is_floating_point() else torch.get_default_dtype()
    return mask.to(dtype)


def _reduce_sum(x: Tensor, axes: tuple[int, ...] | None) -> Tensor:
    return x.sum() if axes is None else x.sum(dim=axes)


def masked_sum(values, mask, axis=None):
    """Σ(values·mask), over every element (axis=None, 0-d result) or along `axis`.

    Masked slots (mask == 0) contribute exactly 0 even if they hold NaN/inf.
    """
    fn = "masked_sum"
    require_tensor(fn, "values", values)
    require_tensor(fn, "mask", mask)
    shape = require_broadcast(fn, ("values", "mask"), values, mask)
    axes = normalize_axis(fn, torch.empty(shape, device="meta"), axis)
    return _reduce_sum(masked_values(values, _as_weights(values, mask)), axes)


def masked_mean(values, mask, axis=None):
    """Σ(values·mask) / Σmask, globally (axis=None, 0-d) or along `axis` (int or tuple).

    An empty mask (or a fully masked row when `axis` is given) gives 0.0, not NaN, and a
    NaN-free gradient. Soft (non-binary) masks act as weights.
    """
    fn = "masked_mean"
    require_tensor(fn, "values", values)
    require_tensor(fn, "mask", mask)
    shape = require_broadcast(fn, ("values", "mask"), values, mask)
    axes = normalize_axis(fn, torch.empty(shape, device="meta"), axis)
    weights = _as_weights(values, mask)
    num = _reduce_sum(masked_values(values, weights), axes)
    den = _reduce_sum(weights.expand(shape), axes)
    return safe_div(num, den)


def masked_max(values, mask):
    """Max of values over masked-in elements, global over all dims (0-d); 0.0 if the mask is empty."""
    fn = "masked_max"
    require_tensor(fn, "values", values)
    require_tensor(fn, "mask", mask)
    shape = require_broadcast(fn, ("values", "mask"), values, mask)
    keep = (mask != 0).expand(shape)
    if not bool(keep.any()):
        # connected to the graph (zero gradient) and NaN-free even if masked slots hold NaN
        return torch.where(keep, values, torch.zeros_like(values)).sum()
    return values.expand(shape)[keep].max()


def logsumexp(x, axis):
    """log Σ exp(x) along `axis` (torch.logsumexp; a row of all -inf gives -inf)."""
    fn = "logsumexp"
    require_tensor(fn, "x", x)
    if axis is None:
        raise ValueError(f"{fn}: axis must be an int or tuple of ints, got None")
    axes = normalize_axis(fn, x, axis)
    return torch.logsumexp(x, dim=axes)


def log_softmax(x, axis):
    """x - logsumexp(x, axis) along one `axis` (torch.log_softmax)."""
    fn = "log_softmax"
    require_tensor(fn, "x", x)
    if not isinstance(axis, int) or isinstance(axis, bool):
        raise ValueError(f"{fn}: axis must be an int, got {axis!r}")
    normalize_axis(fn, x, axis)
    return torch.log_softmax(x, dim=axis)
