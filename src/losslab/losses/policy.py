"""Policy losses over ragged token data in the Tinker convention.

Notation per token t: ℓ current log-prob (differentiated), ℓ_s sampler
(rollout) log-prob, ℓ_o recomputed old log-prob, p = e^ℓ, r = e^(ℓ − ℓ_s), A advantage,
m loss mask, sg(·) stop-gradient, M the trust-region keep mask (detached, 0 or 1).

Each loss is a function of the per-token loss (weighted by m) and its keep mask, bound to its
declaration (`losses/declarations.py`: parameters, domains, metric keys) by `@loss_function`,
which resolves the parameters, reduces by `reduction=` (`sum` is Tinker's convention, see
`reductions.py`) with the global counts and measures the standard metrics: the one place that
does so. Conventions shared by all losses:

* Log-ratio clamp: ℓ − ℓ_s is clamped from above at `LOG_RATIO_MAX` = 20 before `exp` (as
  Stable-RL), so r ≤ e^20 ≈ 4.9e8 and never overflows float32. The clamp bounds the VALUE only;
  the gradient passes straight through (dr/dℓ = r), so both surrogates keep the same gradient
  −A·min(r, c)·M for any log-ratio. There is no lower clamp: e^x underflows harmlessly to 0.
* The importance ratio r is taken against the SAMPLER log-probs, the policy that drew the
  tokens; DPPO's `anchor` only chooses the trust region's reference (Stable-RL: "w is always
  taken against the rollout log-prob, even in the *_recompute modes"). `weight_anchor` exists
  only to reproduce verl's non-bypass `dppo_tv`, which takes the weight against old too.
* Inputs at masked positions are replaced by 0 with `torch.where` before anything is computed,
  so NaN/inf there never reach the loss or the gradient; an all-masked batch gives loss 0 and a
  zero gradient for every datum's log-probs.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, get_args

import torch
from torch import Tensor

from losslab.losses import declarations as declared
from losslab.losses.data import PackedTokens, TokenData, pack
from losslab.losses.declarations import (
    REDUCTION_PARAMS,
    Anchor,
    LogRatioGuard,
    LossDeclaration,
    PpoSurrogate,
    Reduction,
    Surrogate,
    ZeroAdvantage,
)
from losslab.losses.reductions import reduce_loss

LOG_RATIO_MAX = 20.0
"""Upper clamp on ℓ − ℓ_s before exp (Stable-RL's bound): r ≤ e^20."""

KL_EPS = 1e-8
"""Stable-RL's epsilon inside the binary KL's log((1 − p_a + ε) / (1 − p + ε))."""


@dataclass
class LossOutput:
    """What every loss returns."""

    loss: Tensor
    """0-d, differentiable w.r.t. every `logprobs_D` entry."""
    metrics: dict[str, float]
    """Namespaced metrics (`loss/value`, `loss/clip_fraction`, `ratio/q90`, ... see docs/interfaces.md)."""
    kept_D: list[Tensor]
    """Bool per token: False where the clip/trust-region rule zeroed the gradient (True off the loss)."""


# ---------------------------------------------------------------------------------------------
# Shared pieces: the ratio, the trust-region keep mask, the policy-gradient surrogate.
# ---------------------------------------------------------------------------------------------


def sampler_ratio(logprobs_T: Tensor, sampler_logprobs_T: Tensor) -> Tensor:
    """r = exp(min(ℓ − ℓ_s, 20)) in value, with gradient dr/dℓ = r (straight through the clamp)."""
    log_ratio_T = logprobs_T - sampler_logprobs_T
    excess_T = (log_ratio_T - LOG_RATIO_MAX).clamp_min(0).detach()
    return torch.exp(log_ratio_T - excess_T)


def guarded_ratio(logprobs_T: Tensor, anchor_logprobs_T: Tensor, guard: LogRatioGuard) -> Tensor:
    """r = exp(ℓ − ℓ_a) under one of the `LogRatioGuard` conventions (value and gradient)."""
    log_ratio_T = logprobs_T - anchor_logprobs_T
    if guard == "upper":
        return sampler_ratio(logprobs_T, anchor_logprobs_T)
    if guard == "both":
        clamped_T = log_ratio_T.clamp(-LOG_RATIO_MAX, LOG_RATIO_MAX)
        return torch.exp(log_ratio_T - (log_ratio_T - clamped_T).detach())
    if guard == "zero_grad":
        return torch.exp(log_ratio_T.clamp(-LOG_RATIO_MAX, LOG_RATIO_MAX))
    if guard == "none":
        return torch.exp(log_ratio_T)
    raise ValueError(
        f"log_ratio_guard={guard!r}: expected one of {', '.join(get_args(LogRatioGuard))}"
    )


def trust_region(
    advantages_T: Tensor,
    loss_T: Tensor,
    *,
    leaves_up_T: Tensor,
    leaves_down_T: Tensor,
    zero_adv: ZeroAdvantage,
) -> Tensor:
    """Keep mask M = 1 − [A > 0 ? leaves_up : leaves_down], detached, as Stable-RL's
    `_compute_token_mask_for_policy_loss`: a token is dropped when it already left the trust
    region in the direction its advantage pushes it.

    `zero_adv` says which branch A = 0 tokens take. "negative" follows Stable-RL (A ≤ 0 takes
    the down branch); "keep" follows Tinker/Spindle (A = 0 is never clipped). Both give the same
    loss and gradient (an A = 0 token contributes 0 either way); only `kept_D` and the
    clip-fraction metrics over all loss tokens differ. Off the loss (m = 0) M is 1.
    """
    if zero_adv not in ("keep", "negative"):
        raise ValueError(f"zero_adv={zero_adv!r}: expected 'keep' or 'negative'")
    out_T = torch.where(advantages_T > 0, leaves_up_T, leaves_down_T)
    if zero_adv == "keep":
        out_T = out_T & (advantages_T != 0)
    return ~(out_T & loss_T)


def policy_gradient(
    tokens: PackedTokens, ratio_T: Tensor, keep_T: Tensor, surrogate: Surrogate, clip_ratio_c: float
) -> Tensor:
    """Masked importance-sampled policy gradient, two value conventions with ONE gradient.

    * "ratio" (Spindle `dppo`, SkyRL `dppo`, the paper's surrogate): value −A·min(r, c)·M·m,
      written r·sg(min(1, c/r)) so the gradient is −A·min(r, c)·M·m (truncated IS). With
      c = inf this is exactly −A·r·M·m, Spindle's and SkyRL's form.
    * "logprob" (Stable-RL `compute_policy_loss_with_mask`): value −A·sg(min(r, c))·M·m·ℓ,
      gradient −A·min(r, c)·M·m.

    The gradients agree wherever r < c, and (with the same c) in fact everywhere; the VALUES
    differ, so compare values only within one convention. In both the cap acts as a detached
    weight: for r > c the "ratio" value is flat (−A·c) while its gradient is −A·c, as in
    truncated IS, so finite differences of the value only match the gradient where r < c.
    """
    if surrogate not in ("ratio", "logprob"):
        raise ValueError(f"surrogate={surrogate!r}: expected 'ratio' or 'logprob'")
    m_T, a_T = tokens.mask_T, tokens.advantages_T
    kept_T = keep_T.to(ratio_T.dtype)
    if surrogate == "ratio":
        if math.isinf(clip_ratio_c):  # no cap: weight 1 (also where an unguarded r is inf)
            return -a_T * ratio_T * kept_T * m_T
        weight_T = (clip_ratio_c / ratio_T).clamp(max=1.0).detach()  # sg(min(1, c/r))
        return -a_T * ratio_T * weight_T * kept_T * m_T
    return -a_T * ratio_T.clamp(max=clip_ratio_c).detach() * kept_T * m_T * tokens.logprobs_T


def _quantiles(x_T: Tensor) -> tuple[float, float, float]:
    """(mean, q50, q90) in float64; NaN when there is no loss token."""
    if x_T.numel() == 0:
        return math.nan, math.nan, math.nan
    x_T = x_T.detach().double()
    q = torch.quantile(x_T, torch.tensor([0.5, 0.9], dtype=torch.float64, device=x_T.device))
    return float(x_T.mean()), float(q[0]), float(q[1])


@dataclass
class TokenLoss:
    """What a loss function computes, before reduction (`loss_function` reduces and measures)."""

    tokens: PackedTokens
    loss_T: Tensor
    """Per-token loss, already weighted by the mask m (0 off the loss)."""
    keep_T: Tensor
    """Bool keep mask M: False where the clip/trust-region rule zeroed the gradient."""
    anchor_logprobs_T: Tensor
    """The drift statistics' reference (the trust region's anchor)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """The loss's own keys (its declaration's `extra_metrics`)."""
    penalty_T: Tensor | None = None
    """The part of `loss_T` that is not the policy gradient (DRO's ½β(ℓ − ℓ_s)², DPPO's
    kl_tau term), weighted by m; None: `loss_T` is all policy gradient."""


def clip_fractions(tokens: PackedTokens, keep_T: Tensor) -> tuple[float, float, int]:
    """(share of loss tokens the keep mask dropped, the same share over tokens with A != 0, the
    dropped count): the first is `loss/clip_fraction`, the second Stable-RL's `pg_clipfrac`."""
    on_T = tokens.loss_T
    nonzero_T = on_T & (tokens.advantages_T != 0)
    dropped_T = ~keep_T & on_T
    n, n_nonzero = int(on_T.sum()), int(nonzero_T.sum())
    masked = int(dropped_T.sum())
    fraction = masked / n if n else 0.0
    fraction_nonzero = int((dropped_T & nonzero_T).sum()) / n_nonzero if n_nonzero else 0.0
    return fraction, fraction_nonzero, masked


def pg_grad_norm(
    per_token: TokenLoss, reduction: Reduction, counts: dict[str, float | None]
) -> float:
    """|dL_pg/dℓ|: the norm of the gradient of the reduced policy-gradient part alone (the loss
    minus its `penalty_T`) with respect to the loss tokens' log-probs, in float64. NaN when the
    log-probs carry no gradient (nothing to measure); the graph is kept for the real backward."""
    tokens = per_token.tokens
    pg_T = per_token.loss_T
    if per_token.penalty_T is not None:
        pg_T = pg_T - per_token.penalty_T
    if not (tokens.logprobs_T.requires_grad and pg_T.requires_grad):
        return math.nan
    pg = reduce_loss(pg_T, tokens, reduction, **counts)
    (grad_T,) = torch.autograd.grad(pg, tokens.logprobs_T, retain_graph=True, allow_unused=True)
    if grad_T is None:
        return 0.0
    return float(grad_T.detach().double().norm())


def _output(
    per_token: TokenLoss, reduction: Reduction, counts: dict[str, float | None]
) -> LossOutput:
    """Reduce, then measure: clip fractions, ratio and drift statistics over loss tokens, and
    the policy-gradient part's gradient norm."""
    tokens, keep_T = per_token.tokens, per_token.keep_T
    loss = reduce_loss(per_token.loss_T, tokens, reduction, **counts)
    grad_norm = pg_grad_norm(per_token, reduction, counts)
    on_T = tokens.loss_T
    fraction, fraction_nonzero, masked = clip_fractions(tokens, keep_T)
    with torch.no_grad():
        ratio_T = sampler_ratio(tokens.logprobs_T, tokens.sampler_logprobs_T)[on_T]
        drift_T = (tokens.logprobs_T.exp() - per_token.anchor_logprobs_T.exp()).abs()[on_T]
    ratio_mean, ratio_q50, ratio_q90 = _quantiles(ratio_T)
    _, drift_q50, drift_q90 = _quantiles(drift_T)
    metrics = {
        "loss/value": float(loss.detach()),
        "loss/tokens": float(int(on_T.sum())),
        "loss/clip_fraction": fraction,
        "loss/clip_fraction_nonzero_adv": fraction_nonzero,
        "loss/masked_count": float(masked),
        "ratio/mean": ratio_mean,
        "ratio/q50": ratio_q50,
        "ratio/q90": ratio_q90,
        "drift/abs_p_q50": drift_q50,
        "drift/abs_p_q90": drift_q90,
        "loss/pg_grad_norm": grad_norm,
        **per_token.metrics,
    }
    kept_D = list(torch.split(keep_T.detach(), tokens.lengths_D))
    return LossOutput(loss=loss, metrics=metrics, kept_D=kept_D)


def _refuse_partial_batch(
    name: str, batch: TokenData, num_tokens: float | None, num_sequences: float | None
) -> None:
    """A batch-scoped loss (`LossDeclaration.batch_scope`) must see its whole optimizer batch:
    global counts other than this batch's own say it is a part of one (gradient accumulation),
    where its batch statistic would be another algorithm's."""
    tokens = sum(int((m_T > 0).sum()) for m_T in batch.mask_D)
    sequences = sum(int(bool((m_T > 0).any())) for m_T in batch.mask_D)
    for key, given, local in (
        ("num_tokens", num_tokens, tokens),
        ("num_sequences", num_sequences, sequences),
    ):
        if given is not None and given != local:
            raise ValueError(
                f"loss {name!r} is batch-scoped (its mask is a statistic of the whole optimizer "
                f"batch) but {key}={given:g} says this batch of {local} is part of a larger "
                "one; call it on the whole batch (one update per optimizer step, no gradient "
                "accumulation)"
            )


def loss_function(
    declaration: LossDeclaration,
) -> Callable[[Callable[..., TokenLoss]], Callable[..., LossOutput]]:
    """Bind a per-token loss function to its declaration (`losses/declarations.py`).

    The function takes `batch` and, keyword-only, exactly its declaration's own parameters in
    order (not `reduction`/`norm_constant`), and returns a `TokenLoss`. The bound loss
    `loss(batch, *, num_tokens=None, num_sequences=None, **params) -> LossOutput` resolves
    `params` by the declaration (defaults, domains, rules, aliases), calls the function, reduces
    with `reduction` and the global counts, measures the standard metrics and refuses an output
    whose metric keys are not the declared ones. `loss.declaration` is the declaration.

    Raises:
        TypeError: (at import) the function's parameters are not the declared ones.
    """

    def bind(per_token: Callable[..., TokenLoss]) -> Callable[..., LossOutput]:
        own = [key for key in declaration.params if key not in REDUCTION_PARAMS]
        signature = inspect.signature(per_token)
        keywords = [p.name for p in signature.parameters.values() if p.kind is p.KEYWORD_ONLY]
        if keywords != own:
            raise TypeError(
                f"{per_token.__qualname__}: keyword parameters ({', '.join(keywords)}) are not "
                f"loss {declaration.name!r}'s declared ones ({', '.join(own)}), in order"
            )
        expected_metrics = set(declaration.metrics)

        @functools.wraps(per_token)
        def loss(
            batch: TokenData,
            *,
            num_tokens: float | None = None,
            num_sequences: float | None = None,
            **params: Any,
        ) -> LossOutput:
            values = declaration.resolve(params)
            if declaration.batch_scope == "batch":
                _refuse_partial_batch(declaration.name, batch, num_tokens, num_sequences)
            reduction = values.pop("reduction")
            counts = dict(
                num_tokens=num_tokens,
                num_sequences=num_sequences,
                norm_constant=values.pop("norm_constant"),
            )
            out = _output(per_token(batch, **values), reduction, counts)
            if out.metrics.keys() != expected_metrics:
                raise RuntimeError(
                    f"loss {declaration.name!r} logged {sorted(out.metrics)}, not its declared "
                    f"metrics {sorted(expected_metrics)}; fix the function or its declaration"
                )
            return out

        batch_param = next(iter(signature.parameters.values()))
        keyword = inspect.Parameter.KEYWORD_ONLY
        loss.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[
                batch_param,
                *(
                    inspect.Parameter(key, keyword, default=default)
                    for key, default in declaration.defaults.items()
                ),
                inspect.Parameter("num_tokens", keyword, default=None),
                inspect.Parameter("num_sequences", keyword, default=None),
            ],
            return_annotation=LossOutput,
        )
        loss.declaration = declaration  # type: ignore[attr-defined]
        return loss

    return bind


def _all_kept(tokens: PackedTokens) -> Tensor:
    return torch.ones_like(tokens.loss_T)


# ---------------------------------------------------------------------------------------------
# The losses. Each reads like its equation; its declaration (losses/declarations.py) holds its
# defaults and domains, and `loss_function` reduces (`reduction=`, global counts) and measures.
# ---------------------------------------------------------------------------------------------


@loss_function(declared.IMPORTANCE_SAMPLING)
def importance_sampling(
    batch: TokenData, *, surrogate: Surrogate, clip_ratio_c: float
) -> TokenLoss:
    """Tinker `importance_sampling` (https://tinker-docs.thinkingmachines.ai/losses; Spindle `_loss`):
    L = −Σ_t m·r·A, r = e^(ℓ − ℓ_s). Value convention: the surrogate sum (Tinker's `loss:sum`).

    Args:
        surrogate: "ratio" (Tinker, default) or "logprob", Stable-RL's value −A·sg(min(r,c))·ℓ;
            with `clip_ratio_c=10` the latter is Stable-RL's `pg_no_mask` mode.
        clip_ratio_c: cap c on the importance weight (truncated IS, gradient −A·min(r, c)).
            Default inf = Tinker's uncapped r; do not cap when reproducing Tinker.
    """
    t = pack(batch)
    ratio_T = sampler_ratio(t.logprobs_T, t.sampler_logprobs_T)
    keep_T = _all_kept(t)
    loss_T = policy_gradient(t, ratio_T, keep_T, surrogate, clip_ratio_c)
    return TokenLoss(t, loss_T, keep_T, t.sampler_logprobs_T)


@loss_function(declared.PPO)
def ppo(
    batch: TokenData,
    *,
    clip_low_threshold: float,
    clip_high_threshold: float,
    surrogate: PpoSurrogate,
    clip_ratio_c: float,
    zero_adv: ZeroAdvantage,
) -> TokenLoss:
    """Tinker `ppo`, the GRPO clipped-ratio loss (Schulman et al. 2017; Spindle `_loss`):
    L = −Σ_t m·min(r·A, clip(r, lo, hi)·A) with ABSOLUTE ratio bounds lo, hi (0.8/1.2 = ε 0.2).

    The gradient is −A·r·m except where the clip is active: (A > 0 and r > hi) or (A < 0 and
    r < lo); those tokens are `kept_D = False`. There is no dual clip and no ratio cap, so with
    A < 0 and a huge r the loss is unbounded (as Tinker/Spindle).

    Args:
        clip_low_threshold: lo, absolute lower ratio bound (Tinker's key), 0 ≤ lo ≤ hi.
        clip_high_threshold: hi, absolute upper ratio bound (Tinker's key).
        surrogate: "clipped" (Tinker's value, default); "ratio" (−A·min(r,c)·M) or "logprob"
            (−A·sg(min(r,c))·M·ℓ, Stable-RL's `ppo` mode with lo = 1 − ε_lo, hi = 1 + ε_hi).
            All three have the same gradient where r < c.
        clip_ratio_c: importance-weight cap for "ratio"/"logprob" (Stable-RL uses 10); must
            stay inf with "clipped", which Tinker defines without a cap.
        zero_adv: "keep" (Tinker: A = 0 never clipped) or "negative" (Stable-RL: A = 0 takes
            the r < lo branch); affects only `kept_D` and clip fractions.
    """
    t = pack(batch)
    ratio_T, a_T = sampler_ratio(t.logprobs_T, t.sampler_logprobs_T), t.advantages_T
    keep_T = trust_region(
        a_T,
        t.loss_T,
        leaves_up_T=ratio_T.detach() > clip_high_threshold,
        leaves_down_T=ratio_T.detach() < clip_low_threshold,
        zero_adv=zero_adv,
    )
    if surrogate == "clipped":
        clipped_T = ratio_T.clamp(clip_low_threshold, clip_high_threshold)
        loss_T = -torch.minimum(ratio_T * a_T, clipped_T * a_T) * t.mask_T
    else:
        loss_T = policy_gradient(t, ratio_T, keep_T, surrogate, clip_ratio_c)
    return TokenLoss(t, loss_T, keep_T, t.sampler_logprobs_T)


@loss_function(declared.CISPO)
def cispo(batch: TokenData, *, clip_low_threshold: float, clip_high_threshold: float) -> TokenLoss:
    """Tinker `cispo` (MiniMax-M1, arXiv 2506.13585; Spindle `_loss`):
    L = −Σ_t m·sg(clip(r, lo, hi))·ℓ·A. Value convention: the log-prob form (Tinker's `loss:sum`).

    The clipped weight is detached, so the clip changes a token's gradient but never zeroes it
    (`kept_D` is all True); `cispo/clip_fraction` reports how often the weight was clipped.
    Defaults are the current Tinker doc's one-sided 0.0/4.0 (older docs used 0.8/1.2).
    With lo = 0 and hi = 10 this is Stable-RL's `pg_no_mask` mode.
    """
    t = pack(batch)
    ratio_T = sampler_ratio(t.logprobs_T, t.sampler_logprobs_T)
    weight_T = ratio_T.clamp(clip_low_threshold, clip_high_threshold).detach()
    loss_T = -weight_T * t.logprobs_T * t.advantages_T * t.mask_T
    r_T = ratio_T.detach()
    active_T = ((r_T < clip_low_threshold) | (r_T > clip_high_threshold)) & t.loss_T
    n = int(t.loss_T.sum())
    extra = {"cispo/clip_fraction": int(active_T.sum()) / n if n else 0.0}
    return TokenLoss(t, loss_T, _all_kept(t), t.sampler_logprobs_T, extra)


@loss_function(declared.DRO)
def dro(batch: TokenData, *, beta: float) -> TokenLoss:
    """Tinker `dro` (Direct Reward Optimisation, Richemond et al. 2024; Spindle `_loss`):
    L = −Σ_t m·(ℓ·A − ½β(ℓ − ℓ_s)²). Value convention: Tinker's `loss:sum`.

    Unlike the ratio losses, an A = 0 token still has a gradient, β(ℓ − ℓ_s), from the penalty.
    `beta` default 0.05 is the Tinker doc example and the Spindle default; Tinker does not
    document its own default, and the miles reimplementation uses 0.1.
    """
    t = pack(batch)
    log_ratio_T = t.logprobs_T - t.sampler_logprobs_T
    penalty_T = 0.5 * beta * log_ratio_T**2 * t.mask_T
    loss_T = -(t.logprobs_T * t.advantages_T) * t.mask_T + penalty_T
    return TokenLoss(t, loss_T, _all_kept(t), t.sampler_logprobs_T, penalty_T=penalty_T)


@loss_function(declared.CROSS_ENTROPY)
def cross_entropy_loss(batch: TokenData) -> TokenLoss:
    """Tinker `cross_entropy` (https://tinker-docs.thinkingmachines.ai/losses): L = −Σ_t m·ℓ, m = the "weights".

    Sampler log-probs and advantages are not used (zeros are fine); ratio/drift metrics then
    describe the model against whatever sampler log-probs were given.
    """
    t = pack(batch)
    loss_T = -t.logprobs_T * t.mask_T
    return TokenLoss(t, loss_T, _all_kept(t), t.sampler_logprobs_T)


def _anchor_logprobs(t: PackedTokens, anchor: Anchor) -> Tensor:
    if anchor not in ("sampler", "recomputed"):
        raise ValueError(f"anchor={anchor!r}: expected 'sampler' or 'recomputed'")
    if anchor == "sampler":
        return t.sampler_logprobs_T
    if t.old_logprobs_T is None:
        raise ValueError('anchor="recomputed" needs TokenData.old_logprobs_D, which is None')
    return t.old_logprobs_T


def _dppo_token_loss(
    t: PackedTokens,
    keep_T: Tensor,
    anchor_T: Tensor,
    surrogate: Surrogate,
    clip_ratio_c: float,
    *,
    weight_anchor: Anchor,
    log_ratio_guard: LogRatioGuard,
    kl_tau: float,
) -> TokenLoss:
    """The DPPO loss once its trust-region mask is known: the masked IS policy gradient with the
    weight against `weight_anchor` under `log_ratio_guard`, plus prime-rl's optional
    kl_tau·(ℓ − ℓ_s)² on every loss token (masked and A = 0 ones included).

    Metrics: `dppo/mask_fraction` is the share of ALL loss tokens the mask dropped (A = 0 tokens
    count when `zero_adv="negative"` drops them, although their loss is 0 anyway);
    `dppo/mask_fraction_nonzero_adv` leaves A = 0 tokens out of numerator and denominator, as
    Stable-RL's `pg_clipfrac` does: the activation gate reads this one."""
    weight_logprobs_T = _anchor_logprobs(t, weight_anchor)
    ratio_T = guarded_ratio(t.logprobs_T, weight_logprobs_T, log_ratio_guard)
    loss_T = policy_gradient(t, ratio_T, keep_T, surrogate, clip_ratio_c)
    penalty_T = None
    if kl_tau:
        penalty_T = kl_tau * (t.logprobs_T - t.sampler_logprobs_T) ** 2 * t.mask_T
        loss_T = loss_T + penalty_T
    fraction, fraction_nonzero, _ = clip_fractions(t, keep_T)
    metrics = {"dppo/mask_fraction": fraction, "dppo/mask_fraction_nonzero_adv": fraction_nonzero}
    return TokenLoss(t, loss_T, keep_T, anchor_T, metrics, penalty_T=penalty_T)


@loss_function(declared.DPPO_BINARY_TV)
def dppo_binary_tv(
    batch: TokenData,
    *,
    low: float,
    high: float,
    anchor: Anchor,
    weight_anchor: Anchor,
    clip_ratio_c: float,
    log_ratio_guard: LogRatioGuard,
    kl_tau: float,
    surrogate: Surrogate,
    zero_adv: ZeroAdvantage,
) -> TokenLoss:
    """DPPO-Binary-TV (Qi et al. 2026, "Rethinking the Trust Region in LLM RL", arXiv
    2602.04879; reference: Stable-RL `dppo_binary_tv`/`_recompute`, Spindle/SkyRL `dppo`).

    Mask a token when the binary total variation between the current and the anchor policy on
    the sampled token, |p − p_a|, exceeds the threshold in the direction A pushes:
        M = 0 if (A > 0 and p − p_a > high) or (A ≤ 0 and p − p_a < −low)   (strict, Stable-RL)
    then L = Σ_t policy_gradient(A, r, M) (see `policy_gradient` for the two value conventions).

    Args:
        low, high: TV thresholds for decreasing / increasing p (paper/verl example: 0.15).
        anchor: the MASK's anchor: "sampler" (rollout log-probs, the paper's choice) or
            "recomputed" (old log-probs). With `weight_anchor="sampler"` (the default) this is
            Stable-RL's `*_recompute` (mask against old, weight against rollout). verl's
            `dppo_tv` without bypass mode is NOT that: it takes both against old, which is
            `anchor="recomputed", weight_anchor="recomputed"` (and `log_ratio_guard="both"`).
        weight_anchor: the importance weight's anchor, "sampler" (every framework in bypass /
            rollout mode) or "recomputed" (verl non-bypass; SkyRL without rollout log-probs).
            Do not change it to reproduce Stable-RL: its weight is always against the rollout.
        clip_ratio_c: cap c on the importance weight (Stable-RL code default and the plan's
            pinned revision: 10; verl code 20, verl ActorConfig 3.0). Use inf to reproduce
            Spindle, SkyRL and prime-rl, which have no cap.
        log_ratio_guard: see `LogRatioGuard`: "upper" (Stable-RL), "both" (verl), "zero_grad"
            (SkyRL), "none" (Spindle, prime-rl). Only tokens with |ℓ − ℓ_a| > 20 differ; do not
            use "none" for training, its gradient overflows.
        kl_tau: coefficient of prime-rl's extra kl_tau·(ℓ − ℓ_s)² on every loss token (prime-rl
            `DefaultLossConfig` default 1e-3); 0 (default) is the paper's DPPO without it.
        surrogate: "ratio" (value −A·min(r,c)·M) or "logprob" (Stable-RL's value).
        zero_adv: "negative" (Stable-RL, verl, prime-rl) or "keep" (Spindle, SkyRL never mask
            A = 0); diagnostics only.
    """
    t = pack(batch)
    anchor_T = _anchor_logprobs(t, anchor)
    p_T, p_anchor_T = t.logprobs_T.detach().exp(), anchor_T.exp()
    keep_T = trust_region(
        t.advantages_T,
        t.loss_T,
        leaves_up_T=p_T - p_anchor_T > high,
        leaves_down_T=p_T - p_anchor_T < -low,
        zero_adv=zero_adv,
    )
    knobs = dict(weight_anchor=weight_anchor, log_ratio_guard=log_ratio_guard, kl_tau=kl_tau)
    return _dppo_token_loss(t, keep_T, anchor_T, surrogate, clip_ratio_c, **knobs)


@loss_function(declared.DPPO_BINARY_KL)
def dppo_binary_kl(
    batch: TokenData,
    *,
    low: float,
    high: float,
    anchor: Anchor,
    weight_anchor: Anchor,
    clip_ratio_c: float,
    log_ratio_guard: LogRatioGuard,
    kl_tau: float,
    surrogate: Surrogate,
    zero_adv: ZeroAdvantage,
) -> TokenLoss:
    """DPPO-Binary-KL (Qi et al. 2026, arXiv 2602.04879; reference: Stable-RL `dppo_binary_kl`).

    K = KL(Bern(p_a) ‖ Bern(p)) on the sampled token against "everything else":
        K = p_a·(ℓ_a − ℓ) + (1 − p_a)·log((1 − p_a + 1e-8) / (1 − p + 1e-8))
        M = 0 if (A > 0 and K > high and p > p_a) or (A ≤ 0 and K > low and p < p_a)
    then L = Σ_t policy_gradient(A, r, M). The 1e-8 is Stable-RL's. 1 − p and 1 − p_a are
    floored at 0, so a log-prob a hair above 0 gives a large K (masked when it moved in the
    advantage's direction) instead of Stable-RL's NaN, which silently keeps the token.

    Args: as `dppo_binary_tv`; the paper's KL threshold is 0.05.
    """
    t = pack(batch)
    anchor_T = _anchor_logprobs(t, anchor)
    logp_T = t.logprobs_T.detach()
    p_T, p_anchor_T = logp_T.exp(), anchor_T.exp()
    kl_T = p_anchor_T * (anchor_T - logp_T) + (1 - p_anchor_T) * torch.log(
        ((1 - p_anchor_T).clamp_min(0) + KL_EPS) / ((1 - p_T).clamp_min(0) + KL_EPS)
    )
    keep_T = trust_region(
        t.advantages_T,
        t.loss_T,
        leaves_up_T=(kl_T > high) & (p_T > p_anchor_T),
        leaves_down_T=(kl_T > low) & (p_T < p_anchor_T),
        zero_adv=zero_adv,
    )
    knobs = dict(weight_anchor=weight_anchor, log_ratio_guard=log_ratio_guard, kl_tau=kl_tau)
    return _dppo_token_loss(t, keep_T, anchor_T, surrogate, clip_ratio_c, **knobs)
