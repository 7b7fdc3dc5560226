"""losslab.objectives: 49 post-training objectives and primitives, pure torch in, torch out.

Conventions (axes, reductions, eps placement, empty-mask results, where TRL/verl differ) are in
docs/conventions.md. Every function keeps the exact signature of the team's `reforacle` probe
record (not shipped; `tests/objectives/test_signatures.py` pins every signature).

This is a separate REFERENCE library (padded `(B, T)` tensors, TRL/verl layout), checked by
`losslab conform`; the losses that train are `losslab.losses` (docs/architecture.md).
"""

from losslab.objectives.advantages import (
    advantage_mean_std,
    discounted_returns,
    gae,
    group_mean_baseline,
    grpo_advantages,
    lambda_returns,
    masked_whiten,
    normalize,
    rloo_advantages,
    whiten,
)
from losslab.objectives.kl import kl_penalty, reverse_kl, symmetric_kl
from losslab.objectives.logprobs import (
    cross_entropy,
    entropy,
    logprob_at_temperature,
    normalized_entropy,
    selective_logprobs,
    sequence_logprob,
    smoothed_nll,
    token_logprobs,
)
from losslab.objectives.policy import (
    clip_fraction,
    clipped_pg_loss,
    grpo_objective,
    huber_value_loss,
    importance_ratio,
    ppo_objective,
    reverse_kl_objective,
    rloo_objective,
    value_loss,
)
from losslab.objectives.preference import (
    bradley_terry_logit,
    dpo_loss,
    dpo_sequence_loss,
    ipo_loss,
)
from losslab.objectives.reductions import (
    log_softmax,
    logsumexp,
    masked_max,
    masked_mean,
    masked_sum,
)
from losslab.objectives.sampling import argmax_tokens, top_k_mask, top_p_mask
from losslab.objectives.statistics import (
    bucketize_reward,
    cumulative_max,
    first_nonzero_index,
    median_reward,
    mode_label,
    pad_mask_from_lengths,
    quantile_lower,
)

__all__ = [
    # reductions
    "masked_mean",
    "masked_sum",
    "masked_max",
    "logsumexp",
    "log_softmax",
    # logprobs
    "selective_logprobs",
    "token_logprobs",
    "sequence_logprob",
    "entropy",
    "normalized_entropy",
    "logprob_at_temperature",
    "cross_entropy",
    "smoothed_nll",
    # preference
    "dpo_loss",
    "ipo_loss",
    "dpo_sequence_loss",
    "bradley_terry_logit",
    # advantages
    "grpo_advantages",
    "rloo_advantages",
    "group_mean_baseline",
    "gae",
    "lambda_returns",
    "discounted_returns",
    "whiten",
    "masked_whiten",
    "normalize",
    "advantage_mean_std",
    # kl
    "kl_penalty",
    "reverse_kl",
    "symmetric_kl",
    # policy
    "clipped_pg_loss",
    "importance_ratio",
    "clip_fraction",
    "value_loss",
    "huber_value_loss",
    "grpo_objective",
    "ppo_objective",
    "rloo_objective",
    "reverse_kl_objective",
    # sampling
    "top_k_mask",
    "top_p_mask",
    "argmax_tokens",
    # statistics
    "mode_label",
    "median_reward",
    "quantile_lower",
    "pad_mask_from_lengths",
    "first_nonzero_index",
    "cumulative_max",
    "bucketize_reward",
]
