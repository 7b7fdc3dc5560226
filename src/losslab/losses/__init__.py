"""losslab.losses: policy losses over ragged token data, in the Tinker convention.

    from losslab.losses import TokenData, build_loss, get_loss, parse_loss_spec, as_tinker_loss_fn
    loss_fn = build_loss(plan.loss("treatment"))  # the one constructor from a plan's resolved loss
    loss_fn = get_loss("ppo", clip_low_threshold=0.8, clip_high_threshold=1.2, reduction="sum")
    out = loss_fn(token_data)            # LossOutput(loss, metrics, kept_D)
    custom = as_tinker_loss_fn(loss_fn)  # for TrainingClient.forward_backward_custom

Losses: importance_sampling, ppo, cispo, dro, cross_entropy (Tinker built-ins, sums over tokens;
the function of the registry's `cross_entropy` is `cross_entropy_loss`) and dppo_binary_tv,
dppo_binary_kl (DPPO, arXiv 2602.04879), and the field's losses in `field.py` (gspo, luspo,
cispo_eps, dr_grpo, dapo, dual_clip_ppo, icepop, rollout_correction, sapo, gmpo, kl_cov,
clip_cov, m2po; docs/losses.md). See docs/interfaces.md. Each is a function in
`policy.py` bound by `@loss_function` to its declaration in `declarations.py` (parameters,
domains, metric keys; stdlib only).

This is where the losses that TRAIN live ("where is PPO?": `ppo` here). `losslab.objectives` is a
separate reference library (49 padded-tensor objectives with fixed signatures, checked by
`losslab conform`); names never collide between the two (`sampler_ratio` here,
`importance_ratio` there).

The names below are imported on first use, so `losslab.losses.declarations` can be read (by the
plan layer) without importing torch.
"""

from __future__ import annotations

from losslab.lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "PackedTokens": "data",
    "TokenData": "data",
    "pack": "data",
    "LOSSES": "declarations",
    "Choice": "declarations",
    "LossDeclaration": "declarations",
    "Number": "declarations",
    "declare": "declarations",
    "loss_declaration": "declarations",
    "LOG_RATIO_MAX": "policy",
    "LossOutput": "policy",
    "TokenLoss": "policy",
    "cispo": "policy",
    "cross_entropy_loss": "policy",
    "dppo_binary_kl": "policy",
    "dppo_binary_tv": "policy",
    "dro": "policy",
    "importance_sampling": "policy",
    "loss_function": "policy",
    "policy_gradient": "policy",
    "ppo": "policy",
    "sampler_ratio": "policy",
    "trust_region": "policy",
    "REDUCTIONS": "reductions",
    "reduce_loss": "reductions",
    "LOSS_NAMES": "registry",
    "LossFn": "registry",
    "build_loss": "registry",
    "get_loss": "registry",
    "loss_parameters": "registry",
    "parse_loss_spec": "registry",
    "CustomLossFn": "tinker_adapter",
    "as_tinker_loss_fn": "tinker_adapter",
}
"""Public name -> the submodule defining it."""

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
