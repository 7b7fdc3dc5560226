"""The field's policy losses (2025-2026), each with its framework conventions as named knobs.

Notation as `losses/policy.py`: per token t of datum d, ℓ current log-prob (differentiated),
ℓ_s sampler (rollout) log-prob, ℓ_o recomputed old log-prob, r = e^(ℓ − ℓ_s), A advantage,
m loss mask, n_d the loss tokens of datum d, sg(·) stop-gradient, M the keep mask (detached).
Each function returns the per-token loss (weighted by m) and its keep mask; its declaration
(`losses/declarations.py`) holds the defaults, domains, rules, metric keys and the default
reduction (each paper's aggregation), and `loss_function` reduces and measures. docs/losses.md
has one section per loss: equation, paper, knobs with each framework's convention.

Sequence-level quantities (GSPO's ratio, a sequence IS weight) are means or sums over a datum's
LOSS tokens (m > 0), computed with `index_add` over `seq_T` and broadcast back to its tokens.
Exponentials of log-ratios take the module's straight-through clamp at 20 (`sampler_ratio`), so
no value overflows and the gradient is the unclamped one.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from losslab.losses import declarations as declared
from losslab.losses.data import PackedTokens, TokenData, pack
from losslab.losses.declarations import (
    Anchor,
    CispoMeaning,
    CorrectionLevel,
    CorrectionMode,
    DrGrpoConstant,
    GspoGuard,
    GspoLevel,
    LogRatioGuard,
    Surrogate,
    ZeroAdvantage,
)
from losslab.losses.policy import (
    LOG_RATIO_MAX,
    TokenLoss,
    guarded_ratio,
    loss_function,
    sampler_ratio,
    trust_region,
)

# ---------------------------------------------------------------------------------------------
# Shared pieces: per-sequence sums, the capped exponential, the PPO clipped surrogate.
# ---------------------------------------------------------------------------------------------


def exp_capped(log_X: Tensor) -> Tensor:
    """e^min(x, 20) in value, gradient e^min(x, 20) (straight through, as `sampler_ratio`)."""
    return sampler_ratio(log_X, torch.zeros_like(log_X))


def guarded_log_ratio(log_ratio_T: Tensor, guard: LogRatioGuard) -> Tensor:
    """ℓ − ℓ_a under a `LogRatioGuard` in LOG space (GMPO clips log-ratios, not ratios):
    "upper"/"both" clamp at 20 (and −20) in value with the gradient straight through,
    "zero_grad" is torch's clamp to [−20, 20] (no gradient beyond), "none" leaves it."""
    if guard == "upper":
        return log_ratio_T - (log_ratio_T - LOG_RATIO_MAX).clamp_min(0).detach()
    if guard == "both":
        clamped_T = log_ratio_T.clamp(-LOG_RATIO_MAX, LOG_RATIO_MAX)
        return log_ratio_T - (log_ratio_T - clamped_T).detach()
    if guard == "zero_grad":
        return log_ratio_T.clamp(-LOG_RATIO_MAX, LOG_RATIO_MAX)
    if guard == "none":
        return log_ratio_T
    raise ValueError(f"log_ratio_guard={guard!r}: expected upper, both, zero_grad or none")


def loss_counts_D(t: PackedTokens) -> Tensor:
    """n_d: loss tokens (m > 0) per datum, float [D]."""
    zeros_D = torch.zeros(t.num_datums, dtype=t.logprobs_T.dtype, device=t.logprobs_T.device)
    return zeros_D.index_add(0, t.seq_T, t.loss_T.to(zeros_D.dtype))


def sequence_sum(t: PackedTokens, x_T: Tensor) -> Tensor:
    """Σ_{t ∈ d, m > 0} x_t per datum [D] (differentiable; masked positions contribute 0)."""
    zeros_D = torch.zeros(t.num_datums, dtype=x_T.dtype, device=x_T.device)
    return zeros_D.index_add(0, t.seq_T, torch.where(t.loss_T, x_T, torch.zeros_like(x_T)))


def sequence_mean(t: PackedTokens, x_T: Tensor) -> Tensor:
    """Mean of x over each datum's loss tokens [D]; 0 for a datum without loss tokens."""
    return sequence_sum(t, x_T) / loss_counts_D(t).clamp_min(1)


def clipped_surrogate(
    t: PackedTokens, ratio_T: Tensor, low: float, high: float, zero_adv: ZeroAdvantage
) -> tuple[Tensor, Tensor]:
    """PPO's −min(ρ·A, clip(ρ, low, high)·A)·m with ABSOLUTE bounds, and its keep mask (False
    where the clip zeroed the gradient: A > 0 and ρ > high, or A < 0 and ρ < low). Tinker's
    `ppo` value (`losses.policy.ppo`) for any ratio ρ (token r, GSPO's s, a PPO ratio π_θ/π_o)."""
    a_T = t.advantages_T
    keep_T = trust_region(
        a_T,
        t.loss_T,
        leaves_up_T=ratio_T.detach() > high,
        leaves_down_T=ratio_T.detach() < low,
        zero_adv=zero_adv,
    )
    clipped_T = ratio_T.clamp(low, high)
    return -torch.minimum(ratio_T * a_T, clipped_T * a_T) * t.mask_T, keep_T


def _share(t: PackedTokens, flag_T: Tensor) -> float:
    """Share of loss tokens where `flag_T` holds (0 with no loss token)."""
    n = int(t.loss_T.sum())
    return int((flag_T & t.loss_T).sum()) / n if n else 0.0


def _mean_over_sequences(t: PackedTokens, x_D: Tensor) -> float:
    """Mean of a per-datum value over datums with a loss token (0 with none)."""
    on_D = loss_counts_D(t) > 0
    return float(x_D.detach()[on_D].double().mean()) if bool(on_D.any()) else 0.0


def _old_logprobs(t: PackedTokens, loss: str) -> Tensor:
    if t.old_logprobs_T is None:
        raise ValueError(
            f'{loss}: anchor="recomputed" needs TokenData.old_logprobs_D, which is None'
        )
    return t.old_logprobs_T


# ---------------------------------------------------------------------------------------------
# GSPO, LUSPO (sequence ratios), CISPO's epsilon parameterisations.
# ---------------------------------------------------------------------------------------------


VERL_GSPO_LOG_MAX = 10.0
"""verl's `torch.clamp(log_seq_importance_ratio, max=10.0)` in `compute_policy_loss_gspo`."""


def _guarded_exp(log_X: Tensor, guard: GspoGuard) -> Tensor:
    if guard == "upper":
        return exp_capped(log_X)
    if guard == "verl":
        return torch.exp(log_X.clamp(max=VERL_GSPO_LOG_MAX))
    if guard == "none":
        return torch.exp(log_X)
    raise ValueError(f"log_ratio_guard={guard!r}: expected upper, verl or none")


def gspo_ratio(t: PackedTokens, level: GspoLevel, guard: GspoGuard) -> tuple[Tensor, Tensor]:
    """(s per token [T], s_d per datum [D]) with s_d = exp(mean_{t ∈ d} (ℓ − ℓ_s)).

    "sequence": s_t = s_d, differentiable through the mean (ds_d/dℓ_t = s_d/n_d; TRL
    `importance_sampling_level="sequence"`). "token" (GSPO-token, the paper's eq. 13; verl
    `gspo`): log s_t = log sg(s_d) + ℓ − sg(ℓ), value s_d, ds_t/dℓ_t = s_d, so a per-token
    advantage weights its own token. `guard` (`GspoGuard`) is applied to log s.
    """
    if level not in ("sequence", "token"):
        raise ValueError(f"level={level!r}: expected 'sequence' or 'token'")
    mean_log_ratio_D = sequence_mean(t, t.logprobs_T - t.sampler_logprobs_T)
    if level == "sequence":
        s_D = _guarded_exp(mean_log_ratio_D, guard)
        return s_D[t.seq_T], s_D
    log_s_T = mean_log_ratio_D.detach()[t.seq_T] + t.logprobs_T - t.logprobs_T.detach()
    return _guarded_exp(log_s_T, guard), _guarded_exp(mean_log_ratio_D.detach(), guard)


def _gspo_loss(
    batch: TokenData,
    level: GspoLevel,
    epsilon_low: float,
    epsilon_high: float,
    guard: GspoGuard,
    zero_adv: ZeroAdvantage,
) -> TokenLoss:
    t = pack(batch)
    s_T, s_D = gspo_ratio(t, level, guard)
    loss_T, keep_T = clipped_surrogate(t, s_T, 1 - epsilon_low, 1 + epsilon_high, zero_adv)
    metrics = {"gspo/seq_ratio_mean": _mean_over_sequences(t, s_D)}
    return TokenLoss(t, loss_T, keep_T, t.sampler_logprobs_T, metrics)


@loss_function(declared.GSPO)
def gspo(
    batch: TokenData,
    *,
    level: GspoLevel,
    epsilon_low: float,
    epsilon_high: float,
    log_ratio_guard: GspoGuard,
    zero_adv: ZeroAdvantage,
) -> TokenLoss:
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv 2507.18071):
    L_t = −min(s·A, clip(s, 1 − ε_lo, 1 + ε_hi)·A)·m with the length-normalised sequence ratio
    s_d = exp(mean_t (ℓ − ℓ_s)) (`gspo_ratio`), reduced by the paper's seq-mean-token-mean
    (= mean over sequences of the sequence loss). A sequence leaves the clip as a whole: every
    token of a clipped sequence has `kept_D = False`.

    With a constant advantage per sequence both levels have the same value and gradient; they
    differ only with per-token advantages. Defaults ε_lo = 3e-4, ε_hi = 4e-4 are the paper's.
    `log_ratio_guard`: "upper" (losslab), "verl" (clamp at 10, no gradient beyond), "none" (TRL).
    """
    return _gspo_loss(batch, level, epsilon_low, epsilon_high, log_ratio_guard, zero_adv)


@loss_function(declared.LUSPO)
def luspo(
    batch: TokenData,
    *,
    level: GspoLevel,
    epsilon_low: float,
    epsilon_high: float,
    log_ratio_guard: GspoGuard,
    zero_adv: ZeroAdvantage,
) -> TokenLoss:
    """LUSPO, length-unbiased sequence policy optimisation (TRL `loss_type="luspo"`, PR #4988;
    no paper id in TRL): GSPO's per-token loss reduced by seq-mean-token-sum, so each
    sequence's loss is multiplied by its length n_d, undoing GSPO's 1/n_d:
    L = (1/G)·Σ_d n_d·L_d. TRL before PR #6654 multiplied by n_d once more (a quadratic length
    bias); reproduce that with `reduction="sum"` and a per-sequence weight elsewhere, not here.
    TRL warns unless `importance_sampling_level="sequence"`, the default here.
    """
    return _gspo_loss(batch, level, epsilon_low, epsilon_high, log_ratio_guard, zero_adv)


@loss_function(declared.CISPO_EPS)
def cispo_eps(
    batch: TokenData,
    *,
    epsilon_meaning: CispoMeaning,
    epsilon_low: float | None,
    epsilon_high: float,
) -> TokenLoss:
    """CISPO (MiniMax-M1, arXiv 2506.13585) in the frameworks' epsilon parameterisations:
    L_t = −sg(w)·A·ℓ·m (value: the log-prob form), default reduction token-mean (TRL/Liger).

    Args:
        epsilon_meaning: "absolute_cap" (TRL `loss_type="cispo"`): w = min(r, ε_high), upper
            cap only, ε_high = 5.0 the recommended value; "one_plus_eps" (slime, AReaL, Miles):
            w = clip(r, 1 − ε_low, 1 + ε_high) with ε_high = 4.0 for the same 5.0 cap. The same
            number means different caps: ε_high = 4.0 is a cap of 4 in TRL and 5 in slime.
        epsilon_low: the lower offset (one_plus_eps only); None = no lower bound.
        epsilon_high: the cap (absolute_cap) or its offset from 1 (one_plus_eps).
    """
    t = pack(batch)
    r_T = sampler_ratio(t.logprobs_T, t.sampler_logprobs_T).detach()
    if epsilon_meaning == "absolute_cap":
        low, high = 0.0, epsilon_high
    else:
        low = 0.0 if epsilon_low is None else 1.0 - epsilon_low
        high = 1.0 + epsilon_high
    weight_T = r_T.clamp(low, high)
    loss_T = -weight_T * t.advantages_T * t.logprobs_T * t.mask_T
    extra = {"cispo/clip_fraction": _share(t, (r_T < low) | (r_T > high))}
    return TokenLoss(t, loss_T, torch.ones_like(t.loss_T), t.sampler_logprobs_T, extra)


# ---------------------------------------------------------------------------------------------
# The PPO family: Dr. GRPO's constant, DAPO's clip-higher, dual-clip.
# ---------------------------------------------------------------------------------------------


def dr_grpo_constant(
    t: PackedTokens,
    constant: DrGrpoConstant,
    max_completion_length: float,
    max_prompt_length: float,
) -> float:
    """Dr. GRPO's length constant C (the loss is Σ_d Σ_t L_dt / (G·C))."""
    if constant == "max_completion_length":
        return max_completion_length
    if constant == "max_seq_len":
        return max_prompt_length + max_completion_length
    if constant == "padded_width":
        return float(max(int(loss_counts_D(t).max()), 1)) if t.num_datums else 1.0
    raise ValueError(
        f"constant={constant!r}: expected max_completion_length, max_seq_len or padded_width"
    )


@loss_function(declared.DR_GRPO)
def dr_grpo(
    batch: TokenData,
    *,
    clip_low_threshold: float,
    clip_high_threshold: float,
    constant: DrGrpoConstant,
    max_completion_length: float,
    max_prompt_length: float,
    zero_adv: ZeroAdvantage,
) -> TokenLoss:
    """Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv 2503.20783):
    PPO's clipped surrogate divided by a CONSTANT length C instead of each response's length,
    L = Σ_d Σ_t L_dt / (G·C) (the per-token loss / C, reduced by seq-mean-token-sum; give
    `num_sequences` for the global G), so long responses are not down-weighted.

    Args:
        constant: what C is, one framework each: "max_completion_length" (TRL `dr_grpo`:
            `sum / (B · max_completion_length)`); "max_seq_len" (SkyRL `seq_mean_token_sum_norm`,
            C = max_prompt_length + max_completion_length, its `max_seq_len`); "padded_width"
            (verl `seq-mean-token-sum-norm`: C = the padded response width, here the longest
            datum's loss-token count, so C changes with the batch (verl #3741)).
        max_completion_length: C's completion budget in tokens (TRL default 256).
        max_prompt_length: SkyRL's prompt budget, read only with constant="max_seq_len".
    """
    t = pack(batch)
    ratio_T = sampler_ratio(t.logprobs_T, t.sampler_logprobs_T)
    loss_T, keep_T = clipped_surrogate(
        t, ratio_T, clip_low_threshold, clip_high_threshold, zero_adv
    )
    c = dr_grpo_constant(t, constant, max_completion_length, max_prompt_length)
    return TokenLoss(t, loss_T / c, keep_T, t.sampler_logprobs_T, {"dr_grpo/constant": c})


@loss_function(declared.DAPO)
def dapo(
    batch: TokenData, *, clip_low_threshold: float, clip_high_threshold: float, zero_adv
) -> TokenLoss:
    """DAPO's loss (Yu et al. 2025, arXiv 2503.14476): PPO's clipped surrogate with Clip-Higher
    (ε_lo = 0.2, ε_hi = 0.28: absolute bounds 0.8/1.28) and the token-level mean over the whole
    batch (`reduction="token-mean"`; give `num_tokens` for the global count, TRL #6024).
    Dynamic sampling and overlong shaping act on the data and the reward, not the loss."""
    t = pack(batch)
    ratio_T = sampler_ratio(t.logprobs_T, t.sampler_logprobs_T)
    loss_T, keep_T = clipped_surrogate(
        t, ratio_T, clip_low_threshold, clip_high_threshold, zero_adv
    )
    return TokenLoss(t, loss_T, keep_T, t.sampler_logprobs_T)


@loss_function(declared.DUAL_CLIP_PPO)
def dual_clip_ppo(
    batch: TokenData,
    *,
    clip_low_threshold: float,
    clip_high_threshold: float,
    clip_ratio_c: float,
    zero_adv: ZeroAdvantage,
) -> TokenLoss:
    """Dual-clip PPO (Ye et al. 2020, "Mastering Complex Control in MOBA Games", arXiv
    1912.09729; verl `vanilla` with `clip_ratio_c`, OpenRLHF `dual_clip`):
        L_t = min(PPO_t, −c·A)·m for A < 0, PPO_t·m otherwise, PPO_t = −min(rA, clip(r)A)
    so a negative-advantage token with r > c has the constant loss −c·A and no gradient
    (`kept_D = False`). verl's default c = 3."""
    t = pack(batch)
    ratio_T, a_T = sampler_ratio(t.logprobs_T, t.sampler_logprobs_T), t.advantages_T
    ppo_T, keep_T = clipped_surrogate(t, ratio_T, clip_low_threshold, clip_high_threshold, zero_adv)
    dual_T = (a_T < 0) & (ratio_T.detach() > clip_ratio_c)
    loss_T = torch.where(a_T < 0, torch.minimum(ppo_T, -clip_ratio_c * a_T * t.mask_T), ppo_T)
    keep_T = keep_T & ~(dual_T & t.loss_T)
    extra = {"dual_clip/fraction": _share(t, dual_T)}
    return TokenLoss(t, loss_T, keep_T, t.sampler_logprobs_T, extra)


# ---------------------------------------------------------------------------------------------
# Train/inference mismatch: rollout correction (TIS/MIS) and IcePop.
# ---------------------------------------------------------------------------------------------


def correction_weights(
    t: PackedTokens,
    *,
    anchor: Anchor,
    level: CorrectionLevel,
    mode: CorrectionMode,
    lower: float,
    cap: float,
    loss: str,
) -> tuple[Tensor, Tensor, Tensor]:
    """(detached weight w per token [T], keep [T], affected [T]) of the rollout correction;
    affected: the loss tokens whose weight was truncated or masked.

    The raw log-weight is log w = ℓ_a − ℓ_s with ℓ_a = sg(ℓ) (anchor "sampler": current vs
    rollout) or ℓ_o ("recomputed": trainer old vs rollout), per token, or summed over the
    datum's loss tokens (level "sequence": the product of the token ratios). "truncate" (TIS):
    w = clip(w, lower, cap) (slime's `tis_clip_low`; lower 0 = one-sided), every token kept; "mask" (MIS, IcePop): w kept where lower ≤ w ≤ cap,
    else w = 0 and the token dropped. Computed in log space, so a sequence weight never
    overflows.
    """
    if level not in ("token", "sequence") or mode not in ("truncate", "mask"):
        raise ValueError(f"level={level!r}, mode={mode!r}: expected token|sequence, truncate|mask")
    pair_T = t.logprobs_T.detach() if anchor == "sampler" else _old_logprobs(t, loss)
    log_w_T = torch.where(t.loss_T, pair_T - t.sampler_logprobs_T, torch.zeros_like(pair_T))
    if level == "sequence":
        log_w_T = sequence_sum(t, log_w_T)[t.seq_T]
    log_cap = math.log(cap)
    log_lower = math.log(lower) if lower > 0 else -math.inf
    if mode == "truncate":
        weight_T = torch.exp(log_w_T.clamp(min=log_lower, max=log_cap))
        affected_T = ((log_w_T > log_cap) | (log_w_T < log_lower)) & t.loss_T
        return weight_T, torch.ones_like(t.loss_T), affected_T
    inside_T = (log_w_T >= log_lower) & (log_w_T <= log_cap)
    weight_T = torch.where(inside_T, torch.exp(torch.where(inside_T, log_w_T, 0.0)), 0.0)
    return weight_T, inside_T | ~t.loss_T, ~inside_T & t.loss_T


def corrected_policy_loss(
    t: PackedTokens,
    weight_T: Tensor,
    keep_T: Tensor,
    *,
    anchor: Anchor,
    clip_low_threshold: float,
    clip_high_threshold: float,
    surrogate: Surrogate,
    zero_adv: ZeroAdvantage,
    loss: str,
) -> tuple[Tensor, Tensor]:
    """The policy loss under a detached correction weight w, and its keep mask.

    anchor "sampler" (bypass: the weight is the importance ratio itself): gradient −A·w·∇ℓ,
    value −A·w ("ratio", as prime-rl's −r·A·M) or −A·sg(w)·ℓ ("logprob", verl's bypass
    REINFORCE). anchor "recomputed" (decoupled PPO, TRL's vLLM IS correction, AReaL, Ring-1T):
    −w·min(ρA, clip(ρ)A)·m with the PPO ratio ρ = π_θ/π_o clipped at the thresholds.
    """
    a_T, m_T = t.advantages_T, t.mask_T
    if anchor == "sampler":
        if surrogate == "ratio":  # value −A·w, gradient −A·w (1 + ℓ − sg(ℓ) is 1 with slope 1)
            return -a_T * weight_T * (1 + t.logprobs_T - t.logprobs_T.detach()) * m_T, keep_T
        return -a_T * weight_T * t.logprobs_T * m_T, keep_T
    rho_T = sampler_ratio(t.logprobs_T, _old_logprobs(t, loss))
    ppo_T, ppo_keep_T = clipped_surrogate(
        t, rho_T, clip_low_threshold, clip_high_threshold, zero_adv
    )
    return weight_T * ppo_T, keep_T & ppo_keep_T


def corrected_loss(
    t: PackedTokens,
    loss: str,
    anchor: Anchor,
    level: CorrectionLevel,
    mode: CorrectionMode,
    bounds: tuple[float, float],
    policy: tuple[float, float, Surrogate, ZeroAdvantage],
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(weight [T], loss [T], keep [T], affected [T]) of a rollout-corrected loss: the
    `correction_weights` within `bounds` = (lower, cap), then `corrected_policy_loss` under them
    with `policy` = (clip_low_threshold, clip_high_threshold, surrogate, zero_adv)."""
    lower, cap = bounds
    weight_T, keep_T, affected_T = correction_weights(
        t, anchor=anchor, level=level, mode=mode, lower=lower, cap=cap, loss=loss
    )
    clip_low, clip_high, surrogate, zero_adv = policy
    loss_T, keep_T = corrected_policy_loss(
        t,
        weight_T,
        keep_T,
        anchor=anchor,
        clip_low_threshold=clip_low,
        clip_high_threshold=clip_high,
        surrogate=surrogate,
        zero_adv=zero_adv,
        loss=loss,
    )
    return weight_T, loss_T, keep_T, affected_T


@loss_function(declared.ROLLOUT_CORRECTION)
def rollout_correction(
    batch: TokenData,
    *,
    level: CorrectionLevel,
    mode: CorrectionMode,
    cap: float,
    lower: float,
    anchor: Anchor,
    clip_low_threshold: float,
    clip_high_threshold: float,
    surrogate: Surrogate,
    zero_adv: ZeroAdvantage,
) -> TokenLoss:
    """Rollout correction for the trainer/inference mismatch (Yao et al. 2025, "Your Efficient
    RL Framework Secretly Brings You Off-Policy RL Training", fengyao.notion.site/off-policy-rl;
    verl `rollout_corr_helper.py`, TRL `vllm_importance_sampling_mode`):
        L_t = policy loss × w, w = the token or sequence IS weight, truncated (TIS) or masked (MIS)
    (`correction_weights`, `corrected_policy_loss`). TRL's four modes are level × mode
    (`token_truncate`, `token_mask`, `sequence_truncate`, `sequence_mask`, cap 3.0 there);
    verl's default threshold is 2.0.
    """
    t = pack(batch)
    policy = (clip_low_threshold, clip_high_threshold, surrogate, zero_adv)
    weight_T, loss_T, keep_T, affected_T = corrected_loss(
        t, "rollout_correction", anchor, level, mode, (lower, cap), policy
    )
    on_T = t.loss_T
    n = int(on_T.sum())
    extra = {
        "rollout_correction/weight_mean": float(weight_T[on_T].double().mean()) if n else 0.0,
        "rollout_correction/affected_fraction": _share(t, affected_T),
    }
    return TokenLoss(t, loss_T, keep_T, t.sampler_logprobs_T, extra)


@loss_function(declared.ICEPOP)
def icepop(
    batch: TokenData,
    *,
    low: float,
    high: float,
    anchor: Anchor,
    clip_low_threshold: float,
    clip_high_threshold: float,
    surrogate: Surrogate,
    zero_adv: ZeroAdvantage,
) -> TokenLoss:
    """IcePop (Ring-1T, arXiv 2510.18855; INTELLECT-3, arXiv 2512.16144): a token whose
    train/inference ratio k leaves [low, high] loses its gradient; inside, the loss is weighted
    by k: L_t = k·[low ≤ k ≤ high]·(policy loss). That is `rollout_correction` at token level
    in mask mode; the bounds are [0.5, 5] in rllm/AReaL, [0.2, 5] in prime-rl. `anchor` picks
    the ratio pair: "sampler" k = π_θ/π_s (prime-rl, rllm), "recomputed" k = π_o/π_s with a PPO
    ratio π_θ/π_o (Ring-1T, AReaL's proximal/behave)."""
    t = pack(batch)
    policy = (clip_low_threshold, clip_high_threshold, surrogate, zero_adv)
    _, loss_T, keep_T, masked_T = corrected_loss(
        t, "icepop", anchor, "token", "mask", (low, high), policy
    )
    extra = {"icepop/mask_fraction": _share(t, masked_T)}
    return TokenLoss(t, loss_T, keep_T, t.sampler_logprobs_T, extra)


# ---------------------------------------------------------------------------------------------
# Soft and geometric trust regions: SAPO, GMPO.
# ---------------------------------------------------------------------------------------------


@loss_function(declared.SAPO)
def sapo(batch: TokenData, *, tau_pos: float, tau_neg: float) -> TokenLoss:
    """SAPO, soft adaptive policy optimisation (Gao et al. 2025, Qwen, arXiv 2511.20347; verl
    `sapo`, TRL `sapo`): the hard clip becomes a soft gate,
        L_t = −(4/τ)·σ(τ(r − 1))·A·m,   τ = τ_pos if A > 0 else τ_neg,
    whose gradient −A·w·r with w = 4σ(1 − σ) is 1 at r = 1 and decays smoothly off-policy
    (`sapo/gate_weight_mean` is the mean w). No token is dropped (`kept_D` all True). Default
    reduction seq-mean-token-mean as verl (TRL and Liger's "GRPO-style" normaliser is the same
    mean of per-sequence means).
    """
    t = pack(batch)
    ratio_T, a_T = sampler_ratio(t.logprobs_T, t.sampler_logprobs_T), t.advantages_T
    # full_like keeps the batch's dtype (torch.where of two Python floats is float32)
    tau_T = torch.where(a_T > 0, torch.full_like(a_T, tau_pos), torch.full_like(a_T, tau_neg))
    sigma_T = torch.sigmoid(tau_T * (ratio_T - 1))
    loss_T = -(4 / tau_T) * sigma_T * a_T * t.mask_T
    weight_T = (4 * sigma_T * (1 - sigma_T)).detach()
    n = int(t.loss_T.sum())
    extra = {"sapo/gate_weight_mean": float(weight_T[t.loss_T].double().mean()) if n else 0.0}
    return TokenLoss(t, loss_T, torch.ones_like(t.loss_T), t.sampler_logprobs_T, extra)


@loss_function(declared.GMPO)
def gmpo(
    batch: TokenData,
    *,
    log_ratio_low: float,
    log_ratio_high: float,
    log_ratio_guard: LogRatioGuard,
    zero_adv: ZeroAdvantage,
) -> TokenLoss:
    """GMPO, geometric-mean policy optimisation (Zhao et al. 2025, arXiv 2507.20673; reference
    callsys/GMPO, verl `geo_mean`): the sequence objective is the GEOMETRIC mean of its token
    ratios, each clipped in log space against the advantage's sign,
        Δ̃_t = sgn(A)·min(sgn(A)·Δ_t, sgn(A)·clip(Δ_t, −lo, hi)),   Δ = ℓ − ℓ_s
        L_d = −Ā_d·exp(mean_t Δ̃_t)     (Ā_d the mean advantage over d's loss tokens)
    reduced as the mean over sequences (L_d/n_d on each loss token, seq-mean-token-sum). A
    token whose log-ratio is clipped has no gradient (`kept_D = False`). The paper's ε = 0.4
    bounds the LOG ratio (ratios in [e^−0.4, e^0.4]), not r. `log_ratio_guard` acts on Δ first
    (`guarded_log_ratio`; "none" is verl's, which takes Δ bare).
    """
    t = pack(batch)
    a_T = t.advantages_T
    # the guard acts on Δ before the sign-min; verl `geo_mean` has none (log_ratio_guard="none")
    log_ratio_T = guarded_log_ratio(t.logprobs_T - t.sampler_logprobs_T, log_ratio_guard)
    sign_T = torch.sign(a_T)
    clipped_T = log_ratio_T.clamp(-log_ratio_low, log_ratio_high)
    chosen_T = sign_T * torch.minimum(sign_T * log_ratio_T, sign_T * clipped_T)
    g_D = exp_capped(sequence_mean(t, chosen_T))
    n_D = loss_counts_D(t).clamp_min(1)
    loss_D = -sequence_mean(t, a_T) * g_D
    loss_T = torch.where(t.loss_T, (loss_D / n_D)[t.seq_T], torch.zeros_like(log_ratio_T))
    keep_T = trust_region(
        a_T,
        t.loss_T,
        leaves_up_T=log_ratio_T.detach() > log_ratio_high,
        leaves_down_T=log_ratio_T.detach() < -log_ratio_low,
        zero_adv=zero_adv,
    )
    metrics = {"gmpo/seq_ratio_mean": _mean_over_sequences(t, g_D)}
    return TokenLoss(t, loss_T, keep_T, t.sampler_logprobs_T, metrics)


# ---------------------------------------------------------------------------------------------
# Batch-scoped masks: Clip-Cov, KL-Cov (entropy mechanism), M2PO. Each selects tokens by a
# statistic over the whole batch it is given (declared batch_scope="batch").
# ---------------------------------------------------------------------------------------------


def token_covariance(t: PackedTokens) -> Tensor:
    """cov_t = (A_t − Ā)·(ℓ_t − ℓ̄), means over the batch's loss tokens (detached; Cui et al.
    2025's centred product of advantage and log-prob, verl `clip_cov`/`kl_cov`)."""
    on_T = t.loss_T
    logp_T = t.logprobs_T.detach()
    n = max(int(on_T.sum()), 1)
    a_mean = t.advantages_T[on_T].sum() / n
    logp_mean = logp_T[on_T].sum() / n
    return (t.advantages_T - a_mean) * (logp_T - logp_mean)


@loss_function(declared.KL_COV)
def kl_cov(
    batch: TokenData, *, kl_cov_ratio: float, kl_coef: float, log_ratio_guard: LogRatioGuard
) -> TokenLoss:
    """KL-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning
    Language Models", arXiv 2505.22617; reference PRIME-RL/Entropy-Mechanism-of-RL, verl
    `kl_cov`): L_t = −A·r·m, plus kl_coef·|ℓ − ℓ_s| on the k = max(1, ⌊N·kl_cov_ratio⌋) loss
    tokens of largest covariance (`token_covariance`; none when the ratio is 0). The top-k is
    over the batch given, so the loss is declared batch-scoped. `log_ratio_guard` guards r
    ("none": verl and SkyRL's plain exp); `kl_coef` is verl's `ppo_kl_coef` (0.1 there, 1.0 in
    SkyRL, whose `kl_cov_frac` default is 0.2).
    """
    t = pack(batch)
    ratio_T = guarded_ratio(t.logprobs_T, t.sampler_logprobs_T, log_ratio_guard)
    loss_T = -t.advantages_T * ratio_T * t.mask_T
    selected_T = torch.zeros_like(t.loss_T)
    n = int(t.loss_T.sum())
    if kl_cov_ratio > 0 and n:
        k = max(1, int(n * kl_cov_ratio))
        on_idx = t.loss_T.nonzero().squeeze(-1)
        top = torch.topk(token_covariance(t)[on_idx], k, largest=True).indices
        selected_T[on_idx[top]] = True
    kl_T = kl_coef * (t.logprobs_T - t.sampler_logprobs_T).abs() * t.mask_T
    loss_T = torch.where(selected_T, loss_T + kl_T, loss_T)
    extra = {"kl_cov/selected_fraction": _share(t, selected_T)}
    return TokenLoss(t, loss_T, torch.ones_like(t.loss_T), t.sampler_logprobs_T, extra)


@loss_function(declared.CLIP_COV)
def clip_cov(
    batch: TokenData,
    *,
    clip_low_threshold: float,
    clip_high_threshold: float,
    clip_cov_ratio: float,
    clip_cov_lb: float,
    clip_cov_ub: float,
    seed: float,
    log_ratio_guard: LogRatioGuard,
    zero_adv: ZeroAdvantage,
) -> TokenLoss:
    """Clip-Cov (Cui et al. 2025, arXiv 2505.22617; verl `clip_cov`): PPO's clipped surrogate,
    with up to max(1, ⌊N·clip_cov_ratio⌋) tokens drawn at random among the loss tokens that the
    PPO clip left alone and whose covariance lies in (lb, ub) set to loss 0 and no gradient.
    The draw uses a generator seeded by `seed` (verl draws from torch's global RNG, so its
    choice is not reproducible across processes; compare against it with a selection of one
    candidate or none). `log_ratio_guard` guards r ("none": verl and SkyRL's plain exp).
    """
    t = pack(batch)
    ratio_T = guarded_ratio(t.logprobs_T, t.sampler_logprobs_T, log_ratio_guard)
    loss_T, keep_T = clipped_surrogate(
        t, ratio_T, clip_low_threshold, clip_high_threshold, zero_adv
    )
    cov_T = token_covariance(t)
    candidates = ((cov_T > clip_cov_lb) & (cov_T < clip_cov_ub) & keep_T & t.loss_T).nonzero()
    candidates = candidates.squeeze(-1)
    # ranked by covariance before the draw, so the choice does not depend on the datums' order
    candidates = candidates[torch.argsort(cov_T[candidates], stable=True)]
    selected_T = torch.zeros_like(t.loss_T)
    n = int(t.loss_T.sum())
    if clip_cov_ratio > 0 and n and len(candidates):
        k = min(max(1, int(n * clip_cov_ratio)), len(candidates))
        generator = torch.Generator().manual_seed(int(seed))
        pick = torch.randperm(len(candidates), generator=generator)[:k]
        selected_T[candidates[pick.to(candidates.device)]] = True
    loss_T = torch.where(selected_T, torch.zeros_like(loss_T), loss_T)
    extra = {"clip_cov/selected_fraction": _share(t, selected_T)}
    return TokenLoss(t, loss_T, keep_T & ~selected_T, t.sampler_logprobs_T, extra)


def second_moment_mask(t: PackedTokens, tau: float) -> tuple[Tensor, float]:
    """(keep [T], M2 before masking): drop the loss tokens of largest (ℓ − ℓ_s)² until the
    mean of (ℓ − ℓ_s)² over the loss tokens left is ≤ τ (M2PO's batch-level mask)."""
    keep_T = torch.ones_like(t.loss_T)
    on_idx = t.loss_T.nonzero().squeeze(-1)
    if not len(on_idx):
        return keep_T, 0.0
    sq_N = ((t.logprobs_T - t.sampler_logprobs_T).detach()[on_idx] ** 2).double()
    order = torch.argsort(sq_N, descending=True)
    sorted_N = sq_N[order]
    n = len(sorted_N)
    # the mean of what is left after dropping the k largest, for k = 0..n-1
    remaining_sum_K = sorted_N.sum() - torch.cat([sorted_N.new_zeros(1), sorted_N.cumsum(0)[:-1]])
    remaining_mean_K = remaining_sum_K / torch.arange(n, 0, -1, dtype=sorted_N.dtype)
    fits = (remaining_mean_K <= tau).nonzero()
    k = int(fits[0]) if len(fits) else n
    keep_T[on_idx[order[:k]]] = False
    return keep_T, float(sorted_N.mean())


@loss_function(declared.M2PO)
def m2po(batch: TokenData, *, tau: float) -> TokenLoss:
    """M2PO, second-moment trust policy optimisation (Zheng et al. 2025, arXiv 2510.01161;
    reference Infini-AI-Lab/M2PO): instead of clipping each ratio, mask the tokens of largest
    (log r)² until the batch's second moment M2 = mean (log r)² over the kept loss tokens is
    ≤ τ (0.04), then L_t = −A·r·M·m. M2 is a statistic of the WHOLE optimizer batch, so the
    loss is batch-scoped: `loss_function` refuses global counts larger than the batch given
    (a gradient-accumulation split would mask each micro-batch by its own M2). losslab's
    `updates_per_batch` minibatches are each an optimizer step, so there it is exact.
    """
    t = pack(batch)
    ratio_T = sampler_ratio(t.logprobs_T, t.sampler_logprobs_T)
    keep_T, second_moment = second_moment_mask(t, tau)
    loss_T = -t.advantages_T * ratio_T * keep_T.to(ratio_T.dtype) * t.mask_T
    extra = {"m2po/second_moment": second_moment, "m2po/masked_fraction": _share(t, ~keep_T)}
    return TokenLoss(t, loss_T, keep_T, t.sampler_logprobs_T, extra)
