"""Properties that hold for every loss and reduction (hypothesis):

* minibatch gradients, each reduced with the FULL batch's counts, sum to the full-batch gradient
  (and the losses sum to the full-batch loss), for every loss whose declared batch scope is
  "token" (a "batch"-scoped loss refuses such counts: tests/losses/test_field_losses.py);
* a loss is invariant to padding: extra masked tokens, holding garbage (NaN, inf), before or
  after a datum's tokens change nothing, and get a zero gradient;
* a loss is invariant to the order of datums (gradients and kept masks move with their datum).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from losslab.losses import LOSS_NAMES, REDUCTIONS, TokenData, get_loss
from losslab.losses.declarations import LOSSES as DECLARATIONS

F64 = torch.float64


@dataclass(frozen=True)
class Rows:
    """A batch as plain lists: per datum (logprobs, sampler, old, advantages, mask)."""

    lp: list[list[float]]
    sampler: list[list[float]]
    old: list[list[float]]
    adv: list[list[float]]
    mask: list[list[float]]

    def __len__(self) -> int:
        return len(self.lp)

    def take(self, idx: list[int]) -> Rows:
        return Rows(
            *([getattr(self, f)[i] for i in idx] for f in ("lp", "sampler", "old", "adv", "mask"))
        )

    def build(self) -> tuple[list[torch.Tensor], TokenData]:
        lp_D = [torch.tensor(x, dtype=F64, requires_grad=True) for x in self.lp]
        to = lambda rows: [torch.tensor(x, dtype=F64) for x in rows]  # noqa: E731
        return lp_D, TokenData(lp_D, to(self.sampler), to(self.adv), to(self.mask), to(self.old))

    def global_counts(self) -> dict[str, float | None]:
        per_datum = [sum(1 for m in row if m > 0) for row in self.mask]
        return {
            "num_tokens": sum(per_datum) or None,
            "num_sequences": sum(1 for n in per_datum if n) or None,
            "norm_constant": max(per_datum, default=0) or None,
        }


@st.composite
def rows(draw) -> Rows:
    n = draw(st.integers(1, 4))
    out: dict[str, list[list[float]]] = {k: [] for k in ("lp", "sampler", "old", "adv", "mask")}
    for _ in range(n):
        t = draw(st.integers(0, 6))

        def floats(lo: float, hi: float, t: int = t) -> st.SearchStrategy[list[float]]:
            return st.lists(st.floats(lo, hi), min_size=t, max_size=t)

        sampler = draw(floats(-4.0, -0.01))
        log_ratio = draw(floats(-1.5, 1.5))
        old_shift = draw(floats(-0.5, 0.5))
        a = draw(st.sampled_from([-1.5, -0.4, 0.0, 0.6, 2.0]))
        mask = draw(st.lists(st.sampled_from([0.0, 1.0, 1.0, 0.5]), min_size=t, max_size=t))
        out["sampler"].append(sampler)
        out["lp"].append([min(s + r, 0.0) for s, r in zip(sampler, log_ratio, strict=True)])
        out["old"].append([min(s + o, 0.0) for s, o in zip(sampler, old_shift, strict=True)])
        out["adv"].append([a] * t)
        out["mask"].append(mask)
    return Rows(**out)


LOSSES = st.sampled_from(
    [(name, {}) for name in LOSS_NAMES]
    + [
        ("dppo_binary_tv", {"anchor": "recomputed", "surrogate": "logprob"}),
        ("dppo_binary_kl", {"anchor": "recomputed", "zero_adv": "keep"}),
        ("ppo", {"surrogate": "logprob", "clip_ratio_c": 1.2}),
        ("importance_sampling", {"surrogate": "ratio", "clip_ratio_c": 1.3}),
    ]
)


def _run(fn, batch_rows: Rows, **counts):
    lp_D, batch = batch_rows.build()
    out = fn(batch, **counts)
    out.loss.backward()
    return out, [x.grad for x in lp_D]


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-10, abs_tol=1e-10)


def _minibatch_sum_matches(fn, data: Rows, split: int) -> None:
    counts = data.global_counts()
    full, full_grads = _run(fn, data, **counts)
    head, head_grads = _run(fn, data.take(list(range(split))), **counts)
    tail, tail_grads = _run(fn, data.take(list(range(split, len(data)))), **counts)
    assert _close(head.loss.item() + tail.loss.item(), full.loss.item())
    for g_full, g_part in zip(full_grads, head_grads + tail_grads, strict=True):
        torch.testing.assert_close(g_full, g_part, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@settings(max_examples=15, deadline=None, derandomize=True)
@given(data=rows(), loss=LOSSES, split_at=st.floats(0, 1))
def test_minibatch_gradients_sum_to_the_full_batch(reduction, data, loss, split_at):
    assume(len(data) >= 2)  # both minibatches non-empty (an empty TokenData is a ValueError)
    assume(DECLARATIONS[loss[0]].batch_scope == "token")
    fn = get_loss(loss[0], reduction=reduction, **loss[1])
    _minibatch_sum_matches(fn, data, 1 + min(int(split_at * (len(data) - 1)), len(data) - 2))


@pytest.mark.parametrize("name", [n for n in LOSS_NAMES if DECLARATIONS[n].batch_scope == "token"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_minibatch_sum_every_loss_and_reduction(name, reduction):
    """Deterministic companion: every (loss, reduction) pair on one fixed batch, split 2 + 2."""
    data = Rows(
        lp=[[-0.2, -1.0, -0.6], [-1.3, -0.1], [-0.5], [-0.9, -2.0, -0.3, -0.05]],
        sampler=[[-0.5, -0.8, -0.4], [-1.0, -0.4], [-0.6], [-1.1, -1.5, -0.5, -0.2]],
        old=[[-0.4, -0.9, -0.5], [-1.1, -0.3], [-0.6], [-1.0, -1.7, -0.4, -0.1]],
        adv=[[1.0] * 3, [-1.0] * 2, [0.5], [-0.7] * 4],
        mask=[[0, 1, 1], [1, 1], [0], [1, 0.5, 1, 1]],
    )
    _minibatch_sum_matches(get_loss(name, reduction=reduction), data, 2)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    data=rows(),
    loss=LOSSES,
    reduction=st.sampled_from(REDUCTIONS),
    pads=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), min_size=4, max_size=4),
    garbage=st.sampled_from([math.nan, math.inf, -math.inf, -1.0, 5.0]),
)
def test_padding_with_masked_tokens_changes_nothing(data, loss, reduction, pads, garbage):
    fn = get_loss(loss[0], reduction=reduction, **loss[1])
    padded = {f: [] for f in ("lp", "sampler", "old", "adv", "mask")}
    for d in range(len(data)):
        before, after = pads[d]
        for f in ("lp", "sampler", "old", "adv"):
            padded[f].append([garbage] * before + getattr(data, f)[d] + [garbage] * after)
        padded["mask"].append([0.0] * before + data.mask[d] + [0.0] * after)
    base, base_grads = _run(fn, data)
    pad, pad_grads = _run(fn, Rows(**padded))
    assert _close(pad.loss.item(), base.loss.item())
    for d, (g, g_pad) in enumerate(zip(base_grads, pad_grads, strict=True)):
        before = pads[d][0]
        torch.testing.assert_close(g_pad[before : before + len(g)], g, rtol=1e-12, atol=0)
        assert int(torch.count_nonzero(g_pad)) == int(torch.count_nonzero(g))  # pads get 0
        assert pad.kept_D[d][before : before + len(g)].tolist() == base.kept_D[d].tolist()
    for key, value in base.metrics.items():
        assert _close(pad.metrics[key], value) or (
            math.isnan(value) and math.isnan(pad.metrics[key])
        ), key


@settings(max_examples=40, deadline=None, derandomize=True)
@given(data=rows(), loss=LOSSES, reduction=st.sampled_from(REDUCTIONS), perm_seed=st.randoms())
def test_datum_order_does_not_matter(data, loss, reduction, perm_seed):
    fn = get_loss(loss[0], reduction=reduction, **loss[1])
    perm = list(range(len(data)))
    perm_seed.shuffle(perm)
    base, base_grads = _run(fn, data)
    shuffled, shuffled_grads = _run(fn, data.take(perm))
    assert _close(shuffled.loss.item(), base.loss.item())
    for new_pos, old_pos in enumerate(perm):
        torch.testing.assert_close(
            shuffled_grads[new_pos], base_grads[old_pos], rtol=1e-12, atol=1e-15
        )
        assert shuffled.kept_D[new_pos].tolist() == base.kept_D[old_pos].tolist()
