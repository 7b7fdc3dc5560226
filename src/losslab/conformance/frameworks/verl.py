"""verl-project/verl `compute_policy_loss_dppo_tv` / `_dppo_kl` (verl's own DPPO-Binary-TV/KL).

Layout: zero-padded [B, T] rows; the function sees only `old_log_prob` and takes BOTH the mask
and the importance weight against it (core_algos.py at 1dda039b, lines 1412-1428). verl's
trainer feeds it the rollout log-probs in bypass mode (`bypass_mode=True`, the verl DPPO
example) and recomputed old log-probs otherwise; the revision's `bypass_mode` says which
(default: `RolloutCorrectionConfig.bypass_mode`, False). `rollout_is_weights` is None (no
rollout correction configured).

Effective defaults come from verl's `ActorConfig` (verl/workers/config/actor.py): the function
has no fallbacks of its own except `config.get("clip_ratio_c", 20.0)`, which a real ActorConfig
never reaches (it defaults c to 3.0). So `clip_ratio=0.15` alone leaves clip_ratio_low/high at
ActorConfig's 0.2, as in a real verl run. Value convention −A·sg(min(r, c))·M·ℓ ("logprob");
aggregation `agg_loss` (token-mean with batch_num_tokens=1 = a masked sum, unless given).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from losslab.conformance.frameworks.base import (
    Framework,
    LosslabConfig,
    Resolution,
    class_defaults,
    refuse_unknown_arguments,
)
from losslab.conformance.frameworks.stable_rl import TINKER_SUM_BATCH_INFO, agg_loss_reduction
from losslab.plan import Revision, RevisionError

REPO = "verl-project/verl"
COMMIT = "1dda039b9c6311889a9c9a26040677e1254814f9"
ACTOR_KEYS = ("clip_ratio", "clip_ratio_low", "clip_ratio_high", "clip_ratio_c", "loss_agg_mode")
KEYS = (*ACTOR_KEYS, "global_batch_info", "bypass_mode")
AGG_MODES = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)


def read_defaults(files: Any) -> dict[str, Any]:
    out = class_defaults(files, "verl/workers/config/actor.py", "ActorConfig", ACTOR_KEYS)
    out.update(
        class_defaults(
            files, "verl/trainer/config/algorithm.py", "RolloutCorrectionConfig", ("bypass_mode",)
        )
    )
    return out


def _number(revision: Any, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise RevisionError(f"revision {revision.text!r}: {key} = {value!r}; expected a number")
    return float(value)


def resolve(revision: Revision, defaults: dict[str, Any], origin: str) -> Resolution:
    kw = dict(revision.kwargs)
    refuse_unknown_arguments(
        revision, KEYS, f"verl {revision.function} takes the config fields {list(KEYS)}"
    )
    if revision.clip_bounds is not None:
        raise RevisionError(
            f"revision {revision.text!r}: 'clip LO/HI' is a ratio bound; verl dppo_tv takes TV "
            "thresholds clip_ratio_low/clip_ratio_high"
        )
    notes = []
    eff = {}
    for key in (*ACTOR_KEYS, "bypass_mode"):
        if key in kw:
            eff[key] = kw[key]
        else:
            eff[key] = defaults[key]
            notes.append(f"{key} not given: {defaults[key]!r}, the config default ({origin})")
    if "clip_ratio" in kw and ("clip_ratio_low" not in kw or "clip_ratio_high" not in kw):
        notes.append(
            "clip_ratio is set but clip_ratio_low/high are not: verl reads clip_ratio only when "
            "they are None, and ActorConfig gives them values, so the thresholds are "
            f"{eff['clip_ratio_low']}/{eff['clip_ratio_high']}"
        )
    agg = eff["loss_agg_mode"]
    if agg not in AGG_MODES:
        raise RevisionError(
            f"revision {revision.text!r}: loss_agg_mode = {agg!r}; expected one of {list(AGG_MODES)}"
        )
    info = kw.get("global_batch_info")
    if info is None:
        info = dict(TINKER_SUM_BATCH_INFO) if agg == "token-mean" else {}
    if not isinstance(info, Mapping):
        raise RevisionError(
            f"revision {revision.text!r}: global_batch_info = {info!r}; expected a dict"
        )
    if not isinstance(eff["bypass_mode"], bool):
        raise RevisionError(
            f"revision {revision.text!r}: bypass_mode = {eff['bypass_mode']!r}; expected True/False"
        )
    params = {
        "loss_mode": "dppo_kl" if revision.function.endswith("_kl") else "dppo_tv",
        "clip_ratio": _number(revision, "clip_ratio", eff["clip_ratio"]),
        "clip_ratio_low": _number(revision, "clip_ratio_low", eff["clip_ratio_low"]),
        "clip_ratio_high": _number(revision, "clip_ratio_high", eff["clip_ratio_high"]),
        "clip_ratio_c": _number(revision, "clip_ratio_c", eff["clip_ratio_c"]),
        "loss_agg_mode": agg,
        "global_batch_info": dict(info),
        "bypass_mode": eff["bypass_mode"],
    }
    return Resolution(params, "dppo", tuple(notes))


def losslab_config(ref: Any, fixture: Any = None) -> LosslabConfig:
    p = ref.params
    if p["loss_agg_mode"] == "token-sum":
        red, notes = {"reduction": "sum"}, []
    elif p["loss_agg_mode"] == "seq-mean-token-sum-norm":
        return LosslabConfig(
            None,
            reason="verl seq-mean-token-sum-norm divides by G*C; losslab's divides by C only "
            "(set norm_constant = G*C by hand for one fixed batch)",
        )
    else:
        red, notes = agg_loss_reduction(p, fixture)
    if not red:
        return LosslabConfig(None, reason="; ".join(notes))
    anchor = "sampler" if p["bypass_mode"] else "recomputed"
    params = {
        "low": p["clip_ratio_low"],
        "high": p["clip_ratio_high"],
        "anchor": anchor,
        "weight_anchor": anchor,  # verl takes the weight against old as well as the mask
        "clip_ratio_c": p["clip_ratio_c"],
        "log_ratio_guard": "both",
        "zero_adv": "negative",
        **red,
    }
    loss = "dppo_binary_kl" if p["loss_mode"] == "dppo_kl" else "dppo_binary_tv"
    return LosslabConfig(loss, params, {"surrogate": "logprob"}, tuple(notes))


def call_reference(fn: Any, payload: dict[str, Any], space: dict[str, Any], rt: Any) -> dict:
    """Padded call of verl `compute_policy_loss_dppo_tv` (runs in pinned_runner)."""
    import torch

    seqs, p = payload["sequences"], payload["params"]
    width = max(len(s["sampler_logprobs"]) for s in seqs)
    keys = ("clip_ratio", "clip_ratio_low", "clip_ratio_high", "clip_ratio_c", "loss_agg_mode")
    config = rt.Config({**{k: p[k] for k in keys}, "global_batch_info": p["global_batch_info"]})

    def run(idx: list[int]) -> tuple[Any, Any, dict[str, float]]:
        t = rt.batch([seqs[i] for i in idx], width)
        loss, metrics = fn(
            old_log_prob=t.sampler if p["bypass_mode"] else t.old,
            log_prob=t.current,
            advantages=t.advantages,
            response_mask=t.mask,
            loss_agg_mode=p["loss_agg_mode"],
            config=config,
            rollout_is_weights=None,
        )
        (grad,) = torch.autograd.grad(loss, t.current)
        native = rt.numeric(metrics)
        return loss, grad, native

    return rt.padded_outputs(run, seqs)


_EXAMPLE = f"{REPO}@{COMMIT}:verl/trainer/ppo/core_algos.py::compute_policy_loss_dppo_tv"

FRAMEWORK = Framework(
    name="verl",
    repo=REPO,
    functions=("compute_policy_loss_dppo_tv", "compute_policy_loss_dppo_kl"),
    families=("dppo",),
    resolve=resolve,
    call_reference=call_reference,
    losslab_config=losslab_config,
    value_convention="logprob",
    aggregation="verl agg_loss (token-mean with batch_num_tokens=1: a masked sum)",
    read_defaults=read_defaults,
    recorded_defaults={
        "clip_ratio": 0.2,
        "clip_ratio_low": 0.2,
        "clip_ratio_high": 0.2,
        "clip_ratio_c": 3.0,
        "loss_agg_mode": "token-mean",
        "bypass_mode": False,
    },
    recorded_commit=COMMIT,
    example_revisions={
        "verl": f"{_EXAMPLE}(clip_ratio_low=0.15, clip_ratio_high=0.15, clip_ratio_c=10, "
        "bypass_mode=True)",
        # mask and weight against recomputed old log-probs (verl's default, no bypass)
        "verl_nonbypass": f"{_EXAMPLE}(clip_ratio_low=0.15, clip_ratio_high=0.15, "
        "clip_ratio_c=10, bypass_mode=False)",
        # c unset: ActorConfig's cap 3.0
        "verl_c_default": f"{_EXAMPLE}(clip_ratio_low=0.15, clip_ratio_high=0.15, "
        "bypass_mode=True)",
    },
)
