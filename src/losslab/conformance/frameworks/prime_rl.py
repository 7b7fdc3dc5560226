"""PrimeIntellect-ai/prime-rl `default_loss_fn` (src/prime_rl/trainer/rl/loss.py): "DPPO+KL".

Layout: one call per sample with `LossInputs` (full-length 1-D tensors, `loss_mask` bool,
`inference_logprobs` = sampler log-probs), losses added up across samples; prime-rl's later
division by `rl_scale` (loss.py:394) is not applied (a constant factor, the sum convention).
It adds `kl_tau·(log r)²` on EVERY loss-mask token (masked and A = 0 ones included), has no
importance-weight cap and no log-ratio guard; A = 0 tokens take the A ≤ 0 branch. Defaults
from prime-rl's `DefaultLossConfig` (dppo_mask_low/high 0.2, adv_tau 1, kl_tau 1e-3), read from
packages/prime-rl-configs/src/prime_rl/configs/trainer.py at the pinned commit.
Value: Σ(−keep·A·r + kl_tau·m·(log r)²) (the surrogate form plus the KL term).
"""

from __future__ import annotations

from typing import Any

from losslab.conformance.frameworks.base import (
    Framework,
    LosslabConfig,
    Resolution,
    class_defaults,
    refuse_unknown_arguments,
)
from losslab.plan import Revision, RevisionError

REPO = "PrimeIntellect-ai/prime-rl"
COMMIT = "559b44772e471d1538537b8805cc77f3824a5e64"
CONFIG = ("packages/prime-rl-configs/src/prime_rl/configs/trainer.py", "DefaultLossConfig")
KEYS = ("dppo_mask_low", "dppo_mask_high", "adv_tau", "kl_tau")


def read_defaults(files: Any) -> dict[str, Any]:
    return class_defaults(files, *CONFIG, KEYS)


def resolve(revision: Revision, defaults: dict[str, Any], origin: str) -> Resolution:
    kw = dict(revision.kwargs)
    refuse_unknown_arguments(revision, KEYS, f"prime-rl DefaultLossConfig has {list(KEYS)}")
    params, notes = {}, []
    for key in KEYS:
        value = kw.get(key, defaults[key])
        if key not in kw:
            notes.append(f"{key} not given: {value!r}, DefaultLossConfig's default ({origin})")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise RevisionError(f"revision {revision.text!r}: {key} = {value!r}; expected >= 0")
        params[key] = float(value)
    notes.append("losses summed over samples; prime-rl's division by rl_scale is not applied")
    return Resolution(params, "dppo", tuple(notes))


def losslab_config(ref: Any, fixture: Any = None) -> LosslabConfig:
    p = ref.params
    if p["adv_tau"] != 1.0:
        return LosslabConfig(
            None,
            reason=f"adv_tau = {p['adv_tau']} scales the advantages; losslab has no such knob "
            "(scale the advantages before the loss instead)",
        )
    params = {
        "low": p["dppo_mask_low"],
        "high": p["dppo_mask_high"],
        "clip_ratio_c": float("inf"),
        "log_ratio_guard": "none",
        "kl_tau": p["kl_tau"],
        "zero_adv": "negative",
        "surrogate": "ratio",
    }
    return LosslabConfig("dppo_binary_tv", params, {})


def call_reference(fn: Any, payload: dict[str, Any], space: dict[str, Any], rt: Any) -> dict:
    """Per-sample calls of prime-rl `default_loss_fn`, summed (runs in pinned_runner)."""
    import torch

    seqs, p = payload["sequences"], payload["params"]
    config = rt.Config({k: p[k] for k in ("dppo_mask_low", "dppo_mask_high", "adv_tau", "kl_tau")})
    loss_inputs = space["LossInputs"]

    def sample(s: dict[str, Any]) -> tuple[Any, Any]:
        logprobs = torch.tensor(s["current_logprobs"], dtype=torch.float32).requires_grad_(True)
        mask = torch.tensor(s["loss_mask"], dtype=torch.float32)
        inputs = loss_inputs(
            trainer_logprobs=logprobs,
            inference_logprobs=torch.tensor(s["sampler_logprobs"], dtype=torch.float32),
            ref_logprobs=None,
            advantages=mask * float(s["advantage"]),
            loss_mask=mask > 0,
            loss_weights=None,
        )
        return rt.first(fn(inputs, config)), logprobs

    per_seq, grads, total = [], [], 0.0
    for s in seqs:
        loss, logprobs = sample(s)
        (grad,) = torch.autograd.grad(loss, logprobs)
        per_seq.append(float(loss))
        grads.append(grad.tolist())
        total = total + loss.detach()
    return {
        "loss": float(total),
        "per_sequence_loss": per_seq,
        "native_metrics": {},
        "grad_D": grads,
    }


_EXAMPLE = f"{REPO}@{COMMIT}:src/prime_rl/trainer/rl/loss.py::default_loss_fn"

FRAMEWORK = Framework(
    name="prime_rl",
    repo=REPO,
    functions=("default_loss_fn",),
    families=("dppo",),
    resolve=resolve,
    call_reference=call_reference,
    losslab_config=losslab_config,
    value_convention="surrogate",
    aggregation="per-sample sums added up (before prime-rl's / rl_scale)",
    read_defaults=read_defaults,
    recorded_defaults={"dppo_mask_low": 0.2, "dppo_mask_high": 0.2, "adv_tau": 1.0, "kl_tau": 1e-3},
    recorded_commit=COMMIT,
    extra_roots=("LossInputs",),
    example_revisions={
        "prime_rl": f"{_EXAMPLE}(dppo_mask_low=0.15, dppo_mask_high=0.15)",
        # without its KL term
        "prime_rl_kl0": f"{_EXAMPLE}(dppo_mask_low=0.15, dppo_mask_high=0.15, kl_tau=0)",
    },
)
