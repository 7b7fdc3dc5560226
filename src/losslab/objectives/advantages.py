"""Advantages, returns and normalisation.

Groups (GRPO/RLOO) are CONTIGUOUS blocks of `group_size` over the flattened rewards
(`rewards.reshape(-1, G)`), e.g. rewards_P_G = [p0g0, p0g1, ..., p1g0, ...]. Returns/GAE run
along TIME = DIM 0 ((T,) or (T, B, ...), the CleanRL/SB3 layout), with an explicit bootstrap
`next_value` and no dones/mask. TRL and verl use (B, T) with time last: pass `x.T` to them.
"""

from __future__ import annotations

import torch

from losslab.objectives._checks import (
    masked_values,
    require_float_tensor,
    require_int,
    require_min_dim,
    require_number,
    require_same_shape,
    require_tensor,
)
from losslab.objectives.reductions import masked_mean

Tensor = torch.Tensor

GRPO_STD_EPS = 1e-6  # added to the biased group std, outside the sqrt
WHITEN_VAR_EPS = 1e-8  # added to the biased variance, inside the rsqrt


# ---------------------------------------------------------------------------- group advantages
def _groups(fn: str, rewards: Tensor, group_size: object, min_size: int = 1) -> Tensor:
    require_float_tensor(fn, "rewards", rewards)
    g = require_int(fn, "group_size", group_size, low=min_size)
    if rewards.numel() % g != 0:
        raise ValueError(
            f"{fn}: group_size={g} must divide rewards.numel()={rewards.numel()} "
            f"(rewards shape {tuple(rewards.shape)}); groups are contiguous blocks of group_size"
        )
    return rewards.reshape(-1, g)


def group_mean_baseline(rewards, group_size):
    """Rewards centred on their group mean, r - mean_group(r) (not the baseline itself)."""
    rewards_N_G = _groups("group_mean_baseline", rewards, group_size)
    return (rewards_N_G - rewards_N_G.mean(dim=1, keepdim=True)).reshape(rewards.shape)


def grpo_advantages(rewards, group_size, scale_by_std):
    """GRPO (Shao et al. 2024): A = r - mean_g(r); if scale_by_std, A / (std_g(r) + 1e-6).

    std is the BIASED (÷G) group std, eps outside the sqrt. TRL uses unbiased std + 1e-4, verl
    unbiased std + 1e-6. group_size=1 gives A = 0 (0 / (0 + eps)).
    """
    fn = "grpo_advantages"
    if not isinstance(scale_by_std, bool):
        raise TypeError(f"{fn}: scale_by_std must be a bool, got {scale_by_std!r}")
    rewards_N_G = _groups(fn, rewards, group_size)
    adv_N_G = rewards_N_G - rewards_N_G.mean(dim=1, keepdim=True)
    if scale_by_std:
        std_N_1 = rewards_N_G.std(dim=1, unbiased=False, keepdim=True)
        adv_N_G = adv_N_G / (std_N_1 + GRPO_STD_EPS)
    return adv_N_G.reshape(rewards.shape)


def rloo_advantages(rewards, group_size):
    """RLOO (Ahmadian et al. 2024): A_i = r_i - (Σ_group r - r_i)/(G - 1) = G/(G-1)·(r_i - mean).

    Needs group_size >= 2 (the leave-one-out baseline of a single sample is undefined).
    """
    fn = "rloo_advantages"
    rewards_N_G = _groups(fn, rewards, group_size, min_size=2)
    g = rewards_N_G.shape[1]
    loo_N_G = (rewards_N_G.sum(dim=1, keepdim=True) - rewards_N_G) / (g - 1)
    return (rewards_N_G - loo_N_G).reshape(rewards.shape)


# ---------------------------------------------------------------------------- returns / GAE
def _check_gamma_lam(fn: str, gamma: object, lam: object | None = None) -> tuple[float, float]:
    gm = require_number(fn, "gamma", gamma, low=0.0, high=1.0)
    lm = 1.0 if lam is None else require_number(fn, "lam", lam, low=0.0, high=1.0)
    return gm, lm


def _bootstrap(fn: str, values: Tensor, next_value: object) -> Tensor:
    """next_value as a tensor of shape values.shape[1:] (a scalar broadcasts over the batch)."""
    nv = next_value if isinstance(next_value, torch.Tensor) else None
    if nv is None:
        require_number(fn, "next_value", next_value)
        nv = torch.tensor(float(next_value), dtype=values.dtype, device=values.device)
    batch_shape = values.shape[1:]
    try:
        ok = torch.broadcast_shapes(nv.shape, batch_shape) == batch_shape
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(
            f"{fn}: next_value must be a scalar or have shape values.shape[1:] = "
            f"{tuple(batch_shape)} (time is dim 0), got {tuple(nv.shape)}"
        )
    return nv.to(values.dtype).expand(batch_shape)


def gae(rewards, values, next_value, gamma, lam):
    """GAE (Schulman et al. 2016) along dim 0: δ_t = r_t + γV_{t+1} - V_t (V_T = next_value),
    A_t = δ_t + γλA_{t+1}. No dones, no mask. rewards/values: (T,) or (T, B, ...)."""
    fn = "gae"
    require_float_tensor(fn, "rewards", rewards)
    require_float_tensor(fn, "values", values)
    require_min_dim(fn, "rewards", rewards, 1)
    require_same_shape(fn, "rewards", rewards, "values", values)
    gm, lm = _check_gamma_lam(fn, gamma, lam)
    nv = _bootstrap(fn, values, next_value)
    if rewards.shape[0] == 0:
        return rewards.clone()
    values_next = torch.cat([values[1:], nv.unsqueeze(0)], dim=0)  # V_{t+1}, (T, ...)
    deltas = rewards + gm * values_next - values
    adv_rev = []
    last = torch.zeros_like(deltas[0])
    for t in reversed(range(rewards.shape[0])):
        last = deltas[t] + gm * lm * last
        adv_rev.append(last)
    return torch.stack(adv_rev[::-1], dim=0)


def lambda_returns(rewards, values, next_value, gamma, lam):
    """TD(λ) returns G^λ_t = A^GAE_t + V_t (dim-0 time), the usual value-function target."""
    return gae(rewards, values, next_value, gamma, lam) + values


def discounted_returns(rewards, gamma):
    """G_t = r_t + γ G_{t+1} along dim 0, with G_T = 0 (no bootstrap)."""
    fn = "discounted_returns"
    require_float_tensor(fn, "rewards", rewards)
    require_min_dim(fn, "rewards", rewards, 1)
    gm, _ = _check_gamma_lam(fn, gamma)
    if rewards.shape[0] == 0:
        return rewards.clone()
    out_rev = []
    run = torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        run = rewards[t] + gm * run
        out_rev.append(run)
    return torch.stack(out_rev[::-1], dim=0)


# ---------------------------------------------------------------------------- normalisation
def _masked_stats(fn: str, values: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Global masked mean and BIASED masked variance (÷Σmask), each 0.0 for an empty mask."""
    require_float_tensor(fn, "values", values)
    require_tensor(fn, "mask", mask)
    try:
        fits = torch.broadcast_shapes(values.shape, mask.shape) == values.shape
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(
            f"{fn}: mask must broadcast to values.shape {tuple(values.shape)}, "
            f"got {tuple(mask.shape)}"
        )
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    return mean, var


def whiten(values, mask, shift_mean):
    """w = (v - μ)·rsqrt(σ² + 1e-8) at EVERY position (masked ones too); μ, σ² = masked global
    mean and biased variance. shift_mean=False returns w + μ (keeps the mean, rescales only).

    TRL/verl use the unbiased masked variance. An empty mask raises (there are no statistics and
    every output would be v·1e4).
    """
    fn = "whiten"
    if not isinstance(shift_mean, bool):
        raise TypeError(f"{fn}: shift_mean must be a bool, got {shift_mean!r}")
    mean, var = _masked_stats(fn, values, mask)
    if not bool((mask != 0).any()):
        raise ValueError(
            f"{fn}: mask selects no element (shape {tuple(mask.shape)}); nothing to whiten"
        )
    w = (values - mean) * torch.rsqrt(var + WHITEN_VAR_EPS)
    return w if shift_mean else w + mean


def masked_whiten(values, mask, shift_mean):
    """whiten's w, times the mask (masked slots 0); shift_mean=False adds μ AFTER masking, so masked
    slots equal μ. An empty mask gives all zeros (μ = σ² = 0 and every slot masked)."""
    fn = "masked_whiten"
    if not isinstance(shift_mean, bool):
        raise TypeError(f"{fn}: shift_mean must be a bool, got {shift_mean!r}")
    mean, var = _masked_stats(fn, values, mask)
    w = masked_values((values - mean) * torch.rsqrt(var + WHITEN_VAR_EPS), mask.to(values.dtype))
    return w if shift_mean else w + mean


def normalize(x, eps):
    """(x - mean) / (std + eps), global over all elements, UNBIASED std (÷(n-1)), eps outside sqrt.

    n = 1 gives 0 (x - mean = 0; the unbiased std is taken as 0 instead of NaN).
    """
    fn = "normalize"
    require_float_tensor(fn, "x", x)
    e = require_number(fn, "eps", eps, low=0.0)
    if x.numel() == 0:
        return x.clone()
    centred = x - x.mean()
    if x.numel() == 1:
        return centred  # exactly 0
    return centred / (x.std() + e)


def advantage_mean_std(advantages, mask):
    """tensor([μ, σ]) with masked global mean μ and BIASED masked std σ; shape (2,).
    An empty mask gives [0, 0]."""
    mean, var = _masked_stats("advantage_mean_std", advantages, mask)
    return torch.stack([mean, torch.sqrt(var)])
