"""Per-token KL estimators between the policy and a reference, from sampled-token log-probs.

d = logp - ref_logp (tokens sampled from the policy). Schulman, "Approximating KL Divergence"
(2020): k1 = d, k2 = ½d², k3 = e^{-d} - 1 + d (unbiased for KL(π||π_ref), always >= 0).
All elementwise, no reduction and no clamp (verl clamps d to ±20 and k3 to ±10).
"""

from __future__ import annotations

import torch

from losslab.objectives._checks import require_broadcast, require_float_tensor

Tensor = torch.Tensor

KL_ESTIMATORS = ("k1", "k2", "k3")


def _log_ratio(fn: str, logp: Tensor, ref_logp: Tensor) -> Tensor:
    require_float_tensor(fn, "logp", logp)
    require_float_tensor(fn, "ref_logp", ref_logp)
    require_broadcast(fn, ("logp", "ref_logp"), logp, ref_logp)
    return logp - ref_logp


def _k3(d: Tensor) -> Tensor:
    return torch.exp(-d) - 1 + d


def kl_penalty(logp, ref_logp, estimator):
    """Elementwise KL estimate: 'k1' -> d, 'k2' -> ½d², 'k3' -> e^{-d} - 1 + d.

    Only these three names are accepted (verl's aliases 'kl', 'mse', 'low_var_kl', 'abs' raise).
    """
    fn = "kl_penalty"
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"{fn}: estimator must be one of {KL_ESTIMATORS}, got {estimator!r}")
    d = _log_ratio(fn, logp, ref_logp)
    if estimator == "k1":
        return d
    if estimator == "k2":
        return 0.5 * d * d
    return _k3(d)


def reverse_kl(logp, ref_logp):
    """k3 estimate of KL(π || π_ref): e^{-d} - 1 + d, elementwise."""
    return _k3(_log_ratio("reverse_kl", logp, ref_logp))


def symmetric_kl(logp, ref_logp):
    """cosh(d) - 1 = ½[k3(d) + k3(-d)], elementwise (mean of the forward and reverse k3)."""
    return torch.cosh(_log_ratio("symmetric_kl", logp, ref_logp)) - 1
