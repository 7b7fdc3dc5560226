"""Argument checks and NaN-safe reduction helpers shared by the objectives (torch only).

Every check raises with the function name, the argument name, the offending value and what was
expected, so a bad call fails at the boundary instead of deep inside torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

Tensor = torch.Tensor


def require_tensor(fn: str, name: str, x: object) -> Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{fn}: {name} must be a torch.Tensor, got {type(x).__name__}")
    return x


def require_float_tensor(fn: str, name: str, x: object) -> Tensor:
    t = require_tensor(fn, name, x)
    if not t.is_floating_point():
        raise ValueError(f"{fn}: {name} must be a floating-point tensor, got dtype {t.dtype}")
    return t


def require_min_dim(fn: str, name: str, x: Tensor, ndim: int) -> Tensor:
    if x.dim() < ndim:
        raise ValueError(
            f"{fn}: {name} must have at least {ndim} dim(s), got shape {tuple(x.shape)}"
        )
    return x


def require_number(
    fn: str,
    name: str,
    value: object,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
) -> float:
    """A finite real scalar (python number or 0-d tensor) within [low, high] (or (low, high])."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{fn}: {name} must be a scalar, got shape {tuple(value.shape)}")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{fn}: {name} must be a real number, got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"{fn}: {name} must be finite, got {value!r}")
    if low is not None and (v <= low if low_open else v < low):
        bound = f"> {low}" if low_open else f">= {low}"
        raise ValueError(f"{fn}: {name} must be {bound}, got {value!r}")
    if high is not None and v > high:
        raise ValueError(f"{fn}: {name} must be <= {high}, got {value!r}")
    return v


def require_int(fn: str, name: str, value: object, *, low: int) -> int:
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
        value = int(value.item())
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{fn}: {name} must be an int, got {value!r}")
    if value < low:
        raise ValueError(f"{fn}: {name} must be >= {low}, got {value}")
    return value


def require_broadcast(fn: str, names: Sequence[str], *xs: Tensor) -> torch.Size:
    try:
        return torch.broadcast_shapes(*(x.shape for x in xs))
    except RuntimeError:
        shapes = ", ".join(f"{n}{tuple(x.shape)}" for n, x in zip(names, xs, strict=True))
        raise ValueError(f"{fn}: shapes do not broadcast: {shapes}") from None


def require_same_shape(fn: str, a_name: str, a: Tensor, b_name: str, b: Tensor) -> None:
    if a.shape != b.shape:
        raise ValueError(
            f"{fn}: {a_name} and {b_name} must have the same shape, "
            f"got {tuple(a.shape)} and {tuple(b.shape)}"
        )


def normalize_axis(fn: str, x: Tensor, axis: int | Sequence[int] | None) -> tuple[int, ...] | None:
    """Check `axis` (int, tuple of ints or None) against x.dim(); return it as a tuple."""
    if axis is None:
        return None
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    nd = max(x.dim(), 1)
    for a in axes:
        if isinstance(a, bool) or not isinstance(a, int) or not -nd <= a < nd:
            raise ValueError(
                f"{fn}: axis must be None, an int or a tuple of ints in [{-nd}, {nd - 1}] "
                f"for an input of shape {tuple(x.shape)}, got {axis!r}"
            )
    if len({a % nd for a in axes}) != len(axes):
        raise ValueError(f"{fn}: axis has repeated dims: {axis!r}")
    return axes


def masked_values(values: Tensor, mask: Tensor) -> Tensor:
    """values * mask, with masked slots exactly 0 even when values holds NaN/inf there."""
    weighted = values * mask
    return torch.where(mask != 0, weighted, torch.zeros_like(weighted))


def safe_div(num: Tensor, den: Tensor) -> Tensor:
    """num / den, 0 where den == 0 (an empty reduction is 0, never NaN; NaN-free gradient)."""
    empty = den == 0
    ratio = num / torch.where(empty, torch.ones_like(den), den)
    return torch.where(empty, torch.zeros_like(ratio), ratio)


def plain_mean(x: Tensor) -> Tensor:
    """Mean over all elements; 0.0 for an empty tensor (torch gives NaN)."""
    if x.numel() == 0:
        return x.sum()
    return x.mean()


def check_labels(fn: str, logits: Tensor, labels: Tensor, ignore_index: int | None = None) -> None:
    """labels: integer tensor of shape logits.shape[:-1] with values in [0, V) (or ignore_index)."""
    require_tensor(fn, "labels", labels)
    if labels.is_floating_point() or labels.dtype == torch.bool or labels.is_complex():
        raise ValueError(f"{fn}: labels must be an integer tensor, got dtype {labels.dtype}")
    if labels.shape != logits.shape[:-1]:
        raise ValueError(
            f"{fn}: labels must have shape logits.shape[:-1] = {tuple(logits.shape[:-1])}, "
            f"got {tuple(labels.shape)}"
        )
    vocab = logits.shape[-1]
    valid = labels if ignore_index is None else labels[labels != ignore_index]
    if valid.numel() and (int(valid.min()) < 0 or int(valid.max()) >= vocab):
        bad = valid[(valid < 0) | (valid >= vocab)][0].item()
        extra = "" if ignore_index is None else f" (or ignore_index={ignore_index})"
        raise ValueError(f"{fn}: labels must lie in [0, {vocab}){extra}, found {bad}")
