"""sail-sg/Stable-RL `compute_policy_loss_with_mask` (the DPPO authors' verl fork).

Layout: zero-padded [B, T] rows; `old_log_prob` = the fixture's recomputed old log-probs when it
has them (read only by the `*_recompute` modes), `rollout_log_prob` = sampler log-probs.
Parameters: the function's own fallbacks (clip_ratio for low/high, `config.get("clip_ratio_c",
10.0)`), because the revision names the function call; the ActorConfig defaults (low/high 0.2,
c 3.0) a real Stable-RL config would supply are stated in the notes. Value convention
−A·sg(min(r, c))·M·ℓ ("logprob"); aggregation verl's `agg_loss`, run as a plain masked sum
(token-mean, batch_num_tokens=1) unless the revision says otherwise.
"""

from __future__ import annotations

from typing import Any

from losslab.conformance.frameworks import Framework, LosslabConfig, class_defaults

REPO = "sail-sg/Stable-RL"
COMMIT = "c6af1d119c0fe30d16dd9a837d35fdf695acd226"
ACTOR_CONFIG = ("verl/workers/config/actor.py", "ActorConfig")
CONFIG_KEYS = ("clip_ratio", "clip_ratio_low", "clip_ratio_high", "clip_ratio_c")


def read_defaults(files: Any) -> dict[str, Any]:
    return class_defaults(files, *ACTOR_CONFIG, CONFIG_KEYS)


def resolve(revision: Any, defaults: dict[str, Any], origin: str) -> Any:
    from losslab.conformance.references import _resolve_stable_rl

    ref = _resolve_stable_rl(revision)
    notes = list(ref.notes)
    if defaults:
        notes.append(
            "Stable-RL ActorConfig defaults "
            + ", ".join(f"{k}={v}" for k, v in defaults.items())
            + f" ({origin}); the revision's function fallbacks are used instead"
        )
    return type(ref)(ref.revision, "stable_rl", ref.params, tuple(notes), ref.value_convention)


def _reduction(params: dict[str, Any], fixture: Any) -> tuple[dict[str, Any], list[str]]:
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


def losslab_config(ref: Any, fixture: Any = None) -> LosslabConfig:
    p = ref.params
    mode = p["loss_mode"]
    red, notes = _reduction(p, fixture)
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
        loss = "dppo_binary_tv" if "tv" in mode else "dppo_binary_kl"
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
        return LosslabConfig(loss, params, value, tuple(notes))
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
        rows = [seqs[i] for i in idx]
        log_prob = rt.pad([r["current_logprobs"] for r in rows], width).requires_grad_(True)
        rollout = rt.pad([r["sampler_logprobs"] for r in rows], width)
        old = rt.pad([r.get("old_logprobs") or r["sampler_logprobs"] for r in rows], width)
        mask = rt.pad([r["loss_mask"] for r in rows], width)
        adv = mask * torch.tensor([r["advantage"] for r in rows], dtype=torch.float32)[:, None]
        zeros = torch.zeros_like(rollout)
        result = rt.call(
            fn,
            {
                "old_log_prob": old,
                "log_prob": log_prob,
                "advantages": adv,
                "response_mask": mask,
                "loss_agg_mode": p["loss_agg_mode"],
                "config": config,
                "rollout_is_weights": None,
                "rollout_log_prob": rollout,
                "topk_kl": zeros,
                "topk_tv": zeros,
                "entropy": zeros,
                "loss_mode": p["loss_mode"],
            },
        )
        loss = rt.first(result)
        (grad,) = torch.autograd.grad(loss, log_prob)
        metrics = result[1] if isinstance(result, (tuple, list)) and len(result) > 1 else {}
        native = rt.numeric(metrics)
        return loss, grad, native

    return rt.padded_outputs(run, seqs)


def _rederive(ref: Any, fixture: Any, dtype: Any) -> Any:
    from losslab.conformance.references import rederive

    return rederive(ref, fixture, dtype)


FRAMEWORK = Framework(
    name="stable_rl",
    repo=REPO,
    functions=("compute_policy_loss_with_mask",),
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
    },
    recorded_commit=COMMIT,
    rederive=_rederive,
    example_revisions=(
        f"{REPO}@{COMMIT}:verl/trainer/ppo/core_algos.py::compute_policy_loss_with_mask("
        "loss_mode='dppo_binary_tv', clip_ratio=0.15, clip_ratio_c=10)",
    ),
)
