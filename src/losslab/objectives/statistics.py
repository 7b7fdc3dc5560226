"""Small statistics and index utilities. Reductions here are GLOBAL over all elements (a 2-D
input is flattened), never per row, unless the docstring says "along the last dim" or "dim 0"."""

from __future__ import annotations

import torch

from losslab.objectives._checks import (
    require_int,
    require_min_dim,
    require_number,
    require_tensor,
)

Tensor = torch.Tensor


def _require_nonempty(fn: str, name: str, x: Tensor) -> None:
    if x.numel() == 0:
        raise ValueError(f"{fn}: {name} must have at least one element, got shape {tuple(x.shape)}")


def mode_label(labels):
    """Most frequent value over all elements (0-d, labels' dtype). Ties go to the LARGEST value
    (torch.mode picks the smallest)."""
    fn = "mode_label"
    require_tensor(fn, "labels", labels)
    _require_nonempty(fn, "labels", labels)
    vals, counts = torch.unique(labels.flatten(), return_counts=True)
    return vals[counts == counts.max()].max()


def _quantile_lower(x: Tensor, q: float) -> Tensor:
    """Element at sorted index floor(q·(n-1)) of the flattened x (torch 'lower' interpolation)."""
    flat = x.flatten()
    if flat.is_floating_point():
        return torch.quantile(flat, q, interpolation="lower")
    # integer input: 'lower' selects an element, so float64 is exact for |x| < 2**53
    return torch.quantile(flat.double(), q, interpolation="lower").to(x.dtype)


def median_reward(rewards):
    """Median over all elements with linear interpolation (numpy.median): an even count gives the
    mean of the two middle values (torch.median gives the lower one). Integer input -> float."""
    fn = "median_reward"
    require_tensor(fn, "rewards", rewards)
    _require_nonempty(fn, "rewards", rewards)
    flat = rewards.flatten()
    if not flat.is_floating_point():
        flat = flat.to(torch.get_default_dtype())
    return torch.quantile(flat, 0.5)


def quantile_lower(x, q):
    """q-quantile with 'lower' rank rule: sorted(x)[floor(q·(n-1))], over all elements (0-d)."""
    fn = "quantile_lower"
    require_tensor(fn, "x", x)
    _require_nonempty(fn, "x", x)
    qq = require_number(fn, "q", q, low=0.0, high=1.0)
    return _quantile_lower(x, qq)


def pad_mask_from_lengths(lengths, max_len):
    """float32 (B, max_len) mask: 1.0 where position < length. 0-d lengths give (max_len,).

    lengths must be whole numbers in [0, max_len].
    """
    fn = "pad_mask_from_lengths"
    require_tensor(fn, "lengths", lengths)
    n = require_int(fn, "max_len", max_len, low=0)
    if lengths.numel():
        if lengths.is_floating_point() and not bool((lengths == lengths.round()).all()):
            raise ValueError(f"{fn}: lengths must be whole numbers, got {lengths.tolist()}")
        lo, hi = lengths.min().item(), lengths.max().item()
        if lo < 0 or hi > n:
            raise ValueError(f"{fn}: lengths must lie in [0, max_len={n}], got min {lo}, max {hi}")
    positions = torch.arange(n, device=lengths.device)
    return (positions < lengths.unsqueeze(-1)).to(torch.float32)


def first_nonzero_index(mask):
    """Index of the first nonzero (!= 0) entry along the last dim, -1 if none; int64.
    1-D input gives 0-d."""
    fn = "first_nonzero_index"
    require_tensor(fn, "mask", mask)
    require_min_dim(fn, "mask", mask, 1)
    nonzero = mask != 0
    if mask.shape[-1] == 0:
        return torch.full(mask.shape[:-1], -1, dtype=torch.int64, device=mask.device)
    # argmax of a 0/1 int tensor returns the first maximal index
    idx = nonzero.to(torch.int64).argmax(dim=-1)
    return torch.where(nonzero.any(dim=-1), idx, torch.full_like(idx, -1))


def cumulative_max(x):
    """Running max along dim 0, SHIFTED by one: out[0] = x[0], out[t] = max(x[0..t-1]) for t >= 1."""
    fn = "cumulative_max"
    require_tensor(fn, "x", x)
    require_min_dim(fn, "x", x, 1)
    if x.shape[0] == 0:
        return x.clone()
    running = torch.cummax(x, dim=0).values
    return torch.cat([x[:1], running[:-1]], dim=0)


def bucketize_reward(rewards, boundaries):
    """Number of boundaries <= reward (torch.bucketize(right=True) = bisect_right = np.digitize),
    int64. boundaries: 1-D, sorted ascending."""
    fn = "bucketize_reward"
    require_tensor(fn, "rewards", rewards)
    require_tensor(fn, "boundaries", boundaries)
    if boundaries.dim() != 1:
        raise ValueError(f"{fn}: boundaries must be 1-D, got shape {tuple(boundaries.shape)}")
    if boundaries.numel() > 1 and not bool((boundaries[1:] >= boundaries[:-1]).all()):
        raise ValueError(f"{fn}: boundaries must be sorted ascending, got {boundaries.tolist()}")
    return torch.bucketize(rewards, boundaries, right=True)
