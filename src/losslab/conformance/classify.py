"""Name the convention behind a failed check: which single change to our loss makes it pass.

When a preflight check fails, `classify` re-runs our loss with one known convention alternative
at a time (IS cap, thresholds, mask anchor, weight anchor, log-ratio guard, zero-advantage
branch, value form, reduction, prime-rl's KL term and its absence, the sign, and the knobs of
the field losses: GSPO level and guard, CISPO's epsilon meaning, Dr. GRPO's constant, the dual
clip, rollout correction's mode, cap and lower bound, IcePop's bounds) and keeps those under which
BOTH the value and the gradient check pass, e.g. "matches if clip_ratio_c = 3.0 (verl and
Stable-RL ActorConfig default)". The alternatives and where each convention comes from are
the team notes' (dppo_implementations.md §2.3); nothing is fitted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from losslab.conformance.fixtures import Fixture
from losslab.conformance.metrics import Tolerance, check_tolerance
from losslab.conformance.ours import run_ours

# (parameter, value, where the convention comes from)
ALTERNATIVES: tuple[tuple[str, Any, str], ...] = (
    ("clip_ratio_c", 3.0, "verl and Stable-RL ActorConfig default"),
    ("clip_ratio_c", 10.0, "Stable-RL code fallback"),
    ("clip_ratio_c", 20.0, "verl dppo_tv code fallback"),
    ("clip_ratio_c", 1e4, "verl DPPO example script"),
    ("clip_ratio_c", math.inf, "no cap: SkyRL, prime-rl, Spindle"),
    ("thresholds", 0.1, "Spindle tv_threshold default"),
    ("thresholds", 0.15, "paper and verl DPPO example"),
    ("thresholds", 0.2, "SkyRL DPPOConfig, prime-rl DefaultLossConfig, verl ActorConfig"),
    ("low", 0.2, "one threshold left at the 0.2 default of SkyRL/prime-rl/verl (low side)"),
    ("high", 0.2, "one threshold left at the 0.2 default of SkyRL/prime-rl/verl (high side)"),
    ("anchor", "sampler", "mask against the rollout (paper, Stable-RL, SkyRL, prime-rl)"),
    ("anchor", "recomputed", "mask against recomputed old (Stable-RL *_recompute, verl)"),
    ("weight_anchor", "sampler", "IS weight against the rollout (Stable-RL, verl bypass)"),
    ("weight_anchor", "recomputed", "IS weight against old (verl non-bypass)"),
    ("log_ratio_guard", "upper", "Stable-RL: exp(min(log r, 20))"),
    ("log_ratio_guard", "both", "verl: log r clamped to [-20, 20]"),
    ("log_ratio_guard", "zero_grad", "SkyRL safe_exp_delta: no gradient past |log r| = 20"),
    ("log_ratio_guard", "none", "Spindle, prime-rl: no guard"),
    ("kl_tau", 1e-3, "prime-rl DefaultLossConfig kl_tau"),
    ("kl_tau", 0.0, "no KL term: every DPPO but prime-rl's default (prime-rl with kl_tau = 0)"),
    ("zero_adv", "negative", "Stable-RL: A = 0 takes the A <= 0 branch"),
    ("zero_adv", "keep", "Spindle/SkyRL: A = 0 never masked"),
    ("surrogate", "logprob", "value form -A*sg(w)*M*logp (Stable-RL, verl)"),
    ("surrogate", "ratio", "value form -A*min(r,c)*M (SkyRL, prime-rl, Spindle)"),
    ("reduction", "sum", "Tinker / Spindle / SkyRL plain sum"),
    ("reduction", "token-mean", "verl/Stable-RL token-mean over this batch"),
    ("reduction", "seq-mean-token-sum", "verl seq-mean-token-sum"),
    ("reduction", "seq-mean-token-mean", "verl seq-mean-token-mean"),
    ("reduction", "seq-mean-token-sum-norm", "Dr. GRPO constant normaliser"),
    ("clip_low_threshold", 0.8, "Tinker/Spindle ppo default (eps 0.2)"),
    ("clip_high_threshold", 1.2, "Tinker/Spindle ppo default (eps 0.2)"),
    ("clip_high_threshold", 1.28, "DAPO clip-higher (eps_high 0.28)"),
    ("level", "token", "GSPO-token / token-level correction (verl, SkyRL gspo)"),
    ("level", "sequence", "sequence-level ratio (TRL importance_sampling_level='sequence')"),
    ("epsilon_meaning", "absolute_cap", "CISPO eps_high an absolute cap (TRL)"),
    ("epsilon_meaning", "one_plus_eps", "CISPO clip to [1 - eps, 1 + eps] (slime, AReaL, Miles)"),
    ("constant", "max_completion_length", "Dr. GRPO C = max_completion_length (TRL)"),
    ("constant", "max_seq_len", "Dr. GRPO C = max_seq_len, prompt included (SkyRL)"),
    ("constant", "padded_width", "Dr. GRPO C = the padded width (verl)"),
    ("log_ratio_guard", "verl", "verl/SkyRL GSPO: torch.clamp(log s, max=10), no gradient past"),
    ("cap", 2.0, "token TIS cap (SkyRL token_tis_ratio_clip_high, OpenRLHF example)"),
    ("cap", 5.0, "sequence TIS cap (SkyRL sequence_tis_ratio_clip_high)"),
    ("lower", 0.0, "one-sided TIS (no lower bound)"),
    ("mode", "truncate", "rollout correction: truncate the weight (TIS)"),
    ("mode", "mask", "rollout correction: mask the token (MIS)"),
    ("low", 0.5, "IcePop lower bound (rllm, AReaL)"),
    ("low", 0.2, "IcePop lower bound (prime-rl)"),
    ("high", 5.0, "IcePop upper bound"),
    ("sign", -1.0, "the loss negated (a sign error on one side)"),
)


@dataclass(frozen=True)
class _Negated:
    """Our loss with its sign flipped (value and gradient)."""

    inner: Any

    def __call__(self, batch: Any) -> Any:
        out = self.inner(batch)
        out.loss = -out.loss
        return out


def _with(fn: Any, key: str, value: Any) -> Any | None:
    """`fn` (a registry LossFn) with one change, or None when it does not apply."""
    from losslab.losses import get_loss

    if key == "sign":
        return _Negated(fn)
    params = getattr(fn, "params", None)
    if params is None:
        return None
    keys = ("low", "high") if key == "thresholds" else (key,)
    if any(k not in params for k in keys) or all(params[k] == value for k in keys):
        return None
    try:
        return get_loss(fn.name, **{**params, **{k: value for k in keys}})
    except ValueError:
        return None  # not a valid combination (e.g. a cap on Tinker's clipped ppo)


def classify(
    loss_fn: Any,
    value_fn: Any,
    reference: Any,
    fixture: Fixture,
    tolerances: Mapping[str, Tolerance],
    *,
    resolved: Any = None,
) -> dict[str, Any]:
    """Try each alternative on our side; return the ones under which both checks pass.

    Args:
        loss_fn, value_fn: our loss as trained and in the reference's value convention.
        reference: the `ReferenceResult` the checks failed against.
        tolerances: {"loss": Tolerance, "gradient": Tolerance} of the failed path.
        resolved: the reference's `ResolvedReference`; with a loss that is code (which has no
            parameters to vary) `classify_code` varies the reference's losslab configuration.
    """
    if getattr(loss_fn, "user", None) is not None:
        return classify_code(loss_fn, resolved, fixture, tolerances)
    matches, tried = [], 0
    for key, alt, why in ALTERNATIVES:
        if key == "surrogate":  # the value form: the gradient is the same by construction
            grad_fn, val_fn = loss_fn, _with(value_fn, key, alt)
        else:
            grad_fn, val_fn = _with(loss_fn, key, alt), _with(value_fn, key, alt)
        if grad_fn is None or val_fn is None:
            continue
        tried += 1
        loss_value, _, _ = run_ours(val_fn, fixture)
        _, grads, _ = run_ours(grad_fn, fixture)
        loss_ok = check_tolerance(loss_value, reference.loss, tolerances["loss"]).passed
        grad_ok = check_tolerance(grads, reference.grad_D, tolerances["gradient"]).passed
        if loss_ok and grad_ok:
            shown = "inf" if alt == math.inf else alt
            label = "the sign flipped" if key == "sign" else f"{key} = {shown}"
            matches.append(
                {"change": label, "because": why, "summary": f"matches if {label}: {why}"}
            )
    return {
        "tried": tried,
        "matches": matches,
        "summary": (
            "; ".join(m["summary"] for m in matches)
            if matches
            else f"no single convention change (of {tried} tried) makes it pass"
        ),
    }


def classify_code(
    code_fn: Any, resolved: Any, fixture: Fixture, tolerances: Mapping[str, Tolerance]
) -> dict[str, Any]:
    """Name what code's loss does instead: the single convention change to losslab's
    configuration of the reference (`Framework.losslab_config`) under which that configuration
    reproduces the code's value and gradient, e.g. "your code matches the reference with
    clip_ratio_c = inf: no cap". The code itself has no parameters to vary."""
    from losslab.conformance.ours import config_losses

    config = resolved.framework.losslab_config(resolved, fixture) if resolved else None
    if config is None or config.loss is None:
        why = config.reason if config is not None else "no resolved reference"
        return {"tried": 0, "matches": [], "summary": f"not classified: {why}"}
    trained, valued = config_losses(config)
    code_value, _, _ = run_ours(code_fn, fixture)
    _, code_grads, _ = run_ours(code_fn, fixture)
    matches, tried = [], 0
    for key, alt, why in ALTERNATIVES:
        if key == "surrogate":
            grad_fn, val_fn = trained, _with(valued, key, alt)
        else:
            grad_fn, val_fn = _with(trained, key, alt), _with(valued, key, alt)
        if grad_fn is None or val_fn is None:
            continue
        tried += 1
        value, _, _ = run_ours(val_fn, fixture)
        _, grads, _ = run_ours(grad_fn, fixture)
        loss_ok = check_tolerance(code_value, value, tolerances["loss"]).passed
        grad_ok = check_tolerance(code_grads, grads, tolerances["gradient"]).passed
        if loss_ok and grad_ok:
            shown = "inf" if alt == math.inf else alt
            label = "the sign flipped" if key == "sign" else f"{key} = {shown}"
            matches.append(
                {
                    "change": label,
                    "because": why,
                    "summary": f"your code matches the reference with {label}: {why}",
                }
            )
    return {
        "tried": tried,
        "matches": matches,
        "compared_with": f"losslab.losses {valued.spec} (the reference's configuration)",
        "summary": (
            "; ".join(m["summary"] for m in matches)
            if matches
            else f"no single convention change (of {tried} tried) to the reference explains it"
        ),
    }
