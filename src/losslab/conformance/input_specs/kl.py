"""Input specs for `losslab.objectives.kl`: log-prob pairs and KL estimators."""

from __future__ import annotations

import torch

from losslab.conformance.input_specs._shared import (
    Args,
    Build,
    Draw,
    _e,
    _spec,
)


def _logratio_pair(d: Draw) -> Args:
    shape = d.shape(max_dims=2)
    logp = d.logprobs(*shape)
    return logp, logp + d.randn(*shape, scale=0.5)


def _extreme_pair(d: Draw) -> Args:
    logp = torch.tensor([-30.0, -0.1, -12.0, -25.0])
    return logp, torch.tensor([-0.1, -30.0, -0.2, -1.0])  # |d| up to ~30: clamps would show


def _kl_random(d: Draw) -> Args:
    return (*_logratio_pair(d), d.choice(["k1", "k2", "k3"]))


def _kl_fixed(estimator: str) -> Build:
    return lambda d: (*_logratio_pair(d), estimator)


_spec(
    "kl_penalty",
    _kl_random,
    _e("k1", _kl_fixed("k1"), "k1 = d"),
    _e("k2", _kl_fixed("k2"), "k2 = d²/2"),
    _e("k3", _kl_fixed("k3"), "k3 = e^-d - 1 + d"),
    _e("extreme-k3", lambda d: (*_extreme_pair(d), "k3"), "|d| ~ 30: clamps (verl ±20/±10)"),
    _e("equal", lambda d: (torch.full((4,), -1.0), torch.full((4,), -1.0), "k3"), "d = 0"),
    _e("unknown-mse", lambda d: (*_logratio_pair(d), "mse"), "verl alias 'mse'", may_raise=True),
    _e("unknown-kl", lambda d: (*_logratio_pair(d), "kl"), "verl alias 'kl'", may_raise=True),
)
_spec(
    "reverse_kl",
    _logratio_pair,
    _e("extreme", _extreme_pair, "|d| ~ 30"),
    _e("equal", lambda d: (torch.full((3,), -2.0), torch.full((3,), -2.0)), "d = 0"),
)
_spec(
    "symmetric_kl",
    _logratio_pair,
    _e("extreme", lambda d: (torch.tensor([-20.0, -0.5]), torch.tensor([-0.5, -20.0])), "|d| ~ 20"),
    _e("equal", lambda d: (torch.full((3,), -0.7), torch.full((3,), -0.7)), "d = 0"),
)
