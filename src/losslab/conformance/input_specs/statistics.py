"""Input specs for `losslab.objectives.statistics`: mode, median, quantiles, masks, buckets."""

from __future__ import annotations

import torch

from losslab.conformance.input_specs._shared import (
    Args,
    Draw,
    _e,
    _int_ties,
    _spec,
)


def _mode_random(d: Draw) -> Args:
    return (d.labels(d.int(2, 5), d.int(1, 12)),)


_spec(
    "mode_label",
    _mode_random,
    _e("tie-ascending", lambda d: (torch.tensor([1, 1, 2, 2]),), "tie: largest value wins"),
    _e("tie-descending", lambda d: (torch.tensor([5, 5, 1, 1, 3]),), "tie listed large first"),
    _e("all-distinct", lambda d: (torch.tensor([4, 0, 2, 3]),), "every value ties"),
    _e("2-D", lambda d: (torch.tensor([[1, 1, 2], [2, 3, 3]]),), "global vs per-row"),
    _e("negative", lambda d: (torch.tensor([-1, -1, 2, 0]),), "negative labels", may_raise=True),
    _e("single", lambda d: (torch.tensor([7]),), "one label"),
)


def _median_random(d: Draw) -> Args:
    return (d.randn(d.int(1, 9)),)


_spec(
    "median_reward",
    _median_random,
    _e("even-n", lambda d: (d.randn(6),), "mean of the two middle values"),
    _e("2-D", lambda d: (d.randn(3, 4),), "global vs per-row"),
    _e("int64", lambda d: (torch.tensor([1, 3, 2, 4]),), "integer rewards", may_raise=True),
    _e("n=1", lambda d: (d.randn(1),), "one reward"),
    _e("ties", lambda d: (torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 0.0]),), "binary rewards"),
)


def _quantile_random(d: Draw) -> Args:
    return d.randn(d.int(1, 12)), d.uniform(0.0, 1.0, digits=2)


_spec(
    "quantile_lower",
    _quantile_random,
    _e("q=0", lambda d: (d.randn(9), 0.0), "q = 0"),
    _e("q=1", lambda d: (d.randn(9), 1.0), "q = 1"),
    _e("nearest-rank-separator", lambda d: (d.randn(10), 0.91), "floor(q(n-1)) vs ceil(qn)-1"),
    _e("2-D", lambda d: (d.randn(3, 4), 0.5), "global vs last dim"),
    _e("n=1", lambda d: (d.randn(1), 0.3), "one value"),
    _e("ties", lambda d: (_int_ties(d, 8), 0.4), "repeated values"),
)


def _pad_random(d: Draw) -> Args:
    max_len = d.int(0, 6)
    return torch.randint(0, max_len + 1, (d.int(1, 5),), generator=d.g), max_len


_spec(
    "pad_mask_from_lengths",
    _pad_random,
    _e(
        "length>max_len", lambda d: (torch.tensor([2, 7, 4]), 4), "length > max_len", may_raise=True
    ),
    _e("all-zero", lambda d: (torch.zeros(3, dtype=torch.long), 3), "every length 0"),
    _e("0-d-lengths", lambda d: (torch.tensor(2), 4), "0-d lengths", may_raise=True),
    _e("max_len=0", lambda d: (torch.tensor([0, 0]), 0), "max_len = 0"),
)


def _fnz_random(d: Draw) -> Args:
    shape = (d.int(1, 8),) if d.flag() else (d.int(1, 4), d.int(1, 6))
    return (d.mask(*shape, keep=0.3),)


_spec(
    "first_nonzero_index",
    _fnz_random,
    _e("all-zero", lambda d: (torch.zeros(3, 4),), "-1 everywhere"),
    _e(
        "non-binary",
        lambda d: (torch.tensor([[0.0, 0.5, 2.0, 0.0], [0.0, 0.0, -1.0, 3.0]]),),
        "argmax on raw values would differ",
    ),
    _e("bool", lambda d: (d.mask(2, 5, keep=0.3) > 0,), "bool mask"),
    _e("1-D", lambda d: (torch.tensor([0.0, 0.0, 1.0, 1.0]),), "1-D gives 0-d"),
)


def _cummax_random(d: Draw) -> Args:
    t = d.int(1, 7)
    return (d.randn(t) if d.flag() else d.randn(t, d.int(1, 3)),)


_spec(
    "cumulative_max",
    _cummax_random,
    _e("T=1", lambda d: (d.randn(1, 3),), "T = 1"),
    _e("3-D", lambda d: (d.randn(4, 2, 3),), "3-D, along dim 0"),
    _e("ties", lambda d: (_int_ties(d, 6, 2),), "repeated values"),
    _e("decreasing", lambda d: (torch.tensor([5.0, 4.0, 3.0, 2.0]),), "max stays at x[0]"),
)


def _bucket_random(d: Draw) -> Args:
    shape = (d.int(1, 8),) if d.flag() else (d.int(1, 3), d.int(1, 4))
    boundaries, _ = torch.sort(d.randn(d.int(1, 5)))
    return d.randn(*shape), boundaries


_spec(
    "bucketize_reward",
    _bucket_random,
    _e(
        "on-boundaries",
        lambda d: (
            torch.tensor([-0.1, 0.0, 0.3, 0.5, 0.7, 1.0, 2.0]),
            torch.tensor([0.0, 0.5, 1.0]),
        ),
        "rewards exactly on boundaries: right=True vs False",
    ),
    _e(
        "outside",
        lambda d: (torch.tensor([-5.0, 5.0]), torch.tensor([-1.0, 1.0])),
        "below all / above all",
    ),
    _e("2-D", lambda d: (torch.tensor([[0.0, 1.0], [0.5, 2.0]]), torch.tensor([0.0, 1.0])), "2-D"),
    _e(
        "duplicate-boundaries",
        lambda d: (torch.tensor([-1.0, 0.0, 0.5, 1.0]), torch.tensor([0.0, 0.0, 1.0])),
        "repeated boundary",
    ),
)
