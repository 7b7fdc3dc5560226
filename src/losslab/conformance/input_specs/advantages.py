"""Input specs for `losslab.objectives.advantages`: group baselines, returns, whitening."""

from __future__ import annotations

from typing import Any

import torch

from losslab.conformance.input_specs._shared import (
    Args,
    Build,
    Draw,
    EdgeCase,
    Tensor,
    _call,
    _e,
    _spec,
)


def _group_rewards(d: Draw) -> tuple[Tensor, int]:
    g, n = d.int(2, 4), d.int(1, 4)
    rewards = d.mask(n * g, keep=0.5) if d.flag() else d.randn(n * g)
    return rewards, g


def _group_edges(with_scale: bool) -> list[EdgeCase]:
    """Edge cases shared by grpo_advantages / rloo_advantages / group_mean_baseline."""
    s: tuple[Any, ...] = (True,) if with_scale else ()

    def constant(d: Draw) -> Args:
        r = d.randn(6)
        r[:3] = 0.75  # first group constant: std = 0
        return (r, 3, *s)

    def tiny(d: Draw) -> Args:
        return (1.0 + d.randn(8, scale=1e-4), 4, *s)

    return [
        EdgeCase("binary-rewards", lambda d: (d.mask(12, keep=0.5), 4, *s), "0/1 rewards, ties"),
        EdgeCase("constant-group", constant, "a group with zero spread"),
        EdgeCase("tiny-variance", tiny, "std ~1e-4: eps inside vs outside the sqrt"),
        EdgeCase("G=1", lambda d: (d.randn(4), 1, *s), "singleton groups", may_raise=True),
        EdgeCase("G=N", lambda d: (d.randn(5), 5, *s), "one group"),
        EdgeCase(
            "G-not-dividing-N", lambda d: (d.randn(7), 3, *s), "7 rewards, G=3", may_raise=True
        ),
        EdgeCase("2-D-rewards", lambda d: (d.randn(3, 4), 4, *s), "(n_groups, G) input"),
    ]


def _returns_random(function: str) -> Build:
    """gae / lambda_returns (one signature), time on dim 0: (T,) + () or (T,B) + (B,)."""

    def build(d: Draw) -> Args:
        t = d.int(1, 7)
        shape: tuple[int, ...] = (t,) if d.flag() else (t, d.int(1, 3))
        next_value = d.randn(*shape[1:])
        gamma, lam = d.uniform(0.8, 1.0), d.uniform(0.8, 1.0)
        return _call(
            function,
            rewards=d.randn(*shape),
            values=d.randn(*shape),
            next_value=next_value,
            gamma=gamma,
            lam=lam,
        )

    return build


def _returns_edges(function: str) -> list[EdgeCase]:
    """Edge cases shared by gae / lambda_returns."""
    return [
        EdgeCase(
            "T=1",
            lambda d: _call(
                function,
                rewards=d.randn(1, 2),
                values=d.randn(1, 2),
                next_value=d.randn(2),
                gamma=0.9,
                lam=0.95,
            ),
            "T=1",
        ),
        EdgeCase(
            "gamma=lam=1",
            lambda d: _call(
                function,
                rewards=d.randn(5),
                values=d.randn(5),
                next_value=d.randn(),
                gamma=1.0,
                lam=1.0,
            ),
            "no discount",
        ),
        EdgeCase(
            "lam=0",
            lambda d: _call(
                function,
                rewards=d.randn(4, 2),
                values=d.randn(4, 2),
                next_value=d.randn(2),
                gamma=0.9,
                lam=0.0,
            ),
            "TD(0)",
        ),
        EdgeCase(
            "scalar-next-value-2-D",
            lambda d: _call(
                function,
                rewards=d.randn(4, 3),
                values=d.randn(4, 3),
                next_value=d.randn(),
                gamma=0.99,
                lam=0.95,
            ),
            "(T,B) input with a 0-d next_value",
            may_raise=True,
        ),
        EdgeCase(
            "T>B-layout",
            lambda d: _call(
                function,
                rewards=d.randn(6, 2),
                values=d.randn(6, 2),
                next_value=d.randn(2),
                gamma=0.97,
                lam=0.9,
            ),
            "(T,B) with T != B: time must run along dim 0",
        ),
    ]


def _whiten_random(d: Draw) -> Args:
    shape = (d.int(2, 10),) if d.flag() else (d.int(1, 3), d.int(2, 5))
    mask = d.mask(*shape, keep=0.7)
    mask.view(-1)[d.int(0, mask.numel() - 1)] = 1.0  # the empty mask is an edge case of its own
    return d.randn(*shape, scale=2.0) + 0.5, mask, d.flag()


def _whiten_edges() -> list[EdgeCase]:
    def one_unmasked(d: Draw) -> Args:
        mask = torch.zeros(6)
        mask[2] = 1.0
        return d.randn(6), mask, True

    return [
        EdgeCase(
            "tiny-variance",
            lambda d: (0.5 + d.randn(8, scale=1e-4), d.mask(8, keep=0.8), True),
            "σ ~1e-4: rsqrt(σ²+1e-8) vs 1/(σ+1e-8)",
        ),
        EdgeCase("2-D", lambda d: (d.randn(3, 5) + 1.0, d.mask(3, 5, keep=0.7), True), "global?"),
        EdgeCase(
            "empty-mask", lambda d: (d.randn(6), torch.zeros(6), True), "Σmask = 0", may_raise=True
        ),
        EdgeCase("one-unmasked", one_unmasked, "a single unmasked element (σ = 0)"),
        EdgeCase("no-shift", lambda d: (d.randn(7) + 2.0, d.mask(7), False), "shift_mean=False"),
        EdgeCase("constant", lambda d: (torch.full((5,), 1.5), torch.ones(5), True), "σ = 0"),
    ]


def _grpo_adv_random(d: Draw) -> Args:
    return (*_group_rewards(d), d.flag())


_spec(
    "grpo_advantages",
    _grpo_adv_random,
    *_group_edges(with_scale=True),
    _e("unscaled", lambda d: (d.randn(6), 3, False), "scale_by_std=False"),
)
_spec("gae", _returns_random("gae"), *_returns_edges("gae"))
_spec("whiten", _whiten_random, *_whiten_edges())


def _rloo_random(d: Draw) -> Args:
    return _group_rewards(d)


_spec("rloo_advantages", _rloo_random, *_group_edges(with_scale=False))


def _disc_random(d: Draw) -> Args:
    t = d.int(1, 7)
    shape = (t,) if d.flag() else (t, d.int(1, 3))
    return d.randn(*shape), d.uniform(0.8, 1.0)


_spec(
    "discounted_returns",
    _disc_random,
    _e("gamma=0", lambda d: (d.randn(5), 0.0), "no bootstrap"),
    _e("gamma=1", lambda d: (d.randn(4, 2), 1.0), "undiscounted"),
    _e("T=1", lambda d: (d.randn(1), 0.9), "T=1"),
    _e("3-D", lambda d: (d.randn(4, 2, 3), 0.95), "(T,B,K): time on dim 0"),
    _e("T!=B", lambda d: (d.randn(2, 5), 0.9), "(T,B) with T < B"),
)


def _normalize_random(d: Draw) -> Args:
    shape = (d.int(2, 10),) if d.flag() else (d.int(2, 3), d.int(2, 4))
    return d.randn(*shape, scale=2.0) + 1.0, d.choice([1e-8, 1e-5, 1e-2])


_spec(
    "normalize",
    _normalize_random,
    _e("tiny-variance", lambda d: (3.0 + d.randn(7, scale=1e-4), 1e-8), "std+eps vs sqrt(var+eps)"),
    _e("large-eps", lambda d: (d.randn(7), 0.1), "eps = 0.1"),
    _e("2-D", lambda d: (d.randn(3, 4) + d.randn(3, 1), 1e-8), "global vs per-row"),
    _e("n=1", lambda d: (d.randn(1), 1e-8), "unbiased std of one value", may_raise=True),
    _e("constant", lambda d: (torch.full((4,), 2.0), 1e-8), "std = 0"),
)
_spec("group_mean_baseline", _rloo_random, *_group_edges(with_scale=False))
_spec("lambda_returns", _returns_random("lambda_returns"), *_returns_edges("lambda_returns"))
_spec("masked_whiten", _whiten_random, *_whiten_edges())


def _adv_ms_random(d: Draw) -> Args:
    shape = d.shape()
    return d.randn(*shape) + 0.3, d.mask(*shape, keep=0.7)


def _single(d: Draw) -> Args:
    mask = torch.zeros(5)
    mask[3] = 1.0
    return d.randn(5), mask


_spec(
    "advantage_mean_std",
    _adv_ms_random,
    _e("empty-mask", lambda d: (d.randn(4), torch.zeros(4)), "Σmask = 0"),
    _e("single-element", _single, "one unmasked element"),
    _e("3-D", lambda d: (d.randn(2, 3, 2), d.mask(2, 3, 2)), "3-D, global"),
)
