"""Policy-gradient and value losses, and the composite GRPO / PPO / RLOO / reverse-KL objectives.

r = exp(logp - old_logp). Token losses are aggregated by a GLOBAL masked token-mean
(Σ loss·mask / Σ mask over the whole batch; TRL "bnpo", verl "token-mean"); an empty mask gives
0.0. No dual-clip and no log-ratio clamp (verl adds both).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from losslab.objectives._checks import (
    plain_mean,
    require_broadcast,
    require_float_tensor,
    require_min_dim,
    require_number,
    require_same_shape,
    require_tensor,
)
from losslab.objectives.advantages import (
    WHITEN_VAR_EPS,
    gae,
    grpo_advantages,
    rloo_advantages,
)
from losslab.objectives.kl import kl_penalty, reverse_kl
from losslab.objectives.logprobs import token_logprobs
from losslab.objectives.reductions import masked_mean

Tensor = torch.Tensor


def _ratio(fn: str, logp: Tensor, old_logp: Tensor) -> Tensor:
    require_float_tensor(fn, "logp", logp)
    require_float_tensor(fn, "old_logp", old_logp)
    require_broadcast(fn, ("logp", "old_logp"), logp, old_logp)
    return torch.exp(logp - old_logp)


def _clips(fn: str, clip_low: object, clip_high: object) -> tuple[float, float]:
    lo = require_number(fn, "clip_low", clip_low, low=0.0, high=1.0)
    hi = require_number(fn, "clip_high", clip_high, low=0.0)
    return lo, hi


def _seq_to_token(fn: str, name: str, adv: Tensor, lp_B_T: Tensor) -> Tensor:
    """Sequence advantages (B,) broadcast over tokens as (B, 1); per-token (B, T) pass through."""
    if adv.shape == lp_B_T.shape[:-1]:
        return adv.unsqueeze(-1)
    if adv.shape == lp_B_T.shape:
        return adv
    raise ValueError(
        f"{fn}: {name} must have shape {tuple(lp_B_T.shape[:-1])} (one per sequence) or "
        f"{tuple(lp_B_T.shape)} (one per token), got {tuple(adv.shape)}"
    )


def _pg_per_token(ratio: Tensor, advantages: Tensor, lo: float, hi: float) -> Tensor:
    """PPO clipped surrogate per token: max(-A·r, -A·clamp(r, 1-lo, 1+hi))."""
    return torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - lo, 1 + hi))


def clipped_pg_loss(logp, old_logp, advantages, mask, clip_low, clip_high):
    """PPO clip loss (Schulman et al. 2017) with asymmetric clip (DAPO clip-higher), global masked
    token-mean: mm(max(-A·r, -A·clamp(r, 1-clip_low, 1+clip_high)), mask)."""
    fn = "clipped_pg_loss"
    ratio = _ratio(fn, logp, old_logp)
    require_float_tensor(fn, "advantages", advantages)
    require_tensor(fn, "mask", mask)
    require_broadcast(fn, ("logp", "advantages", "mask"), ratio, advantages, mask)
    lo, hi = _clips(fn, clip_low, clip_high)
    return masked_mean(_pg_per_token(ratio, advantages, lo, hi), mask)


def importance_ratio(logp, old_logp, clip):
    """clamp(exp(logp - old_logp), 1 - clip, 1 + clip), elementwise (symmetric clip)."""
    fn = "importance_ratio"
    ratio = _ratio(fn, logp, old_logp)
    c = require_number(fn, "clip", clip, low=0.0, high=1.0)
    return ratio.clamp(1 - c, 1 + c)


def clip_fraction(logp, old_logp, clip):
    """Share of elements with |r - 1| > clip (strict), over all elements, no mask; 0-d float.

    Advantage-free (verl/TRL count tokens where the clipped branch is selected, which depends on
    the sign of A). Empty input gives 0.0.
    """
    fn = "clip_fraction"
    ratio = _ratio(fn, logp, old_logp)
    c = require_number(fn, "clip", clip, low=0.0)
    return plain_mean(((ratio - 1).abs() > c).to(ratio.dtype))


def value_loss(values, old_values, returns, clip):
    """PPO clipped value loss: v_c = old + clamp(v - old, ±clip); 0.5·mean(max((v-R)², (v_c-R)²)).
    Plain mean over all elements (no mask)."""
    fn = "value_loss"
    for name, t in (("values", values), ("old_values", old_values), ("returns", returns)):
        require_float_tensor(fn, name, t)
    require_broadcast(fn, ("values", "old_values", "returns"), values, old_values, returns)
    c = require_number(fn, "clip", clip, low=0.0)
    v_clipped = old_values + (values - old_values).clamp(-c, c)
    return 0.5 * plain_mean(torch.max((values - returns) ** 2, (v_clipped - returns) ** 2))


def huber_value_loss(values, returns, delta):
    """Huber loss, mean: ½e² if |e| <= δ else δ(|e| - ½δ), e = values - returns (F.huber_loss,
    not smooth_l1 which divides by β)."""
    fn = "huber_value_loss"
    require_float_tensor(fn, "values", values)
    require_float_tensor(fn, "returns", returns)
    require_same_shape(fn, "values", values, "returns", returns)
    d = require_number(fn, "delta", delta, low=0.0, low_open=True)
    return plain_mean(F.huber_loss(values, returns, reduction="none", delta=d))


def grpo_objective(
    logits,
    old_logits,
    ref_logits,
    labels,
    completion_mask,
    rewards,
    group_size,
    beta,
    clip_low,
    clip_high,
    scale_by_std,
    kl_estimator,
):
    """GRPO loss: clipped_pg_loss(lp, old_lp, A[:, None], mask) + β·mm(kl_penalty(lp, ref_lp), mask).

    logits/old_logits/ref_logits (B, T, V), labels and completion_mask (B, T), rewards (B,) in
    contiguous groups; A = grpo_advantages(rewards, G, scale_by_std). The KL uses the CURRENT policy.
    """
    fn = "grpo_objective"
    lp_B_T = token_logprobs(logits, labels)
    old_lp_B_T = token_logprobs(old_logits, labels)
    ref_lp_B_T = token_logprobs(ref_logits, labels)
    require_min_dim(fn, "labels", labels, 1)
    b = require_number(fn, "beta", beta, low=0.0)
    adv_B = grpo_advantages(rewards, group_size, scale_by_std)
    adv_B_T = _seq_to_token(fn, "rewards", adv_B, lp_B_T)
    pg = clipped_pg_loss(lp_B_T, old_lp_B_T, adv_B_T, completion_mask, clip_low, clip_high)
    kl = masked_mean(kl_penalty(lp_B_T, ref_lp_B_T, kl_estimator), completion_mask)
    return pg + b * kl


def ppo_objective(
    rewards,
    values,
    old_values,
    logp,
    old_logp,
    next_value,
    gamma,
    lam,
    clip_low,
    clip_high,
    vf_clip,
    vf_coef,
):
    """PPO loss (CleanRL layout, time on dim 0):
    adv = gae(rewards, values, next_value, γ, λ); returns = adv + values (raw adv);
    adv_w = (adv - mean)·rsqrt(biased var + 1e-8), global and unmasked;
    pg = mean(max(-adv_w·r, -adv_w·clamp(r, 1-clip_low, 1+clip_high)));
    loss = pg + vf_coef·value_loss(values, old_values, returns, vf_clip).
    """
    fn = "ppo_objective"
    require_float_tensor(fn, "logp", logp)
    require_same_shape(fn, "logp", logp, "rewards", rewards)
    require_same_shape(fn, "old_logp", old_logp, "rewards", rewards)
    coef = require_number(fn, "vf_coef", vf_coef, low=0.0)
    lo, hi = _clips(fn, clip_low, clip_high)
    adv = gae(rewards, values, next_value, gamma, lam)
    returns = adv + values
    mean = plain_mean(adv)
    var = plain_mean((adv - mean) ** 2)
    adv_w = (adv - mean) * torch.rsqrt(var + WHITEN_VAR_EPS)
    pg = plain_mean(_pg_per_token(_ratio(fn, logp, old_logp), adv_w, lo, hi))
    return pg + coef * value_loss(values, old_values, returns, vf_clip)


def rloo_objective(logits, old_logits, labels, mask, rewards, group_size, clip_low, clip_high):
    """RLOO with PPO clipping: clipped_pg_loss(lp, old_lp, rloo_advantages(rewards, G)[:, None],
    mask). No KL or entropy term."""
    fn = "rloo_objective"
    lp_B_T = token_logprobs(logits, labels)
    old_lp_B_T = token_logprobs(old_logits, labels)
    adv_B_T = _seq_to_token(fn, "rewards", rloo_advantages(rewards, group_size), lp_B_T)
    return clipped_pg_loss(lp_B_T, old_lp_B_T, adv_B_T, mask, clip_low, clip_high)


def reverse_kl_objective(logits, ref_logits, labels, mask, advantages, beta):
    """REINFORCE on log-probs with a k3 reverse-KL penalty: mm(-A·lp + β·k3(lp - ref_lp), mask).

    No ratio, old policy or clipping. advantages: (B,) per sequence or (B, T) per token.
    """
    fn = "reverse_kl_objective"
    lp_B_T = token_logprobs(logits, labels)
    ref_lp_B_T = token_logprobs(ref_logits, labels)
    require_float_tensor(fn, "advantages", advantages)
    require_tensor(fn, "mask", mask)
    b = require_number(fn, "beta", beta, low=0.0)
    adv_B_T = _seq_to_token(fn, "advantages", advantages, lp_B_T)
    require_broadcast(fn, ("token logprobs", "mask"), lp_B_T, mask)
    return masked_mean(-adv_B_T * lp_B_T + b * reverse_kl(lp_B_T, ref_lp_B_T), mask)
