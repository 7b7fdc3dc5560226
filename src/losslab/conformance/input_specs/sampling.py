"""Input specs for `losslab.objectives.sampling`: top-k / top-p masks and argmax."""

from __future__ import annotations

import torch

from losslab.conformance.input_specs._shared import (
    Args,
    Draw,
    _e,
    _int_ties,
    _spec,
)


def _top_p_random(d: Draw) -> Args:
    b, v = d.int(1, 3), d.int(2, 8)
    return torch.softmax(d.randn(b, v, scale=1.5), -1), d.uniform(0.05, 0.95, digits=2)


_spec(
    "top_p_mask",
    _top_p_random,
    _e(
        "dyadic-boundary",
        lambda d: (torch.tensor([[0.5, 0.25, 0.25], [0.25, 0.5, 0.25]]), 0.5),
        "cumsum exactly = p: keep-crossing vs HF rule",
    ),
    _e("uniform", lambda d: (torch.full((1, 4), 0.25), 0.5), "ties at the cut"),
    _e("p=1", lambda d: (torch.tensor([[0.5, 0.25, 0.125, 0.125]]), 1.0), "p = 1"),
    _e("p=0", lambda d: (torch.tensor([[0.125, 0.5, 0.25, 0.125]]), 0.0), "p = 0", may_raise=True),
    _e("1-D", lambda d: (torch.tensor([0.125, 0.375, 0.5]), 0.5), "1-D probs, dyadic"),
)


def _top_k_random(d: Draw) -> Args:
    b, v = d.int(1, 3), d.int(2, 8)
    return d.randn(b, v), d.int(1, v)


_spec(
    "top_k_mask",
    _top_k_random,
    _e(
        "ties",
        lambda d: (torch.tensor([[3.0, 1.0, 3.0, 2.0, 3.0], [1.0, 2.0, 2.0, 0.0, 0.0]]), 2),
        "ties at the k-th value: exactly k vs everything >= k-th",
    ),
    _e("k=V", lambda d: (d.randn(2, 4), 4), "k = V"),
    _e("k=0", lambda d: (d.randn(2, 4), 0), "k = 0", may_raise=True),
    _e("k>V", lambda d: (d.randn(2, 4), 6), "k > V", may_raise=True),
    _e("1-D", lambda d: (d.randn(6), 3), "1-D logits"),
)


def _argmax_random(d: Draw) -> Args:
    shape = (d.int(1, 4), d.int(2, 7)) if d.flag() else (d.int(1, 3), d.int(1, 4), d.int(2, 6))
    return (d.randn(*shape),)


_spec(
    "argmax_tokens",
    _argmax_random,
    _e("ties", lambda d: (_int_ties(d, 3, 5),), "ties: first index?"),
    _e("1-D", lambda d: (d.randn(7),), "1-D logits"),
    _e("all-equal", lambda d: (torch.zeros(2, 4),), "a constant row"),
)
