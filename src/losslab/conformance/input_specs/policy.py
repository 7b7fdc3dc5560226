"""Input specs for `losslab.objectives.policy`: clipped PG, value losses, composite objectives."""

from __future__ import annotations

import torch

from losslab.conformance.input_specs._shared import (
    Args,
    Build,
    Draw,
    Tensor,
    _call,
    _e,
    _spec,
)
from losslab.conformance.input_specs.kl import _extreme_pair, _logratio_pair


def _policy_logits(d: Draw, b: int, t: int, v: int, drift: float) -> Args:
    logits = d.randn(b, t, v, scale=2.0)
    old = logits + d.randn(b, t, v, scale=drift)
    return logits, old


def _pg_random(d: Draw, empty: bool = False) -> Args:
    b, t = d.int(1, 4), d.int(1, 6)
    logp = d.logprobs(b, t)
    old = logp + d.randn(b, t, scale=0.3)
    adv = d.randn(b, t) if d.flag() else d.randn(b, 1)  # per-token or per-sequence advantages
    mask = torch.zeros(b, t) if empty else d.mask(b, t, keep=0.7)
    return _call(
        "clipped_pg_loss",
        logp=logp,
        old_logp=old,
        advantages=adv,
        mask=mask,
        clip_low=d.uniform(0.1, 0.3),
        clip_high=d.uniform(0.1, 0.4),
    )


def _grpo_args(
    d: Draw,
    *,
    g: int,
    n: int,
    estimator: str,
    empty: bool = False,
    rewards: Tensor | None = None,
    drift: float = 0.5,
) -> Args:
    b, t, v = n * g, d.int(1, 4), d.int(2, 5)
    logits, old = _policy_logits(d, b, t, v, drift)
    ref = logits + d.randn(b, t, v)
    labels = d.labels(v, b, t)
    mask = torch.zeros(b, t) if empty else d.mask(b, t, keep=0.7)
    rewards = d.randn(b) if rewards is None else rewards
    beta, cl, ch = d.uniform(0.0, 0.1), d.uniform(0.1, 0.3), d.uniform(0.1, 0.4)
    return _call(
        "grpo_objective",
        logits=logits,
        old_logits=old,
        ref_logits=ref,
        labels=labels,
        completion_mask=mask,
        rewards=rewards,
        group_size=g,
        beta=beta,
        clip_low=cl,
        clip_high=ch,
        scale_by_std=d.flag(),
        kl_estimator=estimator,
    )


def _rloo_args(d: Draw, *, g: int, n: int, drift: float = 0.5, empty: bool = False) -> Args:
    b, t, v = n * g, d.int(1, 4), d.int(2, 5)
    logits, old = _policy_logits(d, b, t, v, drift)
    labels = d.labels(v, b, t)
    mask = torch.zeros(b, t) if empty else d.mask(b, t, keep=0.7)
    return _call(
        "rloo_objective",
        logits=logits,
        old_logits=old,
        labels=labels,
        mask=mask,
        rewards=d.randn(b),
        group_size=g,
        clip_low=d.uniform(0.1, 0.3),
        clip_high=d.uniform(0.1, 0.4),
    )


def _ppo_args(d: Draw, shape: tuple[int, ...], clips: tuple[float, float, float] | None) -> Args:
    rewards, values, old_values = d.randn(*shape), d.randn(*shape), d.randn(*shape, scale=0.3)
    old_values = values + old_values
    logp = d.logprobs(*shape)
    old_logp = logp + d.randn(*shape, scale=0.3)
    next_value = d.randn(*shape[1:])
    gamma, lam = d.uniform(0.9, 1.0), d.uniform(0.8, 1.0)
    cl, ch, vf = clips or (d.uniform(0.1, 0.3), d.uniform(0.1, 0.4), d.uniform(0.05, 0.5))
    return _call(
        "ppo_objective",
        rewards=rewards,
        values=values,
        old_values=old_values,
        logp=logp,
        old_logp=old_logp,
        next_value=next_value,
        gamma=gamma,
        lam=lam,
        clip_low=cl,
        clip_high=ch,
        vf_clip=vf,
        vf_coef=0.5,
    )


def _pg_big_ratio(d: Draw) -> Args:
    logp = torch.tensor([[-0.1, -0.5, -2.0, -0.2]])
    old = torch.tensor([[-2.0, -2.5, -0.1, -0.2]])  # ratios e^1.9, e^2, e^-1.9, 1
    adv = torch.tensor([[-1.0, 1.0, -1.0, 0.5]])  # A<0 with ratio > 3: dual-clip would cap it
    return _call(
        "clipped_pg_loss",
        logp=logp,
        old_logp=old,
        advantages=adv,
        mask=torch.ones(1, 4),
        clip_low=0.2,
        clip_high=0.28,
    )


_spec(
    "clipped_pg_loss",
    _pg_random,
    _e("empty-mask", lambda d: _pg_random(d, empty=True), "Σmask = 0"),
    _e("large-ratios", _pg_big_ratio, "ratio > 3 with A < 0 (dual-clip)"),
    _e(
        "on-policy",
        lambda d: _call(
            "clipped_pg_loss",
            logp=torch.full((2, 3), -1.0),
            old_logp=torch.full((2, 3), -1.0),
            advantages=d.randn(2, 3),
            mask=torch.ones(2, 3),
            clip_low=0.2,
            clip_high=0.2,
        ),
        "ratio exactly 1",
    ),
    _e(
        "1-D",
        lambda d: _call(
            "clipped_pg_loss",
            logp=d.logprobs(6),
            old_logp=d.logprobs(6),
            advantages=d.randn(6),
            mask=d.mask(6),
            clip_low=0.1,
            clip_high=0.3,
        ),
        "1-D tokens",
    ),
)


def _value_random(d: Draw) -> Args:
    shape = d.shape(max_dims=2)
    values = d.randn(*shape)
    return _call(
        "value_loss",
        values=values,
        old_values=values + d.randn(*shape, scale=0.3),
        returns=d.randn(*shape),
        clip=d.uniform(0.05, 0.5),
    )


_spec(
    "value_loss",
    _value_random,
    _e(
        "clip=0",
        lambda d: _call(
            "value_loss", values=d.randn(5), old_values=d.randn(5), returns=d.randn(5), clip=0.0
        ),
        "clip = 0",
    ),
    _e(
        "large-deviation",
        lambda d: _call(
            "value_loss",
            values=d.randn(6, scale=10.0),
            old_values=d.randn(6),
            returns=d.randn(6),
            clip=0.2,
        ),
        "values far from old_values",
    ),
)


def _grpo_random(d: Draw) -> Args:
    return _grpo_args(d, g=d.int(2, 3), n=d.int(1, 2), estimator=d.choice(["k1", "k2", "k3"]))


def _grpo_fixed(estimator: str) -> Build:
    return lambda d: _grpo_args(d, g=3, n=2, estimator=estimator)


_spec(
    "grpo_objective",
    _grpo_random,
    _e("k1", _grpo_fixed("k1"), "k1 KL"),
    _e("k2", _grpo_fixed("k2"), "k2 KL"),
    _e("k3", _grpo_fixed("k3"), "k3 KL"),
    _e(
        "empty-mask",
        lambda d: _grpo_args(d, g=2, n=2, estimator="k3", empty=True),
        "Σmask = 0",
    ),
    _e(
        "constant-rewards",
        lambda d: _grpo_args(d, g=3, n=1, estimator="k3", rewards=torch.ones(3)),
        "zero advantages: KL term only",
    ),
    _e(
        "far-off-policy",
        lambda d: _grpo_args(d, g=2, n=2, estimator="k1", drift=3.0),
        "most ratios clipped",
    ),
)


def _ppo_random(d: Draw) -> Args:
    t = d.int(2, 8)
    shape: tuple[int, ...] = (t,) if d.flag() else (t, d.int(1, 3))
    return _ppo_args(d, shape, None)


_spec(
    "ppo_objective",
    _ppo_random,
    _e("distinct-clips", lambda d: _ppo_args(d, (6,), (0.1, 0.3, 0.05)), "separates the 3 clips"),
    _e("2-D", lambda d: _ppo_args(d, (5, 3), (0.2, 0.2, 0.2)), "(T,B): global whitening?"),
    _e("T=1", lambda d: _ppo_args(d, (1,), (0.2, 0.2, 0.2)), "T=1: whitening of one value"),
)


def _ratio_random(d: Draw) -> Args:
    return (*_logratio_pair(d), d.uniform(0.05, 0.4))


_spec(
    "importance_ratio",
    _ratio_random,
    _e("clip=0", lambda d: (*_logratio_pair(d), 0.0), "clip = 0"),
    _e("equal", lambda d: (torch.full((3,), -1.0), torch.full((3,), -1.0), 0.2), "ratio = 1"),
    _e("extreme", lambda d: (*_extreme_pair(d), 0.2), "|log ratio| ~ 30"),
)


def _rloo_obj_random(d: Draw) -> Args:
    return _rloo_args(d, g=d.int(2, 3), n=d.int(1, 2))


_spec(
    "rloo_objective",
    _rloo_obj_random,
    _e("empty-mask", lambda d: _rloo_args(d, g=2, n=2, empty=True), "Σmask = 0"),
    _e("far-off-policy", lambda d: _rloo_args(d, g=3, n=1, drift=3.0), "most ratios clipped"),
    _e("G=B", lambda d: _rloo_args(d, g=4, n=1), "one group"),
)


def _rkl_obj(
    d: Draw, *, per_token: bool = False, empty: bool = False, beta: float | None = None
) -> Args:
    b, t, v = d.int(1, 4), d.int(1, 5), d.int(2, 6)
    logits = d.randn(b, t, v, scale=2.0)
    ref = logits + d.randn(b, t, v)
    labels = d.labels(v, b, t)
    mask = torch.zeros(b, t) if empty else d.mask(b, t, keep=0.7)
    adv = d.randn(b, t) if per_token else d.randn(b)
    return _call(
        "reverse_kl_objective",
        logits=logits,
        ref_logits=ref,
        labels=labels,
        mask=mask,
        advantages=adv,
        beta=d.uniform(0.0, 0.2) if beta is None else beta,
    )


_spec(
    "reverse_kl_objective",
    _rkl_obj,
    _e("empty-mask", lambda d: _rkl_obj(d, empty=True), "Σmask = 0"),
    _e("beta=0", lambda d: _rkl_obj(d, beta=0.0), "pure REINFORCE term"),
    _e(
        "per-token-advantages",
        lambda d: _rkl_obj(d, per_token=True),
        "(B,T) advantages instead of (B,)",
        may_raise=True,
    ),
)


def _huber_random(d: Draw) -> Args:
    shape = d.shape(max_dims=2)
    scale = d.uniform(0.5, 5.0)
    return d.randn(*shape, scale=scale), d.randn(*shape, scale=scale), d.uniform(0.3, 2.0)


_spec(
    "huber_value_loss",
    _huber_random,
    _e(
        "error-equals-delta",
        lambda d: (torch.tensor([0.5, -0.5, 2.0, 0.25]), torch.zeros(4), 0.5),
        "|e| = δ exactly (dyadic)",
    ),
    _e("small-delta", lambda d: (d.randn(6, scale=3.0), d.randn(6), 0.1), "huber vs smooth_l1"),
    _e("2-D", lambda d: (d.randn(2, 4), d.randn(2, 4), 1.0), "2-D input"),
)


def _clipfrac_random(d: Draw) -> Args:
    return (*_logratio_pair(d), d.uniform(0.05, 0.4))


_spec(
    "clip_fraction",
    _clipfrac_random,
    _e(
        "boundary-clip=0",
        lambda d: (torch.tensor([-1.0, -2.0, -0.5]), torch.tensor([-1.0, -2.5, -0.5]), 0.0),
        "ratio exactly 1 with clip 0: > vs >=",
    ),
    _e("all-clipped", lambda d: (*_extreme_pair(d), 0.2), "every ratio outside"),
    _e("2-D", lambda d: (d.logprobs(3, 4), d.logprobs(3, 4), 0.2), "2-D input"),
)
