"""Token log-probabilities, entropies and token-level NLL losses.

Logits are (..., V) with the vocabulary on the LAST dim (also for cross_entropy, unlike
F.cross_entropy's class-dim-1 layout); labels are integer tensors of shape logits.shape[:-1].
"""

from __future__ import annotations

import math

import torch

from losslab.objectives._checks import (
    check_labels,
    masked_values,
    plain_mean,
    require_broadcast,
    require_float_tensor,
    require_min_dim,
    require_number,
    require_tensor,
    safe_div,
)
from losslab.objectives.reductions import masked_mean

Tensor = torch.Tensor


def _check_logits(fn: str, logits: Tensor) -> Tensor:
    require_float_tensor(fn, "logits", logits)
    require_min_dim(fn, "logits", logits, 1)
    if logits.shape[-1] == 0:
        raise ValueError(
            f"{fn}: logits must have a non-empty last (vocab) dim, got {tuple(logits.shape)}"
        )
    return logits


def _gather(logp_V: Tensor, labels: Tensor) -> Tensor:
    return logp_V.gather(-1, labels.long().unsqueeze(-1)).squeeze(-1)


def token_logprobs(logits, labels):
    """log_softmax(logits, -1) gathered at labels: per-token log p(label), shape of labels."""
    fn = "token_logprobs"
    _check_logits(fn, logits)
    check_labels(fn, logits, labels)
    return _gather(torch.log_softmax(logits, dim=-1), labels)


def selective_logprobs(logits, labels, mask):
    """Per-sequence SUM of masked token log-probs: Σ_t lp_t·mask_t over the last token dim.

    (TRL's `selective_log_softmax` returns per-token values; this returns shape logits.shape[:-2].)
    """
    fn = "selective_logprobs"
    _check_logits(fn, logits)
    check_labels(fn, logits, labels)
    require_tensor(fn, "mask", mask)
    require_min_dim(fn, "labels", labels, 1)
    lp = _gather(torch.log_softmax(logits, dim=-1), labels)
    require_broadcast(fn, ("token logprobs", "mask"), lp, mask)
    return masked_values(lp, mask.to(lp.dtype)).sum(dim=-1)


def sequence_logprob(logits, labels, mask, length_normalize):
    """Σ_t lp_t·m_t per sequence; if length_normalize, divided by Σ_t m_t (a fully masked row -> 0)."""
    fn = "sequence_logprob"
    _check_logits(fn, logits)
    check_labels(fn, logits, labels)
    require_tensor(fn, "mask", mask)
    require_min_dim(fn, "labels", labels, 1)
    if not isinstance(length_normalize, bool):
        raise TypeError(f"{fn}: length_normalize must be a bool, got {length_normalize!r}")
    lp = _gather(torch.log_softmax(logits, dim=-1), labels)
    require_broadcast(fn, ("token logprobs", "mask"), lp, mask)
    if length_normalize:
        return masked_mean(lp, mask, axis=-1)
    return masked_values(lp, mask.to(lp.dtype)).sum(dim=-1)


def logprob_at_temperature(logits, labels, temperature):
    """log_softmax(logits / temperature, -1) gathered at labels, per token."""
    fn = "logprob_at_temperature"
    _check_logits(fn, logits)
    check_labels(fn, logits, labels)
    t = require_number(fn, "temperature", temperature, low=0.0, low_open=True)
    return _gather(torch.log_softmax(logits / t, dim=-1), labels)


def _token_entropy(logits: Tensor) -> Tensor:
    """H = -Σ_v p_v log p_v over the last dim; 0·log 0 := 0 (so -inf logits give no NaN)."""
    logp = torch.log_softmax(logits, dim=-1)
    # -inf log-probs carry p = 0: zero them before the product so neither value nor gradient is NaN
    logp = logp.masked_fill(torch.isneginf(logp), 0.0)
    return -(logp.exp() * logp).sum(dim=-1)


def entropy(logits, mask):
    """Global masked token-mean of the per-token entropy -Σ_v p log p; 0-d. Empty mask -> 0.0."""
    fn = "entropy"
    _check_logits(fn, logits)
    require_tensor(fn, "mask", mask)
    ent = _token_entropy(logits)
    require_broadcast(fn, ("per-token entropy (logits.shape[:-1])", "mask"), ent, mask)
    return masked_mean(ent, mask)


def normalized_entropy(logits, mask):
    """entropy(logits, mask) / ln V, in [0, 1]. Needs V >= 2 (ln 1 = 0)."""
    fn = "normalized_entropy"
    _check_logits(fn, logits)
    vocab = logits.shape[-1]
    if vocab < 2:
        raise ValueError(
            f"{fn}: logits last dim (V) must be >= 2 to normalise by ln V, got {vocab}"
        )
    return entropy(logits, mask) / math.log(vocab)


def cross_entropy(logits, labels, ignore_index):
    """Mean NLL -log p(label) over tokens whose label != ignore_index.

    Same value as F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), ignore_index=...) when
    at least one label counts, but the vocab is always the last dim ((B,T,V) logits work) and an
    all-ignored batch gives 0.0 instead of NaN.
    """
    fn = "cross_entropy"
    _check_logits(fn, logits)
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"{fn}: ignore_index must be an int, got {ignore_index!r}")
    check_labels(fn, logits, labels, ignore_index=ignore_index)
    keep = labels != ignore_index
    safe_labels = torch.where(keep, labels, torch.zeros_like(labels))
    nll = -_gather(torch.log_softmax(logits, dim=-1), safe_labels)
    weights = keep.to(nll.dtype)
    return safe_div(masked_values(nll, weights).sum(), weights.sum())


def smoothed_nll(logits, labels, smoothing):
    """mean[(1-s)·NLL + s·mean_v(-log p_v)]: PyTorch's label_smoothing (uniform over all V).

    No ignore_index: every label must be a valid class. Mean over all tokens; no tokens -> 0.0.
    """
    fn = "smoothed_nll"
    _check_logits(fn, logits)
    check_labels(fn, logits, labels)
    s = require_number(fn, "smoothing", smoothing, low=0.0, high=1.0)
    logp = torch.log_softmax(logits, dim=-1)
    nll = -_gather(logp, labels)
    uniform = -logp.mean(dim=-1)
    return plain_mean((1 - s) * nll + s * uniform)
