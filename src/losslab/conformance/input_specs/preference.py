"""Input specs for `losslab.objectives.preference`: DPO/IPO pairs and Bradley-Terry logits."""

from __future__ import annotations

import torch

from losslab.conformance.input_specs._shared import (
    Args,
    Draw,
    _call,
    _e,
    _spec,
)


def _pref_scalars(d: Draw, b: int) -> Args:
    # sequence log-prob sums: policy and reference close to each other, around -20
    pc, pr = d.randn(b, scale=5.0) - 20.0, d.randn(b, scale=5.0) - 20.0
    return pc, pr, pc + d.randn(b), pr + d.randn(b)


def _dpo_seq_args(d: Draw, smoothing: float | None = None, empty_rejected: bool = False) -> Args:
    b, t, v = d.int(1, 3), d.int(1, 5), d.int(2, 6)
    pc, pr = d.randn(b, t, v), d.randn(b, t, v)
    rc, rr = pc + d.randn(b, t, v, scale=0.5), pr + d.randn(b, t, v, scale=0.5)
    cl, rl = d.labels(v, b, t), d.labels(v, b, t)
    cm = d.mask(b, t, keep=0.8)
    rm = torch.zeros(b, t) if empty_rejected else d.mask(b, t, keep=0.8)
    eps = smoothing if smoothing is not None else d.choice([0.0, d.uniform(0.0, 0.3)])
    return _call(
        "dpo_sequence_loss",
        pc_logits=pc,
        pr_logits=pr,
        rc_logits=rc,
        rr_logits=rr,
        chosen_labels=cl,
        rejected_labels=rl,
        chosen_mask=cm,
        rejected_mask=rm,
        beta=d.uniform(0.05, 0.5),
        label_smoothing=eps,
    )


def _dpo_random(d: Draw) -> Args:
    b = d.int(1, 8)
    return (*_pref_scalars(d, b), d.uniform(0.05, 0.5), d.choice([0.0, d.uniform(0.0, 0.3)]))


def _large_margin(d: Draw) -> Args:
    pc, pr, rc, rr = _pref_scalars(d, 4)
    return pc + 200.0, pr - 200.0, rc, rr, 1.0, 0.1  # logsigmoid(-400): log(sigmoid) gives -inf


_spec(
    "dpo_loss",
    _dpo_random,
    _e("smoothing-0.5", lambda d: (*_pref_scalars(d, 5), 0.1, 0.5), "label_smoothing = 0.5"),
    _e("large-margin", _large_margin, "|z| = 400: logsigmoid stability"),
    _e("B=1", lambda d: (*_pref_scalars(d, 1), 0.2, 0.0), "a single pair"),
)


def _ipo_random(d: Draw) -> Args:
    return (*_pref_scalars(d, d.int(1, 8)), d.uniform(0.05, 0.5))


_spec(
    "ipo_loss",
    _ipo_random,
    _e("small-beta", lambda d: (*_pref_scalars(d, 4), 0.01), "1/(2β) = 50"),
    _e("B=1", lambda d: (*_pref_scalars(d, 1), 0.1), "a single pair"),
)
_spec(
    "dpo_sequence_loss",
    _dpo_seq_args,
    _e("smoothing>0", lambda d: _dpo_seq_args(d, smoothing=0.2), "label_smoothing = 0.2"),
    _e("empty-rejected-mask", lambda d: _dpo_seq_args(d, empty_rejected=True), "Σmask = 0"),
)


def _bt_random(d: Draw) -> Args:
    shape = d.shape(max_dims=2)
    return d.randn(*shape), d.randn(*shape), d.uniform(0.05, 2.0)


_spec(
    "bradley_terry_logit",
    _bt_random,
    _e("beta=0", lambda d: (d.randn(4), d.randn(4), 0.0), "β = 0"),
    _e("2-D", lambda d: (d.randn(2, 3), d.randn(2, 3), 0.5), "elementwise on 2-D"),
)
