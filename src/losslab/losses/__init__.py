"""losslab.losses: policy losses over ragged token data, in the Tinker convention.

    from losslab.losses import TokenData, build_loss, get_loss, parse_loss_spec, as_tinker_loss_fn
    loss_fn = build_loss(plan.loss("treatment"))  # the one constructor from a plan's resolved loss
    loss_fn = get_loss("ppo", clip_low_threshold=0.8, clip_high_threshold=1.2, reduction="sum")
    out = loss_fn(token_data)            # LossOutput(loss, metrics, kept_D)
    custom = as_tinker_loss_fn(loss_fn)  # for TrainingClient.forward_backward_custom

Losses: importance_sampling, ppo, cispo, dro, cross_entropy (Tinker built-ins, sums over tokens;
the function of the registry's `cross_entropy` is `cross_entropy_loss`) and dppo_binary_tv,
dppo_binary_kl (DPPO, arXiv 2602.04879). See docs/interfaces.md.

This is where the losses that TRAIN live ("where is PPO?": `ppo` here). `losslab.objectives` is a
separate reference library (49 padded-tensor objectives with fixed signatures, checked by
`losslab conform`); names never collide between the two (`sampler_ratio` here,
`importance_ratio` there).
"""

from losslab.losses.data import PackedTokens, TokenData, pack
from losslab.losses.policy import (
    LOG_RATIO_MAX,
    LossOutput,
    cispo,
    cross_entropy_loss,
    dppo_binary_kl,
    dppo_binary_tv,
    dro,
    importance_sampling,
    policy_gradient,
    ppo,
    sampler_ratio,
    trust_region,
)
from losslab.losses.reductions import REDUCTIONS, reduce_loss
from losslab.losses.registry import (
    LOSS_NAMES,
    LossFn,
    build_loss,
    get_loss,
    loss_parameters,
    parse_loss_spec,
)
from losslab.losses.tinker_adapter import CustomLossFn, as_tinker_loss_fn

__all__ = [
    "CustomLossFn",
    "LOG_RATIO_MAX",
    "LOSS_NAMES",
    "REDUCTIONS",
    "LossFn",
    "LossOutput",
    "PackedTokens",
    "TokenData",
    "as_tinker_loss_fn",
    "build_loss",
    "cispo",
    "cross_entropy_loss",
    "dppo_binary_kl",
    "dppo_binary_tv",
    "dro",
    "get_loss",
    "sampler_ratio",
    "importance_sampling",
    "loss_parameters",
    "pack",
    "parse_loss_spec",
    "policy_gradient",
    "ppo",
    "reduce_loss",
    "trust_region",
]
