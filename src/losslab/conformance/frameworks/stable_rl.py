"""sail-sg/Stable-RL `compute_policy_loss_with_mask` (the DPPO authors' verl fork).

Layout: zero-padded [B, T] rows; `old_log_prob` = the fixture's recomputed old log-probs when it
has them (read only by the `*_recompute` modes), `rollout_log_prob` = sampler log-probs.
Parameters: the function's own fallbacks (clip_ratio for low/high, `config.get("clip_ratio_c",
10.0)`), because the revision names the function call; the ActorConfig defaults (low/high 0.2,
c 3.0) a real Stable-RL config would supply are stated in the notes. Value convention
−A·sg(min(r, c))·M·ℓ ("logprob"); aggregation verl's `agg_loss`, run as a plain masked sum
(token-mean, batch_num_tokens=1) unless the revision says otherwise.

losslab's re-derivation (`loss` below, team notes §3, checked against the golden file by
`losslab golden check`): L = -A * sg(min(exp(min(l - l_s, 20)), c)) * M * l with a detached
trust-region mask M per `loss_mode`, aggregated by verl's `agg_loss`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from losslab.conformance.fixtures import Fixture
from losslab.conformance.frameworks.base import (
    Framework,
    LosslabConfig,
    Rederivation,
    ReferenceResult,
    Resolution,
    ResolvedReference,
    class_defaults,
    refuse_unknown_arguments,
)
from losslab.plan import Revision, RevisionError

REPO = "sail-sg/Stable-RL"
COMMIT = "c6af1d119c0fe30d16dd9a837d35fdf695acd226"
ACTOR_CONFIG = ("verl/workers/config/actor.py", "ActorConfig")
CONFIG_KEYS = ("clip_ratio", "clip_ratio_low", "clip_ratio_high", "clip_ratio_c")
KEYS = (  # the function's arguments a revision may set
    "loss_mode",
    "clip_ratio",
    "clip_ratio_low",
    "clip_ratio_high",
    "clip_ratio_c",
    "loss_agg_mode",
    "global_batch_info",
)
TOKEN_MODES = {  # loss_mode -> LOSS_FAMILIES key
    "dppo_binary_kl": "dppo",
    "dppo_binary_kl_recompute": "dppo",
    "dppo_binary_tv": "dppo",
    "dppo_binary_tv_recompute": "dppo",
    "ppo": "ppo_clip",
    "ppo_recompute": "ppo_clip",
    "ppo_ablation_positive": "ppo_clip",
    "ppo_ablation_negative": "ppo_clip",
    "ppo_ablation_both": "ppo_clip",
    "pg_no_mask": "importance_sampling",
}
TOPK_MODES = ("dppo_topk_kl", "dppo_topk_tv")  # need full-vocabulary top-k inputs
AGG_MODES = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)
# Tinker convention: a plain masked sum. agg_loss(token-mean) with batch_num_tokens=1 gives it.
TINKER_SUM_BATCH_INFO = {"dp_size": 1, "batch_num_tokens": 1}
BATCH_INFO_KEYS = {"dp_size", "batch_num_tokens", "global_batch_size", "loss_scale_factor"}


def read_defaults(files: Any) -> dict[str, Any]:
    return class_defaults(files, *ACTOR_CONFIG, CONFIG_KEYS)


def _finite_number(revision: Revision, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RevisionError(
            f"revision {revision.text!r}: {key} = {value!r}; expected a finite number"
        )
    return float(value)


def resolve(revision: Revision, defaults: dict[str, Any], origin: str) -> Resolution:
    kw = dict(revision.kwargs)
    refuse_unknown_arguments(revision, KEYS, f"compute_policy_loss_with_mask takes {list(KEYS)}")
    notes = []
    mode = kw.get("loss_mode")
    if mode is None:
        mode = "dppo_binary_tv"
        notes.append("loss_mode not given: config.policy_loss default 'dppo_binary_tv'")
    if mode in TOPK_MODES:
        raise RevisionError(
            f"revision {revision.text!r}: loss_mode {mode!r} needs top-k "
            "divergences from full logits, which token log-prob fixtures cannot give"
        )
    if mode not in TOKEN_MODES:
        raise RevisionError(
            f"revision {revision.text!r}: loss_mode = {mode!r}; expected one of {list(TOKEN_MODES)}"
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
    if agg not in AGG_MODES:
        raise RevisionError(
            f"revision {revision.text!r}: loss_agg_mode = {agg!r}; expected one of "
            f"{list(AGG_MODES)}"
        )
    info = kw.get("global_batch_info")
    if info is None:
        info = dict(TINKER_SUM_BATCH_INFO) if agg == "token-mean" else {}
    if not isinstance(info, Mapping) or set(info) - BATCH_INFO_KEYS:
        raise RevisionError(
            f"revision {revision.text!r}: global_batch_info = {info!r}; expected a "
            "dict of dp_size, batch_num_tokens, global_batch_size, loss_scale_factor"
        )
    if defaults:
        notes.append(
            "Stable-RL ActorConfig defaults "
            + ", ".join(f"{k}={v}" for k, v in defaults.items())
            + f" ({origin}); the revision's function fallbacks are used instead"
        )
    params = {
        "loss_mode": mode,
        "clip_ratio_low": low,
        "clip_ratio_high": high,
        "clip_ratio_c": cap,
        "loss_agg_mode": agg,
        "global_batch_info": dict(info),
    }
    return Resolution(params, TOKEN_MODES[mode], tuple(notes))


def describe_aggregation(ref: ResolvedReference) -> str:
    info, agg = ref.params["global_batch_info"], ref.params["loss_agg_mode"]
    plain_sum = info == TINKER_SUM_BATCH_INFO and agg == "token-mean"
    return (
        f"Stable-RL agg_loss {agg} with "
        + ", ".join(f"{k}={v}" for k, v in info.items())
        + (" == masked sum" if plain_sum else "")
        + " on zero-padded [B, T] rows"
    )


# ---------------------------------------------------------------- re-derivation (torch) ---


def trust_region_mask(
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
            raise ValueError(f"Stable-RL loss_mode = {mode!r}; expected one of {list(TOKEN_MODES)}")
        invalid = torch.where(adv > 0, bad_pos, bad_neg)
        return (1.0 - invalid.to(log_prob.dtype)) * response_mask


def agg_loss(
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
    raise ValueError(f"Stable-RL loss_agg_mode = {mode!r}; expected one of {list(AGG_MODES)}")


def loss(
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
    m = trust_region_mask(
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
    return agg_loss(
        loss_mat, response_mask, params["loss_agg_mode"], params["global_batch_info"]
    ), m


def _pad(rows: list[np.ndarray], width: int, dtype: torch.dtype) -> torch.Tensor:
    out = torch.zeros(len(rows), width, dtype=dtype)  # [B, T]
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.from_numpy(np.asarray(row)).to(dtype)
    return out


def rederived_outputs(
    ref: ResolvedReference, fixture: Fixture, dtype: torch.dtype
) -> ReferenceResult:
    """`loss` on the whole padded batch (loss, gradient) and on each sequence alone; the old
    log-probs are the fixture's when every row has them, else the sampler's."""
    seqs = fixture.sequences
    lengths = [len(s.sampler_logprobs) for s in seqs]
    width = max(lengths)

    def run(idx: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        pad = lambda key: _pad([getattr(seqs[i], key) for i in idx], width, dtype)  # noqa: E731
        log_prob = pad("current_logprobs").requires_grad_(True)  # [B, T]
        rollout = pad("sampler_logprobs")
        old = pad("old_logprobs") if all(seqs[i].old_logprobs is not None for i in idx) else rollout
        total, m = loss(log_prob, rollout, old, pad("advantages"), pad("loss_mask"), ref.params)
        (grad,) = torch.autograd.grad(total, log_prob)
        return total.detach(), grad, (m == 0) & (pad("loss_mask") != 0)

    total, grad, blocked = run(list(range(len(seqs))))
    return ReferenceResult(
        loss=float(total),
        per_sequence_loss=[float(run([i])[0]) for i in range(len(seqs))],
        grad_D=[np.asarray(grad[i, :n].numpy()) for i, n in enumerate(lengths)],
        blocked_D=[np.asarray(blocked[i, :n].numpy(), dtype=bool) for i, n in enumerate(lengths)],
    )


def loss_term_abs_sum(ref: ResolvedReference, fixture: Fixture) -> float:
    seqs = fixture.sequences
    width = max(len(s.sampler_logprobs) for s in seqs)
    pad = lambda key: _pad([getattr(s, key) for s in seqs], width, torch.float64)  # noqa: E731
    rollout = pad("sampler_logprobs")
    total, _ = loss(
        pad("current_logprobs"),
        rollout,
        rollout,
        pad("advantages"),
        pad("loss_mask"),
        ref.params,
        abs_terms=True,
    )
    return float(total)


# ---------------------------------------------------------------- losslab and the adapter ---


def agg_loss_reduction(
    params: Mapping[str, Any], fixture: Fixture | None
) -> tuple[dict[str, Any], list[str]]:
    """losslab `reduction=` (and counts) equal to verl's `agg_loss` on this fixture."""
    agg, info = params["loss_agg_mode"], dict(params["global_batch_info"])
    dp = info.get("dp_size", 1)
    if dp != 1:
        return {}, [f"dp_size={dp}: losslab reduces one process's batch"]
    if agg == "token-mean":
        n = info.get("batch_num_tokens")
        if n == 1:
            return {"reduction": "sum"}, []
        return {"reduction": "token-mean", **({"num_tokens": n} if n else {})}, []
    if agg in ("seq-mean-token-sum", "seq-mean-token-mean"):
        g = info.get("global_batch_size")
        return {"reduction": agg, **({"num_sequences": g} if g else {})}, []
    if agg == "seq-mean-token-sum-norm":
        width = max(fixture.lengths) if fixture is not None else None
        c = info.get("loss_scale_factor") or width
        return {"reduction": agg, "norm_constant": c}, [
            "Stable-RL divides by C only (C = loss_scale_factor or the padded width)"
        ]
    return {}, [f"loss_agg_mode {agg!r} has no losslab reduction"]


def losslab_config(ref: ResolvedReference, fixture: Fixture | None = None) -> LosslabConfig:
    p = ref.params
    mode = p["loss_mode"]
    red, notes = agg_loss_reduction(p, fixture)
    if not red:
        return LosslabConfig(None, reason="; ".join(notes))
    c = p["clip_ratio_c"]
    value = {"surrogate": "logprob"}
    if mode in (
        "dppo_binary_tv",
        "dppo_binary_tv_recompute",
        "dppo_binary_kl",
        "dppo_binary_kl_recompute",
    ):
        name = "dppo_binary_tv" if "tv" in mode else "dppo_binary_kl"
        params = {
            "low": p["clip_ratio_low"],
            "high": p["clip_ratio_high"],
            "anchor": "recomputed" if mode.endswith("_recompute") else "sampler",
            "weight_anchor": "sampler",  # always against the rollout, even in *_recompute
            "clip_ratio_c": c,
            "log_ratio_guard": "upper",
            "zero_adv": "negative",
            **red,
        }
        return LosslabConfig(name, params, value, tuple(notes))
    if mode == "ppo":
        params = {
            "clip_low_threshold": 1.0 - p["clip_ratio_low"],
            "clip_high_threshold": 1.0 + p["clip_ratio_high"],
            "surrogate": "ratio",
            "clip_ratio_c": c,
            "zero_adv": "negative",
            **red,
        }
        return LosslabConfig("ppo", params, value, tuple(notes))
    if mode == "pg_no_mask":
        return LosslabConfig("importance_sampling", {"clip_ratio_c": c, **red}, value, tuple(notes))
    return LosslabConfig(
        None,
        reason=f"Stable-RL loss_mode {mode!r} (a paper ablation or the ratio against recomputed "
        "old log-probs) has no losslab loss",
    )


def call_reference(fn: Any, payload: dict[str, Any], space: dict[str, Any], rt: Any) -> dict:
    """verl-style padded call of `compute_policy_loss_with_mask` (runs in pinned_runner)."""
    import torch

    seqs, p = payload["sequences"], payload["params"]
    width = max(len(s["sampler_logprobs"]) for s in seqs)
    fields = {k: p.get(k) for k in ("clip_ratio_low", "clip_ratio_high")}
    fields.update(
        clip_ratio=p.get("clip_ratio_low"),
        clip_ratio_c=p["clip_ratio_c"],
        global_batch_info=dict(p["global_batch_info"]),
        policy_loss={"loss_mode": p["loss_mode"]},
        loss_agg_mode=p["loss_agg_mode"],
    )
    config = rt.Config(fields)

    def run(idx: list[int]) -> tuple[Any, Any, dict[str, float]]:
        t = rt.batch([seqs[i] for i in idx], width)
        zeros = torch.zeros_like(t.sampler)
        result = rt.call(
            fn,
            {
                "old_log_prob": t.old,
                "log_prob": t.current,
                "advantages": t.advantages,
                "response_mask": t.mask,
                "loss_agg_mode": p["loss_agg_mode"],
                "config": config,
                "rollout_is_weights": None,
                "rollout_log_prob": t.sampler,
                "topk_kl": zeros,
                "topk_tv": zeros,
                "entropy": zeros,
                "loss_mode": p["loss_mode"],
            },
        )
        loss = rt.first(result)
        (grad,) = torch.autograd.grad(loss, t.current)
        metrics = result[1] if isinstance(result, (tuple, list)) and len(result) > 1 else {}
        native = rt.numeric(metrics)
        return loss, grad, native

    return rt.padded_outputs(run, seqs)


_EXAMPLE = f"{REPO}@{COMMIT}:verl/trainer/ppo/core_algos.py::compute_policy_loss_with_mask"

FRAMEWORK = Framework(
    name="stable_rl",
    repo=REPO,
    functions=("compute_policy_loss_with_mask",),
    families=tuple(dict.fromkeys(TOKEN_MODES.values())),
    resolve=resolve,
    call_reference=call_reference,
    losslab_config=losslab_config,
    value_convention="logprob",
    aggregation="verl agg_loss (token-mean with batch_num_tokens=1: a masked sum)",
    describe_aggregation=describe_aggregation,
    read_defaults=read_defaults,
    recorded_defaults={
        "clip_ratio": 0.2,
        "clip_ratio_low": 0.2,
        "clip_ratio_high": 0.2,
        "clip_ratio_c": 3.0,
    },
    recorded_commit=COMMIT,
    rederivation=Rederivation(rederived_outputs, loss_term_abs_sum),
    example_revisions={
        "stable_rl": f"{_EXAMPLE}(loss_mode='dppo_binary_tv', clip_ratio=0.15, clip_ratio_c=10)",
        # the mask against recomputed old log-probs (the weight stays against the rollout)
        "stable_rl_recompute": f"{_EXAMPLE}(loss_mode='dppo_binary_tv_recompute', "
        "clip_ratio=0.15, clip_ratio_c=10)",
    },
)
