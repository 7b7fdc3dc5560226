"""modal-projects/spindle `_loss(logprobs, batch)` (Tinker-style server on Megatron).

No commit of Spindle can be fetched here: the plan pins e58ebef1, and the only text losslab has
seen is the indexed copy at 88b2e5f3 (team notes reference_losses.md §4). So by default Spindle
is compared through losslab's re-derivation of that text (`loss_terms` below, checked against the
golden file by `losslab golden check`), labelled with that commit; a user with a checkout passes
`--source modal-projects/spindle=PATH` and the pinned function runs.
Layout: packed rows (one flat [sum L] tensor); loss = -sum_t m_t * J_t with J per `loss_name`
(ppo, dppo, cispo, dro, importance_sampling, cross_entropy) and `loss_config` validated like
Spindle's `_loss_config`; value −Σ m·J (the surrogate); a plain sum.
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
)
from losslab.plan import Revision, RevisionError

REPO = "modal-projects/spindle"
TEXT_COMMIT = "88b2e5f3"  # the indexed text the re-derivation restates (not fetchable)
# Spindle `_loss_config`: each loss accepts only its own keys; defaults as in `_loss`.
LOSS_KEYS: dict[str, dict[str, float]] = {
    "cross_entropy": {},
    "importance_sampling": {},
    "ppo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    "cispo": {"clip_low_threshold": 0.0, "clip_high_threshold": 4.0},
    "dro": {"beta": 0.05},
    "dppo": {"tv_threshold": 0.1},
}
FAMILY_OF = {  # loss_name -> LOSS_FAMILIES key
    "cross_entropy": "cross_entropy",
    "importance_sampling": "importance_sampling",
    "ppo": "ppo_clip",
    "cispo": "cispo",
    "dro": "dro",
    "dppo": "dppo",
}


def resolve(revision: Revision, defaults: dict[str, Any], origin: str) -> Resolution:
    kw = dict(revision.kwargs)
    name = kw.pop("loss_name", None)
    if name not in LOSS_KEYS:
        raise RevisionError(
            f"revision {revision.text!r}: loss_name = {name!r}; expected one of {sorted(LOSS_KEYS)}"
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
    params = {"loss_name": name, "loss_config": loss_config(name, config, revision)}
    return Resolution(params, FAMILY_OF[name])


def loss_config(
    name: str, config: Mapping[str, Any], revision: Revision | None = None
) -> dict[str, float]:
    """Validate a Spindle loss config as `_loss_config` does and fill in `_loss`'s defaults."""
    where = f"revision {revision.text!r}" if revision is not None else f"spindle {name} config"
    allowed = LOSS_KEYS[name]
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


# ---------------------------------------------------------------- re-derivation (torch) ---


def loss_terms(
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
        raise ValueError(f"spindle loss_name = {loss_name!r}; expected one of {sorted(LOSS_KEYS)}")
    return -(objective * mask), blocked & (mask != 0)


def _packed(fixture: Fixture, idx: list[int], key: str, dtype: torch.dtype) -> torch.Tensor:
    seqs = fixture.sequences
    return torch.from_numpy(np.concatenate([getattr(seqs[i], key) for i in idx])).to(dtype)


def rederived_outputs(
    ref: ResolvedReference, fixture: Fixture, dtype: torch.dtype
) -> ReferenceResult:
    """`loss_terms` on the whole packed batch (loss, gradient) and on each sequence alone."""
    name, config = ref.params["loss_name"], ref.params["loss_config"]
    lengths = [len(s.sampler_logprobs) for s in fixture.sequences]

    def run(idx: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        cat = lambda key: _packed(fixture, idx, key, dtype)  # noqa: E731
        logprobs = cat("current_logprobs").requires_grad_(True)  # packed [sum L]
        terms, blocked = loss_terms(
            logprobs, cat("loss_mask"), cat("sampler_logprobs"), cat("advantages"), name, config
        )
        loss = terms.sum()
        (grad,) = torch.autograd.grad(loss, logprobs)
        return loss.detach(), grad, blocked

    loss, grad, blocked = run(list(range(len(lengths))))
    split = np.cumsum(lengths)[:-1]
    return ReferenceResult(
        loss=float(loss),
        per_sequence_loss=[float(run([i])[0]) for i in range(len(lengths))],
        grad_D=list(np.split(grad.numpy(), split)),
        blocked_D=[np.asarray(b, dtype=bool) for b in np.split(blocked.numpy(), split)],
    )


def loss_term_abs_sum(ref: ResolvedReference, fixture: Fixture) -> float:
    everything = list(range(len(fixture.sequences)))
    cat = lambda key: _packed(fixture, everything, key, torch.float64)  # noqa: E731
    terms, _ = loss_terms(
        cat("current_logprobs"),
        cat("loss_mask"),
        cat("sampler_logprobs"),
        cat("advantages"),
        ref.params["loss_name"],
        ref.params["loss_config"],
    )
    return float(terms.abs().sum())


# ---------------------------------------------------------------- losslab and the adapter ---


def losslab_config(ref: ResolvedReference, fixture: Fixture | None = None) -> LosslabConfig:
    name, cfg = ref.params["loss_name"], ref.params["loss_config"]
    if name == "dppo":
        tau = cfg["tv_threshold"]
        params = {
            "low": tau,
            "high": tau,
            "clip_ratio_c": float("inf"),
            "log_ratio_guard": "none",
            "zero_adv": "keep",
            "surrogate": "ratio",
        }
        return LosslabConfig("dppo_binary_tv", params, {}, ("one tau for both directions",))
    if name == "ppo":
        params = {
            "clip_low_threshold": cfg["clip_low_threshold"],
            "clip_high_threshold": cfg["clip_high_threshold"],
        }
        return LosslabConfig(
            "ppo",
            params,
            {},
            (
                "losslab's ppo guards l - l_s at 20 (straight through); Spindle has no guard, so "
                "the two differ only where l - l_s > 20",
            ),
        )
    if name in ("cispo", "dro", "importance_sampling", "cross_entropy"):
        return LosslabConfig(name, dict(cfg), {})
    return LosslabConfig(None, reason=f"Spindle loss_name {name!r} has no losslab loss")


def call_reference(fn: Any, payload: dict[str, Any], space: dict[str, Any], rt: Any) -> dict:
    """Packed call of Spindle `_loss` (runs in pinned_runner)."""
    import torch

    seqs, p = payload["sequences"], payload["params"]
    config = dict(p["loss_config"])
    if "_loss_config" in payload["extra_roots"]:  # the reference's own validation, of the keys
        given = payload["revision_kwargs"]  # the revision itself sets (defaults are its own)
        keys = set(given.get("loss_config") or {}) | (set(given) - {"loss_name", "loss_config"})
        if payload["clip_bounds"] is not None:
            keys |= {"clip_low_threshold", "clip_high_threshold"}
        config = space["_loss_config"](
            p["loss_name"], {k: v for k, v in config.items() if k in keys}
        )

    def cat(idx: list[int], key: str) -> Any:
        return torch.tensor([x for i in idx for x in seqs[i][key]], dtype=torch.float32)

    def run(idx: list[int]) -> tuple[Any, Any]:
        logprobs = cat(idx, "current_logprobs").requires_grad_(True)  # packed [sum L]
        adv = torch.tensor(
            [seqs[i]["advantage"] * m for i in idx for m in seqs[i]["loss_mask"]],
            dtype=torch.float32,
        )
        batch = {
            "loss_mask": cat(idx, "loss_mask"),
            "sampling_logprobs": cat(idx, "sampler_logprobs"),
            "advantages": adv,
            "loss_name": p["loss_name"],
            "loss_config": config,
        }
        loss = rt.first(fn(logprobs, batch))
        (grad,) = torch.autograd.grad(loss, logprobs)
        return loss, grad

    loss, grad = run(list(range(len(seqs))))
    per_seq = [float(run([i])[0]) for i in range(len(seqs))]
    return {
        "loss": float(loss),
        "per_sequence_loss": per_seq,
        "grad_D": rt.split(grad, [len(s["sampler_logprobs"]) for s in seqs]),
        "native_metrics": {},
    }


FRAMEWORK = Framework(
    name="spindle",
    repo=REPO,
    functions=("_loss",),
    families=tuple(dict.fromkeys(FAMILY_OF.values())),
    resolve=resolve,
    call_reference=call_reference,
    losslab_config=losslab_config,
    value_convention="surrogate",
    aggregation="plain masked sum -sum(m*J) on packed rows",
    recorded_commit=TEXT_COMMIT,
    rederivation=Rederivation(rederived_outputs, loss_term_abs_sum),
    extra_roots=("_loss_config",),
    fetchable=False,
    unfetchable_reason=(
        "no commit of modal-projects/spindle is fetchable (the plan pins e58ebef1); losslab "
        f"re-derives the text indexed at {TEXT_COMMIT}"
    ),
    example_revisions={
        "spindle": f"{REPO}@{TEXT_COMMIT}:src/spindle/backends/megatron_runtime/common/"
        "forward_backward.py::_loss(loss_name='dppo', tv_threshold=0.15)",
    },
)
