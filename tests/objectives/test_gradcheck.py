"""torch.autograd.gradcheck (float64, small inputs) for every differentiable objective.

Inputs are seeded and kept away from the kinks of clamp/max/sort (checked where it matters), so
finite differences are valid. Non-differentiable outputs (bool/int masks, indices, counts:
top_k_mask, argmax_tokens, clip_fraction, mode_label, pad_mask_from_lengths, first_nonzero_index,
bucketize_reward) are excluded.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch.autograd import gradcheck

import losslab.objectives as O

D = torch.float64


def _g(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def rn(g: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=g, dtype=D)


def mask(g: torch.Generator, *shape: int) -> torch.Tensor:
    m = (torch.rand(*shape, generator=g) > 0.3).to(D)
    m.view(-1)[0] = 1.0  # never empty
    return m


def labels(g: torch.Generator, v: int, *shape: int) -> torch.Tensor:
    return torch.randint(0, v, shape, generator=g)


def case(seed: int) -> dict[str, tuple[Callable, tuple[torch.Tensor, ...]]]:
    """name -> (fn of the differentiable tensors, those tensors)."""
    g = _g(seed)
    m8, m24 = mask(g, 8), mask(g, 2, 4)
    lab24 = labels(g, 5, 2, 4)
    lab42 = labels(g, 3, 4, 2)  # composites stay tiny: gradcheck is O(#inputs) forwards
    m42 = mask(g, 4, 2)
    cm, rm = mask(g, 2, 3), mask(g, 2, 3)
    lab_c, lab_r = labels(g, 3, 2, 3), labels(g, 3, 2, 3)
    lab22 = labels(g, 3, 2, 2)
    m22 = mask(g, 2, 2)
    nv = rn(g, 3)
    return {
        "masked_mean": (lambda v: O.masked_mean(v, m24, axis=1), (rn(g, 2, 4),)),
        "masked_sum": (lambda v: O.masked_sum(v, m24, axis=None), (rn(g, 2, 4),)),
        "masked_max": (lambda v: O.masked_max(v, m8), (rn(g, 8),)),
        "logsumexp": (lambda x: O.logsumexp(x, 1), (rn(g, 3, 5),)),
        "log_softmax": (lambda x: O.log_softmax(x, -1), (rn(g, 3, 5),)),
        "token_logprobs": (lambda lg: O.token_logprobs(lg, lab24), (rn(g, 2, 4, 5),)),
        "selective_logprobs": (lambda lg: O.selective_logprobs(lg, lab24, m24), (rn(g, 2, 4, 5),)),
        "sequence_logprob": (
            lambda lg: O.sequence_logprob(lg, lab24, m24, True),
            (rn(g, 2, 4, 5),),
        ),
        "entropy": (lambda lg: O.entropy(lg, m24), (rn(g, 2, 4, 5),)),
        "normalized_entropy": (lambda lg: O.normalized_entropy(lg, m24), (rn(g, 2, 4, 5),)),
        "logprob_at_temperature": (
            lambda lg: O.logprob_at_temperature(lg, lab24, 0.7),
            (rn(g, 2, 4, 5),),
        ),
        "cross_entropy": (
            lambda lg: O.cross_entropy(lg, torch.where(m24 > 0, lab24, -100), -100),
            (rn(g, 2, 4, 5),),
        ),
        "smoothed_nll": (lambda lg: O.smoothed_nll(lg, lab24, 0.1), (rn(g, 2, 4, 5),)),
        "dpo_loss": (
            lambda a, b, c, d: O.dpo_loss(a, b, c, d, 0.5, 0.1),
            tuple(rn(g, 4) for _ in range(4)),
        ),
        "ipo_loss": (
            lambda a, b, c, d: O.ipo_loss(a, b, c, d, 0.5),
            tuple(rn(g, 4) for _ in range(4)),
        ),
        "bradley_terry_logit": (
            lambda a, b: O.bradley_terry_logit(a, b, 0.3),
            (rn(g, 4), rn(g, 4)),
        ),
        "dpo_sequence_loss": (
            lambda a, b, c, d: O.dpo_sequence_loss(a, b, c, d, lab_c, lab_r, cm, rm, 0.5, 0.1),
            tuple(rn(g, 2, 3, 3) for _ in range(4)),
        ),
        "grpo_advantages": (lambda r: O.grpo_advantages(r, 3, True), (rn(g, 6),)),
        "rloo_advantages": (lambda r: O.rloo_advantages(r, 3), (rn(g, 6),)),
        "group_mean_baseline": (lambda r: O.group_mean_baseline(r, 2), (rn(g, 6),)),
        "gae": (lambda r, v, n: O.gae(r, v, n, 0.9, 0.95), (rn(g, 4, 3), rn(g, 4, 3), nv)),
        "lambda_returns": (
            lambda r, v, n: O.lambda_returns(r, v, n, 0.9, 0.95),
            (rn(g, 4, 3), rn(g, 4, 3), rn(g, 3)),
        ),
        "discounted_returns": (lambda r: O.discounted_returns(r, 0.9), (rn(g, 4, 3),)),
        "whiten": (lambda v: O.whiten(v, m8, False), (rn(g, 8),)),
        "masked_whiten": (lambda v: O.masked_whiten(v, m8, True), (rn(g, 8),)),
        "normalize": (lambda x: O.normalize(x, 1e-3), (rn(g, 7),)),
        "advantage_mean_std": (lambda a: O.advantage_mean_std(a, m8), (rn(g, 8),)),
        "kl_penalty_k1": (lambda a, b: O.kl_penalty(a, b, "k1"), (rn(g, 5), rn(g, 5))),
        "kl_penalty_k2": (lambda a, b: O.kl_penalty(a, b, "k2"), (rn(g, 5), rn(g, 5))),
        "kl_penalty_k3": (lambda a, b: O.kl_penalty(a, b, "k3"), (rn(g, 5), rn(g, 5))),
        "reverse_kl": (O.reverse_kl, (rn(g, 5), rn(g, 5))),
        "symmetric_kl": (O.symmetric_kl, (rn(g, 5), rn(g, 5))),
        "clipped_pg_loss": (
            lambda lp, olp, a: O.clipped_pg_loss(lp, olp, a, m8, 0.2, 0.3),
            (rn(g, 8), rn(g, 8), rn(g, 8)),
        ),
        "importance_ratio": (
            lambda lp, olp: O.importance_ratio(lp, olp, 0.2),
            (rn(g, 6), rn(g, 6)),
        ),
        "value_loss": (
            lambda v, ov, ret: O.value_loss(v, ov, ret, 0.2),
            (rn(g, 6), rn(g, 6), rn(g, 6)),
        ),
        "huber_value_loss": (lambda v, ret: O.huber_value_loss(v, ret, 0.7), (rn(g, 6), rn(g, 6))),
        "grpo_objective": (
            lambda lg, olg, rlg, r: O.grpo_objective(
                lg, olg, rlg, lab42, m42, r, 2, 0.04, 0.2, 0.3, True, "k3"
            ),
            (rn(g, 4, 2, 3), rn(g, 4, 2, 3), rn(g, 4, 2, 3), rn(g, 4)),
        ),
        "ppo_objective": (
            lambda r, v, ov, lp, olp: O.ppo_objective(
                r, v, ov, lp, olp, torch.tensor(0.3, dtype=D), 0.99, 0.95, 0.2, 0.3, 0.25, 0.5
            ),
            (rn(g, 6), rn(g, 6), rn(g, 6), rn(g, 6), rn(g, 6)),
        ),
        "rloo_objective": (
            lambda lg, olg, r: O.rloo_objective(lg, olg, lab42, m42, r, 2, 0.2, 0.3),
            (rn(g, 4, 2, 3), rn(g, 4, 2, 3), rn(g, 4)),
        ),
        "reverse_kl_objective": (
            lambda lg, rlg, a: O.reverse_kl_objective(lg, rlg, lab22, m22, a, 0.1),
            (rn(g, 2, 2, 3), rn(g, 2, 2, 3), rn(g, 2)),
        ),
        "top_p_mask": (
            lambda z: O.top_p_mask(torch.softmax(z, -1), 0.6),
            (torch.tensor([[2.0, 0.1, -1.0, 0.7, -0.4]], dtype=D),),
        ),
        "median_reward": (O.median_reward, (rn(g, 6),)),
        "quantile_lower": (lambda x: O.quantile_lower(x, 0.3), (rn(g, 10),)),
        "cumulative_max": (O.cumulative_max, (rn(g, 5, 2),)),
    }


CASES = case(0)
NON_DIFFERENTIABLE = {
    "top_k_mask",
    "argmax_tokens",
    "clip_fraction",
    "mode_label",
    "pad_mask_from_lengths",
    "first_nonzero_index",
    "bucketize_reward",
}


def test_every_differentiable_objective_is_covered() -> None:
    covered = {name.split("_k")[0] if name.startswith("kl_penalty") else name for name in CASES}
    assert covered | NON_DIFFERENTIABLE == set(O.__all__)


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradcheck(name: str) -> None:
    fn, inputs = CASES[name]
    inputs = tuple(x.clone().requires_grad_(True) for x in inputs)
    # fast_mode (random projections of the Jacobian) for the larger inputs keeps the run short
    fast = sum(x.numel() for x in inputs) > 40
    assert gradcheck(fn, inputs, eps=1e-6, atol=1e-5, rtol=1e-4, fast_mode=fast)
