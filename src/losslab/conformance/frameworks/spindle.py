"""modal-projects/spindle `_loss(logprobs, batch)` (Tinker-style server on Megatron).

No commit of Spindle can be fetched here: the plan pins e58ebef1, and the only text losslab has
seen is the indexed copy at 88b2e5f3 (team notes reference_losses.md §4). So by default Spindle
is compared through losslab's re-derivation of that text, labelled with that commit; a user
with a checkout passes `--source modal-projects/spindle=PATH` and the pinned function runs.
Layout: packed rows (one flat [sum L] tensor); value −Σ m·J (the surrogate); a plain sum.
"""

from __future__ import annotations

from typing import Any

from losslab.conformance.frameworks import Framework, LosslabConfig

REPO = "modal-projects/spindle"
TEXT_COMMIT = "88b2e5f3"  # the indexed text the re-derivation restates (not fetchable)


def resolve(revision: Any, defaults: dict[str, Any], origin: str) -> Any:
    from losslab.conformance.references import _resolve_spindle

    return _resolve_spindle(revision)


def losslab_config(ref: Any, fixture: Any = None) -> LosslabConfig:
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
    if "_loss_config" in payload["extra_roots"]:  # the reference's own validation
        config = space["_loss_config"](
            p["loss_name"], {k: v for k, v in config.items() if k in payload["raw_config_keys"]}
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


def _rederive(ref: Any, fixture: Any, dtype: Any) -> Any:
    from losslab.conformance.references import rederive

    return rederive(ref, fixture, dtype)


FRAMEWORK = Framework(
    name="spindle",
    repo=REPO,
    functions=("_loss",),
    resolve=resolve,
    call_reference=call_reference,
    losslab_config=losslab_config,
    value_convention="surrogate",
    aggregation="plain masked sum -sum(m*J) on packed rows",
    recorded_commit=TEXT_COMMIT,
    rederive=_rederive,
    extra_roots=("_loss_config",),
    fetchable=False,
    unfetchable_reason=(
        "no commit of modal-projects/spindle is fetchable (the plan pins e58ebef1); losslab "
        f"re-derives the text indexed at {TEXT_COMMIT}"
    ),
    example_revisions=(
        f"{REPO}@{TEXT_COMMIT}:src/spindle/backends/megatron_runtime/common/forward_backward.py"
        "::_loss(loss_name='dppo', tv_threshold=0.15)",
    ),
)
