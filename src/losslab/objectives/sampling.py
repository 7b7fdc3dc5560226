"""Sampling filters over the last (vocab) dim: top-k mask, nucleus (top-p) renormalisation, argmax."""

from __future__ import annotations

import torch

from losslab.objectives._checks import (
    require_float_tensor,
    require_int,
    require_min_dim,
    require_number,
    safe_div,
)

Tensor = torch.Tensor


def top_k_mask(logits, k):
    """bool mask, True at every entry >= the k-th largest value along the last dim.

    Ties at the k-th value are ALL kept (HF TopKLogitsWarper rule), so a row can have more than k
    Trues; the mask depends only on the values, not on torch.topk's tie order. k > V keeps all.
    """
    fn = "top_k_mask"
    require_float_tensor(fn, "logits", logits)
    require_min_dim(fn, "logits", logits, 1)
    kk = require_int(fn, "k", k, low=1)
    vocab = logits.shape[-1]
    if vocab == 0:
        return torch.zeros_like(logits, dtype=torch.bool)
    kth = torch.topk(logits, min(kk, vocab), dim=-1).values[..., -1:]
    return logits >= kth


def top_p_mask(probs, p):
    """Nucleus filter (Holtzman et al. 2020), returning RENORMALISED probabilities (same shape).

    Along the last dim, sorted descending (stable: among equal probs the lower index comes first),
    a token is kept iff the mass strictly before it is <= p (cumsum - p_i <= p, the Llama
    `sample_top_p` rule). So the token that crosses p is kept, at least one token survives, and at
    exact equality the token is kept (HF's warper drops it). Kept mass is renormalised to 1;
    a row of zeros stays zeros.
    """
    fn = "top_p_mask"
    require_float_tensor(fn, "probs", probs)
    require_min_dim(fn, "probs", probs, 1)
    pp = require_number(fn, "p", p, low=0.0, high=1.0)
    if probs.numel() and bool((probs < 0).any()):
        raise ValueError(f"{fn}: probs must be non-negative, found {probs.min().item()}")
    sorted_V, idx_V = torch.sort(probs, dim=-1, descending=True, stable=True)
    before_V = sorted_V.cumsum(dim=-1) - sorted_V  # mass strictly before each token
    kept_V = sorted_V.masked_fill(before_V > pp, 0.0)
    out = torch.zeros_like(probs).scatter(-1, idx_V, kept_V)
    return safe_div(out, out.sum(dim=-1, keepdim=True))


def argmax_tokens(logits):
    """argmax over the last dim, int64; ties go to the first (lowest) index (torch.argmax)."""
    fn = "argmax_tokens"
    require_float_tensor(fn, "logits", logits)
    require_min_dim(fn, "logits", logits, 1)
    if logits.shape[-1] == 0:
        raise ValueError(f"{fn}: logits must have a non-empty last dim, got {tuple(logits.shape)}")
    return logits.argmax(dim=-1)
