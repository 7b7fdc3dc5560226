"""inclusionAI/AReaL's policy losses (areal/utils/functional/functional.py): `ppo_actor_loss_fn`
(PPO, Clip-Higher, dual clip, GSPO's sequence ratio, decoupled PPO with the behaviour
importance weight of `apply_rejection_sampling`: clamp = TIS, mask = MIS / IcePop) and
`sapo_loss_fn`, executed from the pinned commit.

Layout: zero-padded [B, T] rows (AReaL's 2-D padded path, no `cu_seqlens`), `loss_mask` bool,
advantages broadcast over each row's loss tokens. Without rejection sampling
`proximal_logprobs` = `old_logprobs` = the sampler's (decoupled loss off, no recompute: both
"produced by the inference backend", as the function's docstring says); with it
`proximal_logprobs` = the fixture's recomputed old log-probs (the sampler's where the fixture
has none) and `old_logprobs` = the sampler's, so the behaviour weight is π_prox/π_behave.
`rejection_sampling` stands in for AReaL's `RejectionSamplingConfig` (fields level, action,
metric, agg, upper, lower). Aggregation: the sum over loss tokens / the ORIGINAL loss-token
count of this batch (`loss_mask_count` is taken before a mask-mode rejection, so a rejected
token still counts in the denominator). Defaults from `PPOActorConfig` and
`RejectionSamplingConfig` (areal/api/cli_args.py) at the pinned commit: eps_clip 0.2,
eps_clip_higher None, c_clip None, importance_sampling_level "token", sapo_tau_pos 1.0,
sapo_tau_neg 1.05; rejection level "token", action "mask", metric "ratio", agg "mean",
upper 5.0, lower None.
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

REPO = "inclusionAI/AReaL"
COMMIT = "4aef98d8d818af55b43621aaadba047ae10f4e77"
PATH = "areal/utils/functional/functional.py"
PPO_DEFAULTS: dict[str, Any] = {
    "eps_clip": 0.2,
    "eps_clip_higher": None,
    "c_clip": None,
    "rejection_sampling": None,
    "importance_sampling_level": "token",
}
SAPO_DEFAULTS: dict[str, Any] = {
    "tau_pos": 1.0,
    "tau_neg": 1.05,
    "importance_sampling_level": "token",
}
REJECTION_DEFAULTS: dict[str, Any] = {
    "level": "token",
    "action": "mask",
    "metric": "ratio",
    "agg": "mean",
    "upper": 5.0,
    "lower": None,
}
REJECTION_CHOICES = {
    "level": ("token", "sequence"),
    "action": ("mask", "clamp"),
    "metric": ("ratio", "kl_k1", "kl_k2", "kl_k3"),
    "agg": ("mean", "sum", "max"),
}
GUARD_REASON = (
    "guard: AReaL takes exp(ℓ − ℓ_prox) bare (no clamp), so a token with log r > 88.7 has an "
    "infinite ratio (an A < 0 token's PPO loss is inf, and the token's gradient nan: 0·inf "
    "through the clip, dual clip or SAPO gate); losslab clamps the log-ratio and has no knob "
    "to lift it"
)


def _number(revision: Revision, key: str, value: Any, optional: bool = False) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise RevisionError(f"revision {revision.text!r}: {key} = {value!r}; expected a number")
    return float(value)


def _rejection(revision: Revision, given: Any) -> dict[str, Any]:
    if not isinstance(given, dict):
        raise RevisionError(
            f"revision {revision.text!r}: rejection_sampling = {given!r}; expected a dict of "
            f"RejectionSamplingConfig fields {list(REJECTION_DEFAULTS)} or None"
        )
    unknown = sorted(set(given) - set(REJECTION_DEFAULTS))
    if unknown:
        raise RevisionError(
            f"revision {revision.text!r}: rejection_sampling has {unknown}; "
            f"RejectionSamplingConfig has {list(REJECTION_DEFAULTS)}"
        )
    out = {**REJECTION_DEFAULTS, **given}
    for key, choices in REJECTION_CHOICES.items():
        if out[key] not in choices:
            raise RevisionError(
                f"revision {revision.text!r}: rejection_sampling.{key} = {out[key]!r}; "
                f"expected one of {list(choices)}"
            )
    out["upper"] = _number(revision, "rejection_sampling.upper", out["upper"])
    out["lower"] = _number(revision, "rejection_sampling.lower", out["lower"], optional=True)
    return out


def resolve(revision: Revision, defaults: dict[str, Any], origin: str) -> Resolution:
    kw = dict(revision.kwargs)
    table = SAPO_DEFAULTS if revision.function == "sapo_loss_fn" else PPO_DEFAULTS
    refuse_unknown_arguments(
        revision, tuple(table), f"AReaL {revision.function} takes {list(table)}"
    )
    params = {k: kw.get(k, v) for k, v in table.items()}
    notes = [
        f"{k} not given: {v!r}, the default of AReaL's config ({origin})"
        for k, v in table.items()
        if k not in kw
    ]
    if params["importance_sampling_level"] not in ("token", "sequence"):
        raise RevisionError(
            f"revision {revision.text!r}: importance_sampling_level = "
            f"{params['importance_sampling_level']!r}; expected 'token' or 'sequence'"
        )
    sequence = params["importance_sampling_level"] == "sequence"
    if revision.function == "sapo_loss_fn":
        for key in ("tau_pos", "tau_neg"):
            params[key] = _number(revision, key, params[key])
            if params[key] <= 0:
                raise RevisionError(
                    f"revision {revision.text!r}: {key} = {params[key]}; expected > 0"
                )
        return Resolution(params, "sapo", tuple(notes))
    params["eps_clip"] = _number(revision, "eps_clip", params["eps_clip"])
    for key in ("eps_clip_higher", "c_clip"):
        params[key] = _number(revision, key, params[key], optional=True)
    if params["c_clip"] is not None and params["c_clip"] <= 1.0:
        raise RevisionError(
            f"revision {revision.text!r}: c_clip = {params['c_clip']}; expected > 1 "
            "(AReaL asserts it)"
        )
    if params["rejection_sampling"] is not None:
        rs = params["rejection_sampling"] = _rejection(revision, params["rejection_sampling"])
        token_mask = rs["level"] == "token" and rs["action"] == "mask"
        family = "icepop" if token_mask else "rollout_correction"
    elif sequence:
        family = "gspo"
    else:
        family = "ppo_clip" if params["c_clip"] is None else "dual_clip"
    return Resolution(params, family, tuple(notes))


def losslab_config(ref: Any, fixture: Any = None) -> LosslabConfig:
    """The `losslab.losses` configuration of each AReaL setting, or why there is none."""
    p = ref.params
    red = {"reduction": "token-mean"}
    if ref.revision.function == "sapo_loss_fn":
        if p["importance_sampling_level"] == "sequence":
            return LosslabConfig(
                None,
                reason="SAPO at sequence level (gate on the geometric-mean ratio, mean "
                "advantage): losslab's sapo is token-level",
            )
        params = {"tau_pos": p["tau_pos"], "tau_neg": p["tau_neg"], **red}
        return LosslabConfig("sapo", params, {}, reason=GUARD_REASON)
    high_eps = p["eps_clip"] if p["eps_clip_higher"] is None else p["eps_clip_higher"]
    low, high = 1.0 - p["eps_clip"], 1.0 + high_eps
    sequence = p["importance_sampling_level"] == "sequence"
    rs = p["rejection_sampling"]
    if rs is not None:
        if sequence or p["c_clip"] is not None:
            return LosslabConfig(
                None,
                reason="behaviour weight with GSPO's sequence ratio or a dual clip: losslab's "
                "rollout correction weights token-level single-clip PPO only",
            )
        if rs["metric"] != "ratio":
            return LosslabConfig(
                None,
                reason=f"rejection on a KL metric ({rs['metric']}): losslab's rollout "
                "correction bounds the ratio itself",
            )
        if rs["level"] == "sequence":
            return LosslabConfig(
                None,
                reason="sequence-level behaviour weight: AReaL uses the geometric mean of the "
                "token ratios (mean log-ratio), losslab's rollout_correction the product",
            )
        lower = 0.0 if rs["lower"] is None else rs["lower"]
        common = {
            "anchor": "recomputed",
            "clip_low_threshold": low,
            "clip_high_threshold": high,
            "zero_adv": "keep",
            **red,
        }
        if rs["action"] == "mask":
            params = {"low": lower, "high": rs["upper"], **common}
            return LosslabConfig("icepop", params, {}, reason=GUARD_REASON)
        params = {"level": "token", "mode": "truncate", "cap": rs["upper"], "lower": lower}
        return LosslabConfig("rollout_correction", {**params, **common}, {}, reason=GUARD_REASON)
    if sequence:
        if p["c_clip"] is not None:
            return LosslabConfig(None, reason="GSPO with dual clip: losslab's gspo has no c")
        params = {
            "level": "sequence",  # the mean log-ratio is differentiated through
            "log_ratio_guard": "none",
            "epsilon_low": p["eps_clip"],
            "epsilon_high": high_eps,
            "zero_adv": "keep",
            **red,
        }
        return LosslabConfig(
            "gspo", params, {}, ("AReaL averages each sequence's advantages; ours are constant",)
        )
    clip = {"clip_low_threshold": low, "clip_high_threshold": high, "zero_adv": "keep", **red}
    if p["c_clip"] is None:
        return LosslabConfig("ppo", {**clip, "surrogate": "clipped"}, {}, reason=GUARD_REASON)
    params = {**clip, "clip_ratio_c": p["c_clip"]}
    return LosslabConfig("dual_clip_ppo", params, {}, reason=GUARD_REASON)


def call_reference(fn: Any, payload: dict[str, Any], space: dict[str, Any], rt: Any) -> dict:
    """Padded call of AReaL `ppo_actor_loss_fn` / `sapo_loss_fn` (runs in pinned_runner)."""

    seqs, p, name = payload["sequences"], payload["params"], payload["function"]
    width = max(len(s["sampler_logprobs"]) for s in seqs)
    rs = p.get("rejection_sampling")

    def run(idx: list[int]) -> tuple[Any, Any, dict[str, float]]:
        t = rt.batch([seqs[i] for i in idx], width)
        logprobs, behave, adv = t.current, t.sampler, t.advantages
        proximal = t.old if rs is not None else behave
        mask = t.mask > 0  # AReaL takes a boolean loss mask
        if name == "sapo_loss_fn":
            loss, stat = fn(
                logprobs=logprobs,
                old_logprobs=behave,
                advantages=adv,
                tau_pos=p["tau_pos"],
                tau_neg=p["tau_neg"],
                loss_mask=mask,
                importance_sampling_level=p["importance_sampling_level"],
            )
        else:
            loss, stat = fn(
                logprobs=logprobs,
                proximal_logprobs=proximal,
                old_logprobs=behave,
                advantages=adv,
                eps_clip=p["eps_clip"],
                loss_mask=mask,
                eps_clip_higher=p["eps_clip_higher"],
                c_clip=p["c_clip"],
                rejection_sampling=None if rs is None else rt.Config(rs),
                importance_sampling_level=p["importance_sampling_level"],
            )
        native = {"filtered_fraction": float(stat["filtered_fraction"])} if rs else {}
        return loss, rt.grad(loss, logprobs), native

    return rt.padded_outputs(run, seqs)


def _example(function: str, args: str = "") -> str:
    return f"{REPO}@{COMMIT}:{PATH}::{function}({args})"


FRAMEWORK = Framework(
    name="areal",
    repo=REPO,
    functions=("ppo_actor_loss_fn", "sapo_loss_fn"),
    families=("ppo_clip", "dual_clip", "gspo", "sapo", "icepop", "rollout_correction"),
    resolve=resolve,
    call_reference=call_reference,
    losslab_config=losslab_config,
    value_convention="surrogate",
    aggregation="Σ over loss tokens / this batch's original loss-token count",
    recorded_defaults={**PPO_DEFAULTS},
    recorded_commit=COMMIT,
    example_revisions={
        "areal_ppo": _example("ppo_actor_loss_fn", "eps_clip=0.2, eps_clip_higher=0.28"),
        "areal_dual_clip": _example("ppo_actor_loss_fn", "c_clip=3.0"),
        "areal_gspo": _example(
            "ppo_actor_loss_fn",
            "eps_clip=0.0003, eps_clip_higher=0.0004, importance_sampling_level='sequence'",
        ),
        "areal_sapo": _example("sapo_loss_fn"),
        # behaviour weight truncated (TIS) and masked (IcePop; its [0.5, 5] leaves every weight
        # of the fixtures inside, so [0.8, 1.25], bounds that bind, as OpenRLHF's row)
        "areal_tis": _example(
            "ppo_actor_loss_fn",
            "rejection_sampling={'action': 'clamp', 'upper': 1.5, 'lower': 0.5}",
        ),
        "areal_icepop": _example(
            "ppo_actor_loss_fn",
            "rejection_sampling={'action': 'mask', 'upper': 1.25, 'lower': 0.8}",
        ),
    },
)
