"""NovaSky-AI/SkyRL `dppo_policy_loss` (skyrl/backends/skyrl_train/utils/ppo_utils.py).

Layout: zero-padded [B, T] rows. SkyRL takes the mask AND the ratio against the rollout
log-probs when they are given, and falls back to `old_log_probs` when they are not
(`use_rollout_logprobs=False` in the revision reproduces that). Its ratio is
`safe_exp_delta(Δ, clip=20)`: torch.clamp inside exp, so a token with |Δ| > 20 gets NO gradient.
No importance-weight cap; A = 0 tokens are never masked. Defaults from SkyRL's `DPPOConfig`
(delta 0.2/0.2) and `OffPolicyCorrectionConfig` (all corrections off), read from the pinned
commit's skyrl/train/config/config.py. Value: −Σ m·r·A·M (the surrogate), `reduce_loss` = a
plain masked sum (SkyRL pre-scales advantages for its reductions; the fixture's advantages are
passed unscaled, i.e. the sum convention).
"""

from __future__ import annotations

from typing import Any

from losslab.conformance.frameworks.base import (
    Framework,
    LosslabConfig,
    Resolution,
    class_defaults,
)
from losslab.plan import Revision, RevisionError

REPO = "NovaSky-AI/SkyRL"
COMMIT = "a9564572eb8e91076be43c1bd5e4615e3de17265"
CONFIG_PATH = "skyrl/train/config/config.py"
DPPO_KEYS = ("dppo_type", "delta_low", "delta_high")
OFF_POLICY_DEFAULTS = {
    "tis_ratio_type": None,
    "token_tis_ratio_clip_high": 2.0,
    "sequence_tis_ratio_clip_high": 5.0,
    "sequence_mask_metric": None,
    "geo_mask_high": 1.01,
    "geo_mask_low": 0.99,
    "product_mask_high": 2.0,
    "product_mask_low": 0.5,
    "outlier_token_is_threshold_low": None,
    "outlier_token_is_threshold_high": None,
    "token_mask_is_threshold_low": None,
    "token_mask_is_threshold_high": None,
}


def read_defaults(files: Any) -> dict[str, Any]:
    out = class_defaults(files, CONFIG_PATH, "DPPOConfig", DPPO_KEYS)
    out["off_policy_correction"] = class_defaults(
        files, CONFIG_PATH, "OffPolicyCorrectionConfig", None
    )
    return out


def resolve(revision: Revision, defaults: dict[str, Any], origin: str) -> Resolution:
    kw = dict(revision.kwargs)
    allowed = (*DPPO_KEYS, "use_rollout_logprobs")
    unknown = set(kw) - set(allowed)
    if unknown:
        raise RevisionError(
            f"revision {revision.text!r}: unknown arguments {sorted(unknown)}; SkyRL "
            f"dppo_policy_loss takes config.dppo fields {list(DPPO_KEYS)} and "
            "use_rollout_logprobs (whether rollout log-probs are passed)"
        )
    notes, params = [], {}
    for key in DPPO_KEYS:
        if key in kw:
            params[key] = kw[key]
        else:
            params[key] = defaults[key]
            notes.append(f"{key} not given: {defaults[key]!r}, DPPOConfig's default ({origin})")
    if params["dppo_type"] not in ("binary_tv", "binary_kl"):
        raise RevisionError(
            f"revision {revision.text!r}: dppo_type = {params['dppo_type']!r}; expected "
            "'binary_tv' or 'binary_kl'"
        )
    for key in ("delta_low", "delta_high"):
        value = params[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise RevisionError(f"revision {revision.text!r}: {key} = {value!r}; expected >= 0")
        params[key] = float(value)
    params["use_rollout_logprobs"] = bool(kw.get("use_rollout_logprobs", True))
    params["off_policy_correction"] = dict(defaults["off_policy_correction"])
    return Resolution(params, "dppo", tuple(notes))


def losslab_config(ref: Any, fixture: Any = None) -> LosslabConfig:
    p = ref.params
    opc = p["off_policy_correction"]
    if any(opc.get(k) is not None for k in ("tis_ratio_type", "sequence_mask_metric")):
        return LosslabConfig(None, reason="SkyRL off-policy correction enabled: no losslab knob")
    anchor = "sampler" if p["use_rollout_logprobs"] else "recomputed"
    params = {
        "low": p["delta_low"],
        "high": p["delta_high"],
        "anchor": anchor,
        "weight_anchor": anchor,
        "clip_ratio_c": float("inf"),
        "log_ratio_guard": "zero_grad",
        "zero_adv": "keep",
        "surrogate": "ratio",
    }
    loss = "dppo_binary_tv" if p["dppo_type"] == "binary_tv" else "dppo_binary_kl"
    return LosslabConfig(loss, params, {})


def call_reference(fn: Any, payload: dict[str, Any], space: dict[str, Any], rt: Any) -> dict:
    """Padded call of SkyRL `dppo_policy_loss` (runs in pinned_runner)."""
    import torch

    seqs, p = payload["sequences"], payload["params"]
    width = max(len(s["sampler_logprobs"]) for s in seqs)
    config = rt.Config(
        {
            "dppo": {k: p[k] for k in ("dppo_type", "delta_low", "delta_high")},
            "off_policy_correction": dict(p["off_policy_correction"]),
        }
    )

    def run(idx: list[int]) -> tuple[Any, Any, dict[str, float]]:
        t = rt.batch([seqs[i] for i in idx], width)
        loss, metrics = fn(
            t.current,
            t.old,
            t.advantages,
            config,
            loss_mask=t.mask,
            rollout_logprobs=t.sampler if p["use_rollout_logprobs"] else None,
        )
        (grad,) = torch.autograd.grad(loss, t.current)
        native = rt.numeric(metrics)
        return loss, grad, native

    return rt.padded_outputs(run, seqs)


_EXAMPLE = f"{REPO}@{COMMIT}:skyrl/backends/skyrl_train/utils/ppo_utils.py::dppo_policy_loss"

FRAMEWORK = Framework(
    name="skyrl",
    repo=REPO,
    functions=("dppo_policy_loss",),
    families=("dppo",),
    resolve=resolve,
    call_reference=call_reference,
    losslab_config=losslab_config,
    value_convention="surrogate",
    aggregation="reduce_loss: a plain masked sum (advantages not pre-scaled)",
    read_defaults=read_defaults,
    recorded_defaults={
        "dppo_type": "binary_tv",
        "delta_low": 0.2,
        "delta_high": 0.2,
        "off_policy_correction": OFF_POLICY_DEFAULTS,
    },
    recorded_commit=COMMIT,
    example_revisions={
        "skyrl": f"{_EXAMPLE}(dppo_type='binary_tv', delta_low=0.15, delta_high=0.15)",
        # no rollout log-probs passed: mask and ratio fall back to old_log_probs
        "skyrl_no_rollout": f"{_EXAMPLE}(dppo_type='binary_tv', delta_low=0.15, "
        "delta_high=0.15, use_rollout_logprobs=False)",
    },
)
