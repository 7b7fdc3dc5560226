"""Input specs for `losslab.objectives.logprobs`: logits with labels, masks, temperatures."""

from __future__ import annotations

import math

import torch

from losslab.conformance.input_specs._shared import (
    Args,
    Draw,
    EdgeCase,
    _e,
    _spec,
)


def _logits_labels(d: Draw, *, max_b: int = 4, max_t: int = 6, max_v: int = 7) -> Args:
    b, t, v = d.int(1, max_b), d.int(1, max_t), d.int(2, max_v)
    return d.randn(b, t, v, scale=2.0), d.labels(v, b, t)


def _logits_labels_mask(d: Draw) -> Args:
    logits, labels = _logits_labels(d)
    return logits, labels, d.mask(*labels.shape, keep=0.7)


def _empty_mask_lm(d: Draw) -> Args:
    logits, labels = _logits_labels(d)
    return logits, labels, torch.zeros(labels.shape)


def _row_empty_lm(d: Draw) -> Args:
    logits, labels = d.randn(3, 4, 5), d.labels(5, 3, 4)
    mask = d.mask(3, 4, keep=0.8)
    mask[0] = 0.0
    return logits, labels, mask


def _entropy_random(d: Draw) -> Args:
    if d.flag():
        logits, labels, mask = _logits_labels_mask(d)
        return logits, mask
    n, v = d.int(1, 6), d.int(2, 7)
    return d.randn(n, v, scale=2.0), d.mask(n, keep=0.7)


def _entropy_edges() -> list[EdgeCase]:
    def neg_inf(d: Draw) -> Args:
        logits = d.randn(2, 3, 5)
        logits[..., 0] = -math.inf  # a banned token: 0·log 0 must not give NaN
        return logits, torch.ones(2, 3)

    def one_token(d: Draw) -> Args:
        mask = torch.zeros(2, 4)
        mask[1, 2] = 1.0
        return d.randn(2, 4, 6), mask

    return [
        EdgeCase("empty-mask", lambda d: (d.randn(2, 3, 5), torch.zeros(2, 3)), "Σmask = 0"),
        EdgeCase("neg-inf-logits", neg_inf, "-inf logits: 0·(-inf) = NaN in a naive p·log p"),
        EdgeCase("peaked", lambda d: (d.randn(3, 6, scale=60.0), torch.ones(3)), "near one-hot"),
        EdgeCase("one-unmasked-token", one_token, "masked mean vs first masked token"),
        EdgeCase("2-D-logits", lambda d: (d.randn(5, 4), d.mask(5)), "(N,V) logits, (N,) mask"),
    ]


_spec(
    "selective_logprobs",
    _logits_labels_mask,
    _e("empty-mask", _empty_mask_lm, "Σmask = 0"),
    _e("masked-row", _row_empty_lm, "one fully masked sequence"),
    _e("T=1", lambda d: (d.randn(3, 1, 4), d.labels(4, 3, 1), torch.ones(3, 1)), "T=1"),
    _e(
        "large-logits",
        lambda d: (d.randn(2, 3, 5, scale=50.0), d.labels(5, 2, 3), d.mask(2, 3)),
        "stability",
    ),
)


def _token_lp_random(d: Draw) -> Args:
    if d.flag():
        return _logits_labels(d)
    n, v = d.int(1, 6), d.int(2, 7)
    return d.randn(n, v, scale=2.0), d.labels(v, n)


_spec(
    "token_logprobs",
    _token_lp_random,
    _e("2-D-logits", lambda d: (d.randn(5, 4), d.labels(4, 5)), "(N,V) logits, (N,) labels"),
    _e("large-logits", lambda d: (d.randn(2, 3, 6, scale=80.0), d.labels(6, 2, 3)), "stability"),
    _e("V=1", lambda d: (d.randn(2, 3, 1), torch.zeros(2, 3, dtype=torch.long)), "single class"),
)


def _seq_lp_random(d: Draw) -> Args:
    return (*_logits_labels_mask(d), d.flag())


_spec(
    "sequence_logprob",
    _seq_lp_random,
    _e("masked-row-normalized", lambda d: (*_row_empty_lm(d), True), "0/0 on a masked row"),
    _e("masked-row-sum", lambda d: (*_row_empty_lm(d), False), "sum over a masked row"),
    _e(
        "soft-mask-normalized",
        lambda d: (d.randn(2, 3, 4), d.labels(4, 2, 3), d.rand(2, 3), True),
        "non-binary mask weights",
    ),
)
_spec("entropy", _entropy_random, *_entropy_edges())


def _nll_random(d: Draw) -> Args:
    n, v = d.int(1, 6), d.int(2, 7)
    return d.randn(n, v, scale=2.0), d.labels(v, n), d.choice([0.0, d.uniform(0.0, 0.3)])


def _ignored_nll(d: Draw) -> Args:
    labels = d.labels(5, 4)
    labels[1] = -100
    return d.randn(4, 5), labels, 0.1


_spec(
    "smoothed_nll",
    _nll_random,
    _e("smoothing=1", lambda d: (d.randn(3, 5), d.labels(5, 3), 1.0), "uniform target only"),
    _e("3-D-logits", lambda d: (d.randn(2, 3, 4), d.labels(4, 2, 3), 0.1), "(B,T,V) logits"),
    _e("ignored-label", _ignored_nll, "-100 label: no ignore_index", may_raise=True),
)


def _ce_random(d: Draw) -> Args:
    n, v = d.int(2, 6), d.int(2, 7)
    labels = d.labels(v, n)
    labels[d.rand(n) < 0.2] = -100
    return d.randn(n, v, scale=2.0), labels, -100


_spec(
    "cross_entropy",
    _ce_random,
    _e(
        "all-ignored",
        lambda d: (d.randn(3, 4), torch.full((3,), -100), -100),
        "every label ignored: F.cross_entropy gives NaN",
    ),
    _e(
        "3-D-logits",
        lambda d: (d.randn(2, 3, 5), d.labels(5, 2, 3), -100),
        "(B,T,V) logits: F.cross_entropy reads dim 1 as classes",
        may_raise=True,
    ),
    _e(
        "ignore-index-0",
        lambda d: (d.randn(5, 4), torch.tensor([0, 1, 0, 3, 2]), 0),
        "a real class as ignore_index",
    ),
    _e("none-ignored", lambda d: (d.randn(4, 6), d.labels(6, 4), -100), "no ignored label"),
)
_spec(
    "normalized_entropy",
    _entropy_random,
    *_entropy_edges(),
    _e("V=1", lambda d: (d.randn(2, 3, 1), torch.ones(2, 3)), "ln V = 0", may_raise=True),
    _e("uniform", lambda d: (torch.zeros(2, 5), torch.ones(2)), "exactly 1"),
)


def _temp_random(d: Draw) -> Args:
    logits, labels = _token_lp_random(d)
    return logits, labels, d.uniform(0.3, 2.5)


_spec(
    "logprob_at_temperature",
    _temp_random,
    _e("T=1", lambda d: (d.randn(2, 3, 5), d.labels(5, 2, 3), 1.0), "temperature 1"),
    _e("T=0.05", lambda d: (d.randn(2, 4), d.labels(4, 2), 0.05), "sharp distribution"),
    _e("2-D-logits", lambda d: (d.randn(4, 3), d.labels(3, 4), 0.7), "(N,V) logits"),
)
