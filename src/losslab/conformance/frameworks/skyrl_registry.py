"""NovaSky-AI/SkyRL's `PolicyLossRegistry` (skyrl/backends/skyrl_train/utils/ppo_utils.py):
every registered policy loss other than DPPO (`frameworks/skyrl.py`).

They share one signature, `fn(log_probs, old_log_probs, advantages, config, loss_mask,
rollout_logprobs)`, so one adapter runs each: zero-padded [B, T] rows, `old_log_probs` = the
sampler log-probs (one gradient pass on a fresh batch: old = rollout), `rollout_logprobs` =
the sampler log-probs. `config` stands in for SkyRL's `AlgorithmConfig` with its `sapo`,
`cispo`, `clip_cov`, `kl_cov` and `off_policy_correction` blocks; every field not given takes
the class default read at the pinned commit (skyrl/train/config/config.py). Each loss ends in
`reduce_loss`, a plain masked sum: SkyRL applies `loss_reduction` by pre-scaling the
advantages (`apply_loss_reduction_to_advantages_minibatch`), which is not called here, so the
fixture's advantages are the sum convention. The ratio is `safe_exp_delta(Δ, clip=20)` (no
gradient past |Δ| = 20) in every loss but `importance_sampling_loss`, which takes `exp` bare.
"""

from __future__ import annotations

import math
from typing import Any

from losslab.conformance.frameworks.base import (
    Framework,
    LosslabConfig,
    Resolution,
    class_defaults,
    refuse_unknown_arguments,
)
from losslab.conformance.frameworks.skyrl import OFF_POLICY_DEFAULTS
from losslab.conformance.frameworks.verl_registry import CLIP_COV_REASON
from losslab.plan import Revision, RevisionError

REPO = "NovaSky-AI/SkyRL"
COMMIT = "a9564572eb8e91076be43c1bd5e4615e3de17265"
PATH = "skyrl/backends/skyrl_train/utils/ppo_utils.py"
CONFIG_PATH = "skyrl/train/config/config.py"
TOP_KEYS = ("eps_clip_low", "eps_clip_high", "clip_ratio_c")
BLOCKS: dict[str, tuple[str, tuple[str, ...]]] = {
    "sapo": ("SAPOConfig", ("tau_pos", "tau_neg")),
    "cispo": ("CISPOConfig", ("cispo_eps_clip_low", "cispo_eps_clip_high", "cispo_anchor")),
    "clip_cov": ("ClipCovConfig", ("clip_ratio", "clip_cov_lb", "clip_cov_ub")),
    "kl_cov": ("KLCovConfig", ("kl_cov_frac", "ppo_kl_coef")),
}
# registered function -> (SkyRL policy_loss_type, losslab loss family); ppo_policy_loss is
# registered twice, "regular" and "dual_clip" (its `policy_loss_type` argument here)
FUNCTIONS: dict[str, tuple[str, str]] = {
    "ppo_policy_loss": ("regular", "ppo_clip"),
    "gspo_policy_loss": ("gspo", "gspo"),
    "compute_policy_loss_cispo": ("cispo", "cispo"),
    "compute_policy_loss_clip_cov": ("clip_cov", "clip_cov"),
    "compute_policy_loss_kl_cov": ("kl_cov", "kl_cov"),
    "sapo_policy_loss": ("sapo", "sapo"),
    "cross_entropy_loss": ("cross_entropy", "cross_entropy"),
    "importance_sampling_loss": ("importance_sampling", "importance_sampling"),
}
RECORDED_DEFAULTS: dict[str, Any] = {
    "eps_clip_low": 0.2,
    "eps_clip_high": 0.2,
    "clip_ratio_c": 3.0,
    "sapo": {"tau_pos": 1.0, "tau_neg": 1.05},
    "cispo": {"cispo_eps_clip_low": 1.0, "cispo_eps_clip_high": 4.0, "cispo_anchor": "old"},
    "clip_cov": {"clip_ratio": 0.0002, "clip_cov_lb": 1.0, "clip_cov_ub": 5.0},
    "kl_cov": {"kl_cov_frac": 0.2, "ppo_kl_coef": 1.0},
    "off_policy_correction": OFF_POLICY_DEFAULTS,
}
BLOCK_ARGS = {key: block for block, (_, keys) in BLOCKS.items() for key in keys}


def read_defaults(files: Any) -> dict[str, Any]:
    out: dict[str, Any] = class_defaults(files, CONFIG_PATH, "AlgorithmConfig", TOP_KEYS)
    for block, (cls, keys) in BLOCKS.items():
        out[block] = class_defaults(files, CONFIG_PATH, cls, keys)
    out["off_policy_correction"] = class_defaults(
        files, CONFIG_PATH, "OffPolicyCorrectionConfig", None
    )
    return out


def resolve(revision: Revision, defaults: dict[str, Any], origin: str) -> Resolution:
    kw = dict(revision.kwargs)
    known = (*TOP_KEYS, *BLOCK_ARGS, "policy_loss_type")
    refuse_unknown_arguments(
        revision,
        known,
        f"SkyRL {revision.function} takes AlgorithmConfig fields {list(TOP_KEYS)}, the "
        f"block fields {sorted(BLOCK_ARGS)} and policy_loss_type (ppo_policy_loss only)",
    )
    loss_type, family = FUNCTIONS[revision.function]
    if "policy_loss_type" in kw:
        if revision.function != "ppo_policy_loss" or kw["policy_loss_type"] not in (
            "regular",
            "dual_clip",
        ):
            raise RevisionError(
                f"revision {revision.text!r}: policy_loss_type = {kw['policy_loss_type']!r}; "
                "only ppo_policy_loss takes it, 'regular' or 'dual_clip'"
            )
        loss_type = kw["policy_loss_type"]
        family = "dual_clip" if loss_type == "dual_clip" else "ppo_clip"
    notes: list[str] = []
    params: dict[str, Any] = {"policy_loss_type": loss_type}
    for key in TOP_KEYS:
        params[key] = kw.get(key, defaults[key])
        if key not in kw:
            notes.append(f"{key} not given: {params[key]!r}, AlgorithmConfig's default ({origin})")
    for block in BLOCKS:
        params[block] = dict(defaults[block])
    for key, value in kw.items():
        if key in BLOCK_ARGS:
            params[BLOCK_ARGS[key]][key] = value
    for key, value in [(k, params[k]) for k in TOP_KEYS] + [
        (k, v) for b in BLOCKS for k, v in params[b].items() if k != "cispo_anchor"
    ]:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise RevisionError(f"revision {revision.text!r}: {key} = {value!r}; expected a number")
    if params["cispo"]["cispo_anchor"] not in ("old", "rollout"):
        raise RevisionError(
            f"revision {revision.text!r}: cispo_anchor = {params['cispo']['cispo_anchor']!r}; "
            "expected 'old' or 'rollout'"
        )
    params["off_policy_correction"] = dict(defaults["off_policy_correction"])
    notes.append("old_log_probs = rollout_logprobs = the sampler's (one pass on a fresh batch)")
    return Resolution(params, family, tuple(notes))


def losslab_config(ref: Any, fixture: Any = None) -> LosslabConfig:
    """The `losslab.losses` configuration of each SkyRL loss, or why there is none."""
    p = ref.params
    kind = p["policy_loss_type"]
    low, high = 1.0 - p["eps_clip_low"], 1.0 + p["eps_clip_high"]
    if kind == "regular":
        params = {
            "clip_low_threshold": low,
            "clip_high_threshold": high,
            "surrogate": "clipped",
            "zero_adv": "keep",
            "reduction": "sum",
        }
        return LosslabConfig(
            "ppo",
            params,
            {},
            reason="guard: SkyRL's safe_exp_delta clamps log r at 20 inside exp, so a token "
            "past it gets no gradient; losslab's ppo passes the gradient through its clamp and "
            "has no log_ratio_guard knob (A < 0 tokens with log r > 20 differ)",
        )
    if kind == "cispo":
        c = p["cispo"]
        params = {
            "clip_low_threshold": 1.0 - c["cispo_eps_clip_low"],
            "clip_high_threshold": 1.0 + c["cispo_eps_clip_high"],
            "reduction": "sum",
        }
        return LosslabConfig("cispo", params, {}, ("SkyRL eps are offsets: 1 - lo, 1 + hi",))
    if kind == "cross_entropy":
        return LosslabConfig("cross_entropy", {"reduction": "sum"}, {})
    if kind == "importance_sampling":
        return LosslabConfig(
            "importance_sampling",
            {"reduction": "sum"},
            {},
            reason="guard: SkyRL's importance_sampling_loss takes exp(l - l_s) bare (no "
            "safe_exp_delta); losslab clamps l - l_s at 20 before exp and has no knob to lift "
            "it, so tokens with log r > 20 differ (e^91 = inf in float32)",
        )
    if kind == "dual_clip":
        params = {
            "clip_low_threshold": low,
            "clip_high_threshold": high,
            "clip_ratio_c": p["clip_ratio_c"],
            "zero_adv": "keep",
            "reduction": "sum",
        }
        return LosslabConfig("dual_clip_ppo", params, {})
    if kind == "gspo":
        # SkyRL gspo is GSPO-token: s_t = sg(s_d) * e^(l - sg l), clipped per token
        params = {
            "level": "token",
            "log_ratio_guard": "verl",  # torch.clamp(log s, max=10): no gradient beyond
            "epsilon_low": p["eps_clip_low"],
            "epsilon_high": p["eps_clip_high"],
            "zero_adv": "keep",
            "reduction": "sum",
        }
        return LosslabConfig("gspo", params, {})
    if kind == "sapo":
        params = {**{k: p["sapo"][k] for k in ("tau_pos", "tau_neg")}, "reduction": "sum"}
        return LosslabConfig("sapo", params, {})
    if kind == "kl_cov":
        params = {
            "kl_cov_ratio": p["kl_cov"]["kl_cov_frac"],
            "kl_coef": p["kl_cov"]["ppo_kl_coef"],
            "log_ratio_guard": "none",
            "reduction": "sum",
        }
        return LosslabConfig("kl_cov", params, {})
    if kind == "clip_cov":
        c = p["clip_cov"]
        params = {
            "clip_low_threshold": low,
            "clip_high_threshold": high,
            "clip_cov_ratio": c["clip_ratio"],
            "clip_cov_lb": c["clip_cov_lb"],
            "clip_cov_ub": c["clip_cov_ub"],
            "log_ratio_guard": "none",
            "zero_adv": "keep",
            "reduction": "sum",
        }
        return LosslabConfig("clip_cov", params, {}, reason=CLIP_COV_REASON)
    return LosslabConfig(
        None, reason=f"losslab's registry has no {ref.loss_family} loss (SkyRL {kind})"
    )


def call_reference(fn: Any, payload: dict[str, Any], space: dict[str, Any], rt: Any) -> dict:
    """Padded call of one SkyRL registered policy loss (runs in pinned_runner)."""

    seqs, p = payload["sequences"], payload["params"]
    width = max(len(s["sampler_logprobs"]) for s in seqs)
    fields = {
        k: p[k] for k in ("policy_loss_type", "eps_clip_low", "eps_clip_high", "clip_ratio_c")
    }
    for block in ("sapo", "cispo", "clip_cov", "kl_cov", "off_policy_correction"):
        fields[block] = dict(p[block])
    # GSPO and SAPO import loguru to warn when loss_reduction is not sequence_mean: pass that
    # (it only labels the advantage pre-scaling, which is not run here)
    fields["loss_reduction"] = "sequence_mean"
    config = rt.Config(fields)

    def run(idx: list[int]) -> tuple[Any, Any, dict[str, float]]:
        t = rt.batch([seqs[i] for i in idx], width)
        loss, metrics = fn(
            t.current, t.sampler, t.advantages, config, loss_mask=t.mask, rollout_logprobs=t.sampler
        )
        return loss, rt.grad(loss, t.current), rt.numeric(metrics)

    return rt.padded_outputs(run, seqs)


def _example(function: str, args: str = "") -> str:
    return f"{REPO}@{COMMIT}:{PATH}::{function}({args})"


FRAMEWORK = Framework(
    name="skyrl_registry",
    repo=REPO,
    functions=tuple(FUNCTIONS),
    families=tuple(sorted({f for _, f in FUNCTIONS.values()} | {"dual_clip"})),
    resolve=resolve,
    call_reference=call_reference,
    losslab_config=losslab_config,
    value_convention="surrogate",
    aggregation="reduce_loss: a plain masked sum (advantages not pre-scaled)",
    read_defaults=read_defaults,
    recorded_defaults=RECORDED_DEFAULTS,
    recorded_commit=COMMIT,
    example_revisions={
        "skyrl_regular": _example("ppo_policy_loss"),
        "skyrl_dual_clip": _example("ppo_policy_loss", "policy_loss_type='dual_clip'"),
        "skyrl_gspo": _example("gspo_policy_loss", "eps_clip_low=0.0003, eps_clip_high=0.0004"),
        "skyrl_cispo": _example("compute_policy_loss_cispo"),
        "skyrl_clip_cov": _example("compute_policy_loss_clip_cov"),
        "skyrl_kl_cov": _example("compute_policy_loss_kl_cov"),
        "skyrl_sapo": _example("sapo_policy_loss"),
        "skyrl_cross_entropy": _example("cross_entropy_loss"),
        "skyrl_importance_sampling": _example("importance_sampling_loss"),
    },
)
