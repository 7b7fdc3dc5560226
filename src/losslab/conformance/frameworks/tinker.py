"""Tinker's built-in losses (`forward_backward(..., loss_fn)`), from their DOCUMENTED formulas:
documented formula, no source.

Tinker's loss code runs on its servers and is not public, so nothing can be executed; this
adapter restates the formulas of the Tinker loss docs (tinker-docs.thinkingmachines.ai, the
Losses pages, as summarised in the team's Tinker contract §2.7) and labels every number as a
re-derivation. Per token t with r = e^(ℓ − ℓ_s), A the advantage, m the weight/loss mask:

    cross_entropy        −Σ m·ℓ
    importance_sampling  −Σ m·r·A
    ppo                  −Σ m·min(r·A, clip(r, lo, hi)·A)    lo/hi ABSOLUTE ratio bounds (0.8/1.2)
    cispo                −Σ m·sg(clip(r, lo, hi))·ℓ·A       doc default one-sided lo 0, hi 4
    dro                  −Σ m·(ℓ·A − ½β(ℓ − ℓ_s)²)          β undocumented; doc example 0.05

All are plain sums (`loss:sum`); no log-ratio guard and no cap is documented, so none is
applied (a token with log r > 88.7 overflows float32 to inf, as an unguarded exp does).
"""

from __future__ import annotations

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
)
from losslab.plan import Revision, RevisionError

REPO = "thinking-machines-lab/tinker"
DOC = "tinker-docs.thinkingmachines.ai losses (Tinker SDK 0.38.0)"
# the public SDK commit whose `LossFnType` names these five losses (the formulas are the docs')
SDK_COMMIT = "420804ce8f372543a4f6f2592caca2497e5e8a9f"
SDK_PATH = "src/tinker/types/loss_fn_type.py"
# loss_fn -> (its loss_fn_config keys with the documented defaults, losslab loss family)
LOSS_FNS: dict[str, tuple[dict[str, float], str]] = {
    "cross_entropy": ({}, "cross_entropy"),
    "importance_sampling": ({}, "importance_sampling"),
    "ppo": ({"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}, "ppo_clip"),
    "cispo": ({"clip_low_threshold": 0.0, "clip_high_threshold": 4.0}, "cispo"),
    "dro": ({"beta": 0.05}, "dro"),
}


UNGUARDED_REASON = (
    "guard: losslab clamps l - l_s at 20 before exp (LOG_RATIO_MAX) and has no knob to lift "
    "it; Tinker documents no guard, so tokens with log r > 20 differ (e^91 = inf in float32)"
)


def resolve(revision: Revision, defaults: dict[str, Any], origin: str) -> Resolution:
    kw = dict(revision.kwargs)
    name = kw.pop("loss_fn", None)
    if name not in LOSS_FNS:
        raise RevisionError(
            f"revision {revision.text!r}: loss_fn = {name!r}; expected one of {sorted(LOSS_FNS)}"
        )
    keys, family = LOSS_FNS[name]
    unknown = set(kw) - set(keys)
    if unknown:
        raise RevisionError(
            f"revision {revision.text!r}: unknown loss_fn_config keys {sorted(unknown)} for "
            f"{name!r}; it takes {sorted(keys) or 'none'}"
        )
    config, notes = {}, ["documented formula, no source: Tinker's loss code is not public"]
    for key, default in keys.items():
        value = kw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise RevisionError(f"revision {revision.text!r}: {key} = {value!r}; expected a number")
        config[key] = float(value)
        if key not in kw:
            notes.append(f"{key} not given: {default}, the documented default")
    return Resolution({"loss_fn": name, "loss_fn_config": config}, family, tuple(notes))


def documented_terms(
    logprobs: torch.Tensor,
    mask: torch.Tensor,
    sampler: torch.Tensor,
    adv: torch.Tensor,
    name: str,
    config: dict[str, float],
) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-token loss terms, blocked tokens) of the documented formula of `name`."""
    blocked = torch.zeros_like(mask, dtype=torch.bool)
    if name == "cross_entropy":
        return -(mask * logprobs), blocked
    ratio = torch.exp(logprobs - sampler)
    if name == "importance_sampling":
        return -(mask * ratio * adv), blocked
    if name == "dro":
        penalty = 0.5 * config["beta"] * (logprobs - sampler) ** 2
        return -(mask * (logprobs * adv - penalty)), blocked
    lo, hi = config["clip_low_threshold"], config["clip_high_threshold"]
    if name == "cispo":
        return -(mask * torch.clamp(ratio, lo, hi).detach() * logprobs * adv), blocked
    clipped = torch.clamp(ratio, lo, hi)
    blocked = (((adv > 0) & (ratio > hi)) | ((adv < 0) & (ratio < lo))) & (mask != 0)
    return -(mask * torch.minimum(ratio * adv, clipped * adv)), blocked


def _row(fixture: Fixture, i: int, key: str, dtype: torch.dtype) -> torch.Tensor:
    return torch.from_numpy(np.asarray(getattr(fixture.sequences[i], key))).to(dtype)


def _terms(ref: ResolvedReference, fixture: Fixture, i: int, dtype: torch.dtype) -> Any:
    logprobs = _row(fixture, i, "current_logprobs", dtype).requires_grad_(True)
    s = fixture.sequences[i]
    mask = _row(fixture, i, "loss_mask", dtype)
    adv = torch.full_like(mask, float(s.advantage))
    terms, blocked = documented_terms(
        logprobs,
        mask,
        _row(fixture, i, "sampler_logprobs", dtype),
        adv,
        ref.params["loss_fn"],
        ref.params["loss_fn_config"],
    )
    return logprobs, terms, blocked


def rederived_outputs(
    ref: ResolvedReference, fixture: Fixture, dtype: torch.dtype
) -> ReferenceResult:
    """The documented sum over every datum (each datum's terms are independent)."""
    per_seq, grads, blocked_D = [], [], []
    for i in range(len(fixture.sequences)):
        logprobs, terms, blocked = _terms(ref, fixture, i, dtype)
        loss = terms.sum()
        (grad,) = torch.autograd.grad(loss, logprobs)
        per_seq.append(float(loss.detach()))
        grads.append(grad.numpy())
        blocked_D.append(blocked.numpy().astype(bool))
    return ReferenceResult(
        loss=float(np.sum(np.asarray(per_seq, np.float32))),
        per_sequence_loss=per_seq,
        grad_D=grads,
        blocked_D=blocked_D,
    )


def loss_term_abs_sum(ref: ResolvedReference, fixture: Fixture) -> float:
    total = 0.0
    for i in range(len(fixture.sequences)):
        _, terms, _ = _terms(ref, fixture, i, torch.float64)
        total += float(terms.detach().abs().sum())
    return total


def losslab_config(ref: ResolvedReference, fixture: Fixture | None = None) -> LosslabConfig:
    """losslab's losses are Tinker's convention: the same name and keys, reduction sum."""
    name, config = ref.params["loss_fn"], ref.params["loss_fn_config"]
    params: dict[str, Any] = {**config, "reduction": "sum"}
    if name == "ppo":
        params["zero_adv"] = "keep"
    if name in ("ppo", "importance_sampling"):
        # the ratio enters the gradient: losslab's LOG_RATIO_MAX clamp shows where log r > 20
        return LosslabConfig(name, params, {}, reason=UNGUARDED_REASON)
    return LosslabConfig(name, params, {})


def call_reference(fn: Any, payload: dict[str, Any], space: dict[str, Any], rt: Any) -> dict:
    """Never runs: Tinker's losses have no public source (the adapter is re-derived only)."""
    raise RuntimeError("Tinker's built-in losses have no public source to execute")


FRAMEWORK = Framework(
    name="tinker",
    repo=REPO,
    functions=("forward_backward",),
    families=tuple(dict.fromkeys(family for _, family in LOSS_FNS.values())),
    resolve=resolve,
    call_reference=call_reference,
    losslab_config=losslab_config,
    value_convention="surrogate",
    aggregation="plain sum over tokens and datums (loss:sum)",
    recorded_commit=SDK_COMMIT,
    rederivation=Rederivation(rederived_outputs, loss_term_abs_sum),
    fetchable=False,
    unfetchable_reason=f"documented formula, no source: Tinker's loss code is not public ({DOC})",
    example_revisions={
        f"tinker_{name}": f"{REPO}@{SDK_COMMIT}:{SDK_PATH}::forward_backward(loss_fn='{name}')"
        for name in LOSS_FNS
    },
)
