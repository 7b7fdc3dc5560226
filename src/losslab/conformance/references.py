"""Known pinned references and losslab's re-derivation of each, in the reference's own layout.

A re-derivation restates the reference's formula (Spindle `forward_backward.py::_loss` and
Stable-RL `core_algos.py::compute_policy_loss_with_mask` at the pinned commits, restated here and
checked against the golden file by `losslab golden check`) so that a preflight without a checkout
still compares our losses with an independent statement of the reference:

- Spindle `_loss(logprobs, batch)` (modal-projects/spindle, Tinker-style server): packed rows,
  loss = -sum_t m_t * J_t with J per `loss_name` (ppo, dppo, cispo, dro, importance_sampling,
  cross_entropy) and `loss_config` validated like Spindle's `_loss_config`.
- Stable-RL `compute_policy_loss_with_mask` (sail-sg/Stable-RL, DPPO authors' verl fork): padded
  [B, T] rows, L = -A * sg(min(exp(min(l - l_s, 20)), c)) * M * l with a detached trust-region
  mask M per `loss_mode`, aggregated by verl's `agg_loss`.

The re-derivation never imports the reference; pinned source is run by `losslab.conformance.pinned`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from losslab.conformance.fixtures import Fixture
from losslab.plan import Revision, RevisionError

SPINDLE_REPO = "modal-projects/spindle"
STABLE_RL_REPO = "sail-sg/Stable-RL"

# Spindle `_loss_config`: each loss accepts only its own keys; defaults as in `_loss`.
SPINDLE_LOSS_KEYS: dict[str, dict[str, float]] = {
    "cross_entropy": {},
    "importance_sampling": {},
    "ppo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    "cispo": {"clip_low_threshold": 0.0, "clip_high_threshold": 4.0},
    "dro": {"beta": 0.05},
    "dppo": {"tv_threshold": 0.1},
}
STABLE_RL_TOKEN_MODES = (
    "dppo_binary_kl",
    "dppo_binary_kl_recompute",
    "dppo_binary_tv",
    "dppo_binary_tv_recompute",
    "ppo",
    "ppo_recompute",
    "ppo_ablation_positive",
    "ppo_ablation_negative",
    "ppo_ablation_both",
    "pg_no_mask",
)
STABLE_RL_TOPK_MODES = ("dppo_topk_kl", "dppo_topk_tv")  # need full-vocabulary top-k inputs
STABLE_RL_AGG_MODES = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)
STABLE_RL_KEYS = (
    "loss_mode",
    "clip_ratio",
    "clip_ratio_low",
    "clip_ratio_high",
    "clip_ratio_c",
    "loss_agg_mode",
    "global_batch_info",
)
# Tinker convention: a plain masked sum. agg_loss(token-mean) with batch_num_tokens=1 gives it.
TINKER_SUM_BATCH_INFO = {"dp_size": 1, "batch_num_tokens": 1}


@dataclass(frozen=True)
class ResolvedReference:
    """A revision mapped to a known reference, with every effective parameter spelled out.

    `family` is the framework adapter's name (`losslab.conformance.frameworks`: "spindle",
    "stable_rl", "verl", "skyrl", "prime_rl"); `params` are the effective values the reference
    will use, with defaults filled in; `notes` say where a default came from or where a real
    config would differ.
    """

    revision: Revision
    family: str
    params: dict[str, Any]
    notes: tuple[str, ...] = ()
    value_convention: str = "surrogate"  # what the loss value means; see `normalization_text`

    @property
    def loss_name(self) -> str:
        for key in ("loss_name", "loss_mode", "dppo_type"):
            if key in self.params:
                return str(self.params[key])
        return self.revision.function

    @property
    def framework(self) -> Any:
        from losslab.conformance.frameworks import registry

        return registry()[self.family]


@dataclass
class ReferenceResult:
    """A reference's outputs on a fixture (per-datum lists in datum order)."""

    loss: float
    per_sequence_loss: list[float]
    grad_D: list[np.ndarray]  # d loss / d current log-probs, full length, zero on prompt tokens
    blocked_D: list[np.ndarray]  # bool: loss tokens whose gradient the clip/trust region zeroed
    source: dict[str, Any] = field(default_factory=dict)
    dtype: str = "float32"
    blocked_scope: str = "all"  # "nonzero_adv": blocked_D only knows tokens with A != 0
    resolved: ResolvedReference | None = None  # as resolved against the executed commit


def _finite_number(revision: Revision, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RevisionError(
            f"revision {revision.text!r}: {key} = {value!r}; expected a finite number"
        )
    return float(value)


def resolve_reference(revision: Revision, files: Any | None = None) -> ResolvedReference:
    """Map a revision to its framework adapter (`losslab.conformance.frameworks`) and its
    effective parameters. With `files` (a `GitFiles` of the pinned commit), unset parameters take
    the defaults of the framework's own config classes read at that commit; without, the
    defaults the adapter recorded (labelled in the notes).

    Raises RevisionError naming the revision when the repo/function is unknown or a parameter is
    not one the reference accepts.
    """
    from losslab.conformance.frameworks import framework_for

    try:
        fw = framework_for(revision.repo, revision.function)
    except RevisionError as err:
        raise RevisionError(f"revision {revision.text!r}: {err}") from None
    defaults, origin = fw.defaults(files)
    return fw.resolve(revision, defaults, origin)


def _resolve_spindle(revision: Revision) -> ResolvedReference:
    kw = dict(revision.kwargs)
    name = kw.pop("loss_name", None)
    if name not in SPINDLE_LOSS_KEYS:
        raise RevisionError(
            f"revision {revision.text!r}: loss_name = {name!r}; expected one of "
            f"{sorted(SPINDLE_LOSS_KEYS)}"
        )
    config = dict(kw.pop("loss_config", {}) or {})
    config.update(kw)  # loss_config keys may also be given directly
    if revision.clip_bounds is not None:
        if name not in ("ppo", "cispo"):
            raise RevisionError(
                f"revision {revision.text!r}: 'clip LO/HI' only applies to ppo and "
                f"cispo, not {name}"
            )
        config.setdefault("clip_low_threshold", revision.clip_bounds[0])
        config.setdefault("clip_high_threshold", revision.clip_bounds[1])
    return ResolvedReference(
        revision,
        "spindle",
        {"loss_name": name, "loss_config": spindle_loss_config(name, config, revision)},
        value_convention="surrogate",
    )


def spindle_loss_config(
    name: str, config: Mapping[str, Any], revision: Revision | None = None
) -> dict[str, float]:
    """Validate a Spindle loss config as `_loss_config` does and fill in `_loss`'s defaults."""
    where = f"revision {revision.text!r}" if revision is not None else f"spindle {name} config"
    allowed = SPINDLE_LOSS_KEYS[name]
    unexpected = set(config) - set(allowed)
    if unexpected:
        raise RevisionError(
            f"{where}: unsupported {name} loss config keys {sorted(unexpected)}; "
            f"expected {sorted(allowed) or 'none'}"
        )
    values = dict(allowed)
    for key, value in config.items():
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
        ):
            raise RevisionError(f"{where}: {key} = {value!r}; expected a finite number")
        values[key] = float(value)
    if (
        name in ("ppo", "cispo")
        and not 0 <= values["clip_low_threshold"] <= values["clip_high_threshold"]
    ):
        raise RevisionError(
            f"{where}: clip thresholds must satisfy 0 <= low <= high, got "
            f"{values['clip_low_threshold']}/{values['clip_high_threshold']}"
        )
    for key in ("beta", "tv_threshold"):
        if key in values and values[key] < 0:
            raise RevisionError(f"{where}: {key} = {values[key]}; expected >= 0")
    return values


def _resolve_stable_rl(revision: Revision) -> ResolvedReference:
    kw = dict(revision.kwargs)
    unknown = set(kw) - set(STABLE_RL_KEYS)
    if unknown:
        raise RevisionError(
            f"revision {revision.text!r}: unknown arguments {sorted(unknown)}; "
            f"compute_policy_loss_with_mask takes {list(STABLE_RL_KEYS)}"
        )
    notes = []
    mode = kw.get("loss_mode")
    if mode is None:
        mode = "dppo_binary_tv"
        notes.append("loss_mode not given: config.policy_loss default 'dppo_binary_tv'")
    if mode in STABLE_RL_TOPK_MODES:
        raise RevisionError(
            f"revision {revision.text!r}: loss_mode {mode!r} needs top-k "
            "divergences from full logits, which token log-prob fixtures cannot give"
        )
    if mode not in STABLE_RL_TOKEN_MODES:
        raise RevisionError(
            f"revision {revision.text!r}: loss_mode = {mode!r}; expected one of "
            f"{list(STABLE_RL_TOKEN_MODES)}"
        )
    clip = kw.get("clip_ratio")
    low, high = kw.get("clip_ratio_low"), kw.get("clip_ratio_high")
    if revision.clip_bounds is not None:
        low = 1.0 - revision.clip_bounds[0] if low is None else low
        high = revision.clip_bounds[1] - 1.0 if high is None else high
    # The function falls back to clip_ratio when clip_ratio_low/high are None.
    low = clip if low is None else low
    high = clip if high is None else high
    if low is None or high is None:
        raise RevisionError(
            f"revision {revision.text!r}: set clip_ratio (or clip_ratio_low and "
            "clip_ratio_high); the trust-region thresholds are undefined otherwise"
        )
    low = _finite_number(revision, "clip_ratio_low", low)
    high = _finite_number(revision, "clip_ratio_high", high)
    if "clip_ratio_c" in kw:
        cap = _finite_number(revision, "clip_ratio_c", kw["clip_ratio_c"])
    else:
        cap = 10.0
        notes.append(
            "clip_ratio_c not given: the function's fallback 10.0 "
            "(a verl ActorConfig would supply its default 3.0)"
        )
    if kw.get("clip_ratio") is not None and (
        kw.get("clip_ratio_low") is None or kw.get("clip_ratio_high") is None
    ):
        notes.append(
            f"clip_ratio={kw['clip_ratio']} read as both thresholds (the function's "
            "fallback when clip_ratio_low/high are None); a verl ActorConfig defaults "
            "clip_ratio_low/high to 0.2, so a real run must set them explicitly"
        )
    agg = kw.get("loss_agg_mode", "token-mean")
    if agg not in STABLE_RL_AGG_MODES:
        raise RevisionError(
            f"revision {revision.text!r}: loss_agg_mode = {agg!r}; expected one of "
            f"{list(STABLE_RL_AGG_MODES)}"
        )
    info = kw.get("global_batch_info")
    if info is None:
        info = dict(TINKER_SUM_BATCH_INFO) if agg == "token-mean" else {}
    if not isinstance(info, Mapping) or set(info) - {
        "dp_size",
        "batch_num_tokens",
        "global_batch_size",
        "loss_scale_factor",
    }:
        raise RevisionError(
            f"revision {revision.text!r}: global_batch_info = {info!r}; expected a "
            "dict of dp_size, batch_num_tokens, global_batch_size, loss_scale_factor"
        )
    params = {
        "loss_mode": mode,
        "clip_ratio_low": low,
        "clip_ratio_high": high,
        "clip_ratio_c": cap,
        "loss_agg_mode": agg,
        "global_batch_info": dict(info),
    }
    return ResolvedReference(
        revision, "stable_rl", params, tuple(notes), value_convention="logprob"
    )


# ---------------------------------------------------------------- re-derivations (torch) ---


def spindle_objective(
    logprobs: torch.Tensor,
    mask: torch.Tensor,
    sampler: torch.Tensor,
    adv: torch.Tensor,
    loss_name: str,
    config: Mapping[str, float],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Spindle `_loss` on one packed row: (per-token terms -m*J, blocked tokens); the loss is
    the terms' sum. Team notes §4.2."""
    if loss_name == "cross_entropy":
        return -(logprobs * mask), torch.zeros_like(mask, dtype=torch.bool)
    ratio = torch.exp(logprobs - sampler)  # not detached
    blocked = torch.zeros_like(mask, dtype=torch.bool)
    if loss_name == "importance_sampling":
        objective = ratio * adv
    elif loss_name == "ppo":
        lo, hi = config["clip_low_threshold"], config["clip_high_threshold"]
        objective = torch.minimum(ratio * adv, torch.clamp(ratio, lo, hi) * adv)
        blocked = ((adv > 0) & (ratio > hi)) | ((adv < 0) & (ratio < lo))
    elif loss_name == "cispo":
        lo, hi = config["clip_low_threshold"], config["clip_high_threshold"]
        objective = torch.clamp(ratio, lo, hi).detach() * logprobs * adv
    elif loss_name == "dro":
        objective = logprobs * adv - 0.5 * config["beta"] * (logprobs - sampler).square()
    elif loss_name == "dppo":
        r = ratio.detach()
        p_s = sampler.exp()
        divergence = (r * p_s - p_s).abs()  # |p - p_s| formed through the ratio, as Spindle does
        leaving = ((adv > 0) & (r > 1)) | ((adv < 0) & (r < 1))
        blocked = leaving & (divergence > config["tv_threshold"])
        objective = ratio * adv * (~blocked).to(logprobs.dtype)
    else:
        raise ValueError(
            f"spindle loss_name = {loss_name!r}; expected one of {sorted(SPINDLE_LOSS_KEYS)}"
        )
    return -(objective * mask), blocked & (mask != 0)


def stable_rl_mask(
    log_prob: torch.Tensor,
    rollout: torch.Tensor,
    old: torch.Tensor,
    adv: torch.Tensor,
    response_mask: torch.Tensor,
    mode: str,
    low: float,
    high: float,
) -> torch.Tensor:
    """Stable-RL trust-region mask M (1 = keep), detached. Team notes §3.1; A = 0 takes the
    A <= 0 branch; comparisons are strict."""
    with torch.no_grad():
        p, p_s, p_o = log_prob.exp(), rollout.exp(), old.exp()
        r_s, r_o = torch.exp(log_prob - rollout), torch.exp(log_prob - old)

        def binary_kl(anchor_p: torch.Tensor, anchor_l: torch.Tensor) -> torch.Tensor:
            return anchor_p * (anchor_l - log_prob) + (1 - anchor_p) * torch.log(
                (1.0 - anchor_p + 1e-8) / (1.0 - p + 1e-8)
            )

        if mode in ("dppo_binary_kl", "dppo_binary_kl_recompute"):
            a_p, a_l = (p_s, rollout) if mode == "dppo_binary_kl" else (p_o, old)
            kl = binary_kl(a_p, a_l)
            bad_pos, bad_neg = (kl > high) & (p > a_p), (kl > low) & (p < a_p)
        elif mode in ("dppo_binary_tv", "dppo_binary_tv_recompute"):
            a_p = p_s if mode == "dppo_binary_tv" else p_o
            bad_pos, bad_neg = (p - a_p) > high, (p - a_p) < -low
        elif mode in ("ppo", "ppo_recompute"):
            r = r_s if mode == "ppo" else r_o
            bad_pos, bad_neg = r > 1 + high, r < 1 - low
        elif mode == "ppo_ablation_positive":
            bad_pos, bad_neg = (r_s > 1.28) & (p_s >= high), r_s < 1 - low
        elif mode == "ppo_ablation_negative":
            bad_pos, bad_neg = r_s > 1 + high, (r_s < 0.8) & (p_s >= low)
        elif mode == "ppo_ablation_both":
            bad_pos, bad_neg = (r_s > 1.28) & (p_s >= high), (r_s < 0.8) & (p_s >= low)
        elif mode == "pg_no_mask":
            bad_pos = bad_neg = torch.zeros_like(p, dtype=torch.bool)
        else:
            raise ValueError(
                f"Stable-RL loss_mode = {mode!r}; expected one of {list(STABLE_RL_TOKEN_MODES)}"
            )
        invalid = torch.where(adv > 0, bad_pos, bad_neg)
        return (1.0 - invalid.to(log_prob.dtype)) * response_mask


def stable_rl_agg(
    loss_mat: torch.Tensor, mask: torch.Tensor, mode: str, info: Mapping[str, Any]
) -> torch.Tensor:
    """verl `agg_loss` on [B, T] (team notes §3.3)."""
    dp = info.get("dp_size", 1)
    masked = torch.where(mask.bool(), loss_mat, torch.zeros_like(loss_mat)) * mask
    if mode == "token-mean":
        n = info.get("batch_num_tokens")
        n = mask.sum() if n is None else n
        return masked.sum() / n * dp
    if mode in ("seq-mean-token-sum", "seq-mean-token-mean"):
        seq = (loss_mat * mask).sum(-1)
        if mode == "seq-mean-token-mean":
            seq = seq / (mask.sum(-1) + 1e-8)
        seq_mask = (mask.sum(-1) > 0).to(loss_mat.dtype)
        g = info.get("global_batch_size")
        g = seq_mask.sum() if g is None else g
        return (torch.where(seq_mask.bool(), seq, torch.zeros_like(seq)) * seq_mask).sum() / g * dp
    if mode == "seq-mean-token-sum-norm":
        factor = info.get("loss_scale_factor") or mask.shape[-1]
        return (loss_mat * mask).sum(-1).sum() / factor
    raise ValueError(
        f"Stable-RL loss_agg_mode = {mode!r}; expected one of {list(STABLE_RL_AGG_MODES)}"
    )


def stable_rl_loss(
    log_prob: torch.Tensor,
    rollout: torch.Tensor,
    old: torch.Tensor,
    adv: torch.Tensor,
    response_mask: torch.Tensor,
    params: Mapping[str, Any],
    abs_terms: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stable-RL `compute_policy_loss_with_mask` on padded [B, T]: (loss, M). Team notes §3.2.

    With `abs_terms`, aggregates |L| instead of L: `agg_loss` is linear with positive factors,
    so that is the sum of the magnitudes of every token's contribution (a tolerance scale)."""
    m = stable_rl_mask(
        log_prob,
        rollout,
        old,
        adv,
        response_mask,
        params["loss_mode"],
        params["clip_ratio_low"],
        params["clip_ratio_high"],
    )
    w = torch.clamp(
        torch.exp(torch.clamp(log_prob - rollout, max=20.0)), max=params["clip_ratio_c"]
    ).detach()  # always against the rollout
    loss_mat = -adv * w * m * log_prob
    if abs_terms:
        loss_mat = loss_mat.abs()
    return stable_rl_agg(
        loss_mat, response_mask, params["loss_agg_mode"], params["global_batch_info"]
    ), m


def _pad(rows: list[np.ndarray], width: int, dtype: torch.dtype) -> torch.Tensor:
    out = torch.zeros(len(rows), width, dtype=dtype)  # [B, T]
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.from_numpy(np.asarray(row)).to(dtype)
    return out


def rederive(
    ref: ResolvedReference, fixture: Fixture, dtype: torch.dtype = torch.float32
) -> ReferenceResult:
    """Run losslab's re-derivation of `ref` on `fixture` (loss, per-sequence losses, gradient)."""
    seqs = fixture.sequences
    lengths = [len(s.sampler_logprobs) for s in seqs]
    if ref.family not in ("spindle", "stable_rl"):
        raise ValueError(
            f"{ref.revision.short}: losslab has no independent re-derivation of "
            f"{ref.revision.repo}; its pinned source must be executed (fetched or --source)"
        )
    if ref.family == "spindle":
        name, config = ref.params["loss_name"], ref.params["loss_config"]

        def run(idx: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            cat = lambda key: torch.from_numpy(  # noqa: E731
                np.concatenate([getattr(seqs[i], key) for i in idx])
            ).to(dtype)
            logprobs = cat("current_logprobs").requires_grad_(True)  # packed [sum L]
            terms, blocked = spindle_objective(
                logprobs, cat("loss_mask"), cat("sampler_logprobs"), cat("advantages"), name, config
            )
            loss = terms.sum()
            (grad,) = torch.autograd.grad(loss, logprobs)
            return loss.detach(), grad, blocked

        loss, grad, blocked = run(list(range(len(seqs))))
        per_seq = [float(run([i])[0]) for i in range(len(seqs))]
        grads = list(np.split(grad.numpy(), np.cumsum(lengths)[:-1]))
        blocks = list(np.split(blocked.numpy(), np.cumsum(lengths)[:-1]))
    else:
        width = max(lengths)

        def run_rows(idx: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            pad = lambda key: _pad([getattr(seqs[i], key) for i in idx], width, dtype)  # noqa: E731
            log_prob = pad("current_logprobs").requires_grad_(True)  # [B, T]
            rollout = pad("sampler_logprobs")
            old = (
                _pad([seqs[i].old_logprobs for i in idx], width, dtype)
                if all(seqs[i].old_logprobs is not None for i in idx)
                else rollout
            )
            loss, m = stable_rl_loss(
                log_prob, rollout, old, pad("advantages"), pad("loss_mask"), ref.params
            )
            (grad,) = torch.autograd.grad(loss, log_prob)
            return loss.detach(), grad, (m == 0) & (pad("loss_mask") != 0)

        loss, grad, blocked = run_rows(list(range(len(seqs))))
        per_seq = [float(run_rows([i])[0]) for i in range(len(seqs))]
        grads = [grad[i, :n].numpy() for i, n in enumerate(lengths)]
        blocks = [blocked[i, :n].numpy() for i, n in enumerate(lengths)]
    return ReferenceResult(
        loss=float(loss),
        per_sequence_loss=per_seq,
        grad_D=[np.asarray(g) for g in grads],
        blocked_D=[np.asarray(b, dtype=bool) for b in blocks],
        source={
            "kind": "rederivation",
            "repo": ref.revision.repo,
            "label": f"losslab re-derivation of {ref.revision.short} (formula from the "
            "reference's source as documented; pinned source not executed)",
            "effective_params": ref.params,
            "notes": list(ref.notes),
            "text_commit": ref.framework.recorded_commit,
        },
        resolved=ref,
        dtype=str(dtype).replace("torch.", ""),
    )


def loss_term_abs_sum(ref: ResolvedReference, fixture: Fixture) -> float:
    """Sum of |each token's contribution to the loss| in float64: the scale the golden file's
    `float64_check.loss_term_abs_sum_float64` records for loss tolerances."""
    seqs = fixture.sequences
    f64 = torch.float64
    if ref.family == "spindle":
        cat = lambda key: torch.from_numpy(  # noqa: E731
            np.concatenate([getattr(s, key) for s in seqs])
        ).to(f64)
        terms, _ = spindle_objective(
            cat("current_logprobs"),
            cat("loss_mask"),
            cat("sampler_logprobs"),
            cat("advantages"),
            ref.params["loss_name"],
            ref.params["loss_config"],
        )
        return float(terms.abs().sum())
    width = max(len(s.sampler_logprobs) for s in seqs)
    pad = lambda key: _pad([getattr(s, key) for s in seqs], width, f64)  # noqa: E731
    rollout = pad("sampler_logprobs")
    total, _ = stable_rl_loss(
        pad("current_logprobs"),
        rollout,
        rollout,
        pad("advantages"),
        pad("loss_mask"),
        ref.params,
        abs_terms=True,
    )
    return float(total)
