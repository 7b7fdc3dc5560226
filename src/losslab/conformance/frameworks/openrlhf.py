"""OpenRLHF/OpenRLHF `PolicyLoss` (openrlhf/models/loss.py): PPO, dual-clip PPO, GSPO and the
vLLM importance-sampling corrections (TIS, IcePop, seq-mask-TIS) in one `nn.Module`.

The adapter builds the pinned class with the revision's constructor arguments and calls its
`forward(log_probs, old_log_probs, advantages, action_mask, rollout_log_probs)` on zero-padded
[B, T] rows. Without a vLLM correction `old_log_probs` = the sampler's (one pass on a fresh
batch); with one it is the fixture's recomputed old log-probs, so the correction weight
π_old/π_rollout differs from 1 and the PPO ratio is π_θ/π_old (decoupled PPO). PPO's ratio is
exp(clamp(Δ, -20, 20)): a token past |Δ| = 20 gets no gradient. Aggregation `aggregate_loss`:
the token mean over this batch (`token_level_loss=True`, no global count), GSPO the mean over
sequences of each sequence's token mean (it forces `token_level_loss=False`). Defaults are the
constructor's (eps 0.2/0.2, no dual clip, no correction).
"""

from __future__ import annotations

import math
from typing import Any

from losslab.conformance.frameworks.base import (
    Framework,
    LosslabConfig,
    Resolution,
    refuse_unknown_arguments,
)
from losslab.plan import Revision, RevisionError

REPO = "OpenRLHF/OpenRLHF"
COMMIT = "3c3be6234e0cb353e76bb8019947db9dfe99fca7"
PATH = "openrlhf/models/loss.py"
DEFAULTS: dict[str, Any] = {
    "clip_eps_low": 0.2,
    "clip_eps_high": 0.2,
    "dual_clip": None,
    "token_level_loss": True,
    "policy_loss_type": "ppo",
    "enable_vllm_is_correction": False,
    "vllm_is_truncated_threshold": None,
    "vllm_is_correction_type": "tis",
}
CORRECTION_FAMILY = {
    "tis": "rollout_correction",
    "icepop": "icepop",
    "seq-mask-tis": "rollout_correction",
}


def resolve(revision: Revision, defaults: dict[str, Any], origin: str) -> Resolution:
    kw = dict(revision.kwargs)
    refuse_unknown_arguments(
        revision, tuple(DEFAULTS), f"OpenRLHF PolicyLoss(...) takes {list(DEFAULTS)}"
    )
    params = {k: kw.get(k, v) for k, v in DEFAULTS.items()}
    notes = [
        f"{k} not given: {v!r}, the constructor default" for k, v in DEFAULTS.items() if k not in kw
    ]
    for key in ("clip_eps_low", "clip_eps_high"):
        value = params[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise RevisionError(f"revision {revision.text!r}: {key} = {value!r}; expected a number")
    if params["policy_loss_type"] not in ("ppo", "gspo"):
        raise RevisionError(
            f"revision {revision.text!r}: policy_loss_type = {params['policy_loss_type']!r}; "
            "expected 'ppo' or 'gspo'"
        )
    correction = params["enable_vllm_is_correction"]
    if correction:
        bounds = params["vllm_is_truncated_threshold"]
        if not (isinstance(bounds, (list, tuple)) and len(bounds) == 2):
            raise RevisionError(
                f"revision {revision.text!r}: vllm_is_truncated_threshold = {bounds!r}; "
                "expected [low, high] with enable_vllm_is_correction=True"
            )
        params["vllm_is_truncated_threshold"] = [float(b) for b in bounds]
    if params["policy_loss_type"] == "gspo":
        family = "gspo"
    elif correction:
        family = CORRECTION_FAMILY[params["vllm_is_correction_type"]]
    else:
        family = "ppo_clip" if params["dual_clip"] is None else "dual_clip"
    return Resolution(params, family, tuple(notes))


def losslab_config(ref: Any, fixture: Any = None) -> LosslabConfig:
    """The `losslab.losses` configuration of each PolicyLoss setting, or why there is none."""
    p = ref.params
    low, high = 1.0 - p["clip_eps_low"], 1.0 + p["clip_eps_high"]
    if p["policy_loss_type"] == "gspo":
        if p["enable_vllm_is_correction"]:
            return LosslabConfig(None, reason="GSPO with the vLLM ratio: no losslab knob")
        params = {
            "level": "sequence",  # OpenRLHF's s_d is differentiated through the mean
            "log_ratio_guard": "none",  # a plain exp of the mean log-ratio
            "epsilon_low": p["clip_eps_low"],
            "epsilon_high": p["clip_eps_high"],
            "zero_adv": "keep",
            "reduction": "seq-mean-token-mean",
        }
        return LosslabConfig("gspo", params, {})
    guard = (
        "guard: OpenRLHF clamps log r to [-20, 20] before exp, so a token past it gets no "
        "gradient; losslab passes the gradient through its clamp and has no knob for that "
        "(A < 0 tokens with log r > 20 differ)"
    )
    if p["enable_vllm_is_correction"]:
        lo, hi = p["vllm_is_truncated_threshold"]
        kind = p["vllm_is_correction_type"]
        common = {
            "anchor": "recomputed",
            "clip_low_threshold": low,
            "clip_high_threshold": high,
            "zero_adv": "keep",
            "reduction": "token-mean",
        }
        if kind == "icepop":
            return LosslabConfig("icepop", {"low": lo, "high": hi, **common}, {}, reason=guard)
        if kind == "tis":
            params = {"level": "token", "mode": "truncate", "cap": hi, "lower": lo, **common}
            return LosslabConfig("rollout_correction", params, {}, reason=guard)
        return LosslabConfig(
            None,
            reason="seq-mask-tis masks by the sequence geometric mean but weights by the token "
            "ratio; losslab's rollout_correction does one level at a time",
        )
    params = {
        "clip_low_threshold": low,
        "clip_high_threshold": high,
        "zero_adv": "keep",
        "reduction": "token-mean",
    }
    if p["dual_clip"] is None:
        return LosslabConfig("ppo", {**params, "surrogate": "clipped"}, {}, reason=guard)
    return LosslabConfig("dual_clip_ppo", {**params, "clip_ratio_c": float(p["dual_clip"])}, {})


def call_reference(fn: Any, payload: dict[str, Any], space: dict[str, Any], rt: Any) -> dict:
    """Padded call of OpenRLHF `PolicyLoss(...).forward` (runs in pinned_runner)."""

    seqs, p = payload["sequences"], payload["params"]
    width = max(len(s["sampler_logprobs"]) for s in seqs)
    module = fn(**p)

    def run(idx: list[int]) -> tuple[Any, Any, dict[str, float]]:
        t = rt.batch([seqs[i] for i in idx], width)
        old = t.old if p["enable_vllm_is_correction"] else t.sampler
        out = module(t.current, old, t.advantages, action_mask=t.mask, rollout_log_probs=t.sampler)
        loss = rt.first(out)
        return loss, rt.grad(loss, t.current), {}

    return rt.padded_outputs(run, seqs)


def _example(args: str = "") -> str:
    return f"{REPO}@{COMMIT}:{PATH}::PolicyLoss({args})"


FRAMEWORK = Framework(
    name="openrlhf",
    repo=REPO,
    functions=("PolicyLoss",),
    families=("ppo_clip", "dual_clip", "gspo", "icepop", "rollout_correction"),
    resolve=resolve,
    call_reference=call_reference,
    losslab_config=losslab_config,
    value_convention="surrogate",
    aggregation="aggregate_loss: token mean over this batch (GSPO: mean of sequence means)",
    recorded_commit=COMMIT,
    example_revisions={
        "openrlhf_ppo": _example(),
        "openrlhf_dual_clip": _example("dual_clip=3.0"),
        "openrlhf_gspo": _example(
            "policy_loss_type='gspo', clip_eps_low=0.0003, clip_eps_high=0.0004"
        ),
        # bounds that bind on the fixtures' old/rollout ratios (old = sampler + N(0, 0.3))
        "openrlhf_tis": _example(
            "enable_vllm_is_correction=True, vllm_is_truncated_threshold=[0.5, 1.5], "
            "vllm_is_correction_type='tis'"
        ),
        "openrlhf_icepop": _example(
            "enable_vllm_is_correction=True, vllm_is_truncated_threshold=[0.8, 1.25], "
            "vllm_is_correction_type='icepop'"
        ),
    },
)
