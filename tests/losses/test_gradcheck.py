"""`torch.autograd.gradcheck` in float64 for every loss, surrogate and reduction.

The batch is hand-made so that every token sits far (> 1e-3) from every threshold: the masks
are piecewise constant, and gradcheck's finite differences (eps 1e-6) must not cross a jump.

Values with a stop-gradient are not functions whose derivative is their gradient everywhere:
surrogate="logprob" and cispo (-A·sg(w)·ℓ) only where the detached weight w is locally
constant, so those configurations saturate it on every token (r in [0.55, 2.01], so c = 0.5
< every r; cispo lo = hi = 1, or lo = 2.5 > every r); surrogate="ratio" (value -A·min(r, c),
gradient -A·min(r, c)) only where r < c, so those use c = 10 or inf. test_policy.py checks
that both surrogates have the same gradient everywhere.
"""

from __future__ import annotations

import math

import pytest
import torch

from losslab.losses import LOSS_NAMES, REDUCTIONS, TokenData, get_loss

# Two datums (lengths 5 and 4) plus an empty one; the last position of datum 0 is masked.
SAMPLER = [[-0.6, -1.2, -0.05, -2.0, -0.7], [-0.9, -0.1, -1.6, -0.4], []]
LOG_RATIO = [[0.45, -0.35, 0.02, -0.6, 0.1], [0.3, -0.02, 0.7, -0.4], []]
ADVANTAGE = [[1.0, -1.0, 0.5, -0.5, 1.0], [-1.5, 1.5, 0.0, 0.8], []]
MASK = [[1.0, 1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0], []]
OLD = [[-0.2, -1.0, -0.1, -1.8, -0.7], [-0.8, -0.2, -1.5, -0.5], []]

PARAMS = [
    ("importance_sampling", {}),
    ("importance_sampling", {"surrogate": "ratio", "clip_ratio_c": 10.0}),
    ("importance_sampling", {"surrogate": "logprob", "clip_ratio_c": 0.5}),
    ("ppo", {}),
    ("ppo", {"surrogate": "ratio", "clip_ratio_c": 10.0}),
    ("ppo", {"surrogate": "logprob", "clip_ratio_c": 0.5}),
    ("cispo", {"clip_low_threshold": 1.0, "clip_high_threshold": 1.0}),
    ("cispo", {"clip_low_threshold": 2.5, "clip_high_threshold": 3.0}),
    ("dro", {"beta": 0.3}),
    ("cross_entropy", {}),
    ("dppo_binary_tv", {}),
    ("dppo_binary_tv", {"surrogate": "logprob", "low": 0.05, "high": 0.1, "clip_ratio_c": 0.5}),
    (
        "dppo_binary_tv",
        {"anchor": "recomputed", "low": 0.05, "high": 0.05, "clip_ratio_c": math.inf},
    ),
    ("dppo_binary_kl", {}),
    ("dppo_binary_kl", {"surrogate": "logprob", "low": 0.01, "high": 0.12, "clip_ratio_c": 0.5}),
    ("dppo_binary_kl", {"anchor": "recomputed", "low": 0.01, "high": 0.01}),
    # the field's losses (losses/field.py). GSPO's sequence ratios are e^-0.12 = 0.887 and
    # e^0.145 = 1.156, far from 1 ± 3e-4/4e-4 and from 0.8/1.2.
    # (GSPO-token's value sg(s_d)·e^(ℓ − sg ℓ) is not a function whose derivative is its
    # gradient when A varies within a sequence; test_field_losses.py checks it by hand.)
    ("gspo", {}),
    ("gspo", {"epsilon_low": 0.2, "epsilon_high": 0.2}),
    ("luspo", {"epsilon_low": 0.2, "epsilon_high": 0.2}),
    ("cispo_eps", {"epsilon_high": 0.5}),  # absolute cap 0.5 < every r: w saturated
    ("dr_grpo", {}),
    ("dr_grpo", {"constant": "padded_width"}),
    ("dapo", {}),
    ("dual_clip_ppo", {"clip_ratio_c": 1.5}),
    # the sampler-anchored weight w = r has the gradient of its value only where it is not
    # truncated (like `surrogate="ratio"` above c), so caps sit above every r or mask
    ("icepop", {}),
    ("icepop", {"low": 0.6, "high": 1.5}),
    ("icepop", {"anchor": "recomputed", "clip_low_threshold": 0.8, "clip_high_threshold": 1.2}),
    ("rollout_correction", {"cap": 10.0}),
    ("rollout_correction", {"mode": "mask", "lower": 0.6, "cap": 1.5}),
    ("sapo", {}),
    ("gmpo", {"log_ratio_low": 0.5, "log_ratio_high": 0.5}),  # |Δ| 0.4 sits on the default
    # the batch-scoped selections are piecewise constant: no covariance within 1e-3 of a tie,
    # of the Clip-Cov bounds, and the M2PO mask's remaining second moment is 0.030 (τ 0.04)
    ("kl_cov", {"kl_cov_ratio": 0.25}),
    ("clip_cov", {"clip_cov_ratio": 0.25, "clip_cov_lb": -5.0}),
    ("m2po", {}),
]


def _tensors(rows):
    return [torch.tensor(r, dtype=torch.float64) for r in rows]


def _logprobs() -> list[torch.Tensor]:
    return [
        torch.tensor([s + r for s, r in zip(srow, rrow, strict=True)], dtype=torch.float64)
        for srow, rrow in zip(SAMPLER, LOG_RATIO, strict=True)
    ]


def _batch(lp_D: tuple[torch.Tensor, ...]) -> TokenData:
    return TokenData(
        list(lp_D), _tensors(SAMPLER), _tensors(ADVANTAGE), _tensors(MASK), _tensors(OLD)
    )


def test_batch_is_far_from_every_threshold() -> None:
    """Guard for gradcheck: no loss token within 1e-3 of a threshold that PARAMS uses."""
    ratio_thresholds = [0.5, 0.6, 0.8, 1.0, 1.2, 1.28, 1.5, 2.5, 5.0, 10.0]
    tv_thresholds = {"sampler": [0.05, 0.1, 0.15], "recomputed": [0.05]}
    kl_thresholds = {"sampler": [0.01, 0.05, 0.12], "recomputed": [0.01]}
    for lp, s, o, m in zip(
        _logprobs(), _tensors(SAMPLER), _tensors(OLD), _tensors(MASK), strict=True
    ):
        on = m > 0
        if not bool(on.any()):
            continue
        r = (lp - s).exp()[on]
        assert all(float((r - t).abs().min()) > 1e-3 for t in ratio_thresholds)
        for anchor, a in (("sampler", s), ("recomputed", o)):
            p, pa, la, l = lp.exp()[on], a.exp()[on], a[on], lp[on]
            tv = (p - pa).abs()
            kl = pa * (la - l) + (1 - pa) * torch.log((1 - pa + 1e-8) / (1 - p + 1e-8))
            for t in tv_thresholds[anchor]:
                assert float((tv - t).abs().min()) > 1e-3, (anchor, "tv", t)
            for t in kl_thresholds[anchor]:
                assert float((kl - t).abs().min()) > 1e-3, (anchor, "kl", t)


@pytest.mark.parametrize(
    ("name", "params"), PARAMS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(PARAMS)]
)
def test_gradcheck(name: str, params: dict) -> None:
    loss_fn = get_loss(name, **params)
    inputs = tuple(x.requires_grad_() for x in _logprobs())
    assert torch.autograd.gradcheck(
        lambda *lp: loss_fn(_batch(lp)).loss, inputs, eps=1e-6, atol=1e-7
    )


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_gradcheck_every_reduction(reduction: str) -> None:
    loss_fn = get_loss("dppo_binary_tv", reduction=reduction)
    inputs = tuple(x.requires_grad_() for x in _logprobs())
    assert torch.autograd.gradcheck(
        lambda *lp: loss_fn(_batch(lp)).loss, inputs, eps=1e-6, atol=1e-7
    )


def test_params_cover_every_loss() -> None:
    assert {name for name, _ in PARAMS} == set(LOSS_NAMES)
    assert math.isfinite(get_loss("ppo").params["clip_low_threshold"])
