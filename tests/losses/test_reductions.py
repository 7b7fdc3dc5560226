"""Reductions on hand-derived values, global counts, and verl's published aggregation cases."""

from __future__ import annotations

import math

import pytest

from losslab.losses import REDUCTIONS, get_loss

# cross_entropy makes per-token losses easy to read: L_t = -ℓ_t·m_t.
# datum 0: ℓ = (-1, -2), both in the loss          -> token losses (1, 2), sum 3, 2 tokens
# datum 1: ℓ = (-3, -4, -5), mask (1, 1, 0)        -> (3, 4, 0), sum 7, 2 tokens
# datum 2: ℓ = (-6,), mask (0,)                    -> empty: excluded from sequence counts
LOGP = [[-1.0, -2.0], [-3.0, -4.0, -5.0], [-6.0]]
MASK = [[1.0, 1.0], [1.0, 1.0, 0.0], [0.0]]


def _batch(make_batch):
    zeros = [[0.0] * len(x) for x in LOGP]
    return make_batch(LOGP, zeros, zeros, MASK)


@pytest.mark.parametrize(
    ("reduction", "expected"),
    [
        ("sum", 10.0),  # 1 + 2 + 3 + 4
        ("token-mean", 2.5),  # 10 / 4 loss tokens
        ("seq-mean-token-sum", 5.0),  # (3 + 7) / 2 non-empty sequences
        ("seq-mean-token-mean", 2.5),  # (3/2 + 7/2) / 2
        ("seq-mean-token-sum-norm", 5.0),  # 10 / C, C = longest loss-token count here = 2
    ],
)
def test_reduction_hand_values(make_batch, reduction, expected):
    _, batch = _batch(make_batch)
    assert get_loss("cross_entropy", reduction=reduction)(batch).loss.item() == pytest.approx(
        expected, abs=1e-12
    )


@pytest.mark.parametrize(
    ("reduction", "counts", "expected"),
    [
        ("token-mean", {"num_tokens": 8}, 10 / 8),
        ("seq-mean-token-sum", {"num_sequences": 4}, 10 / 4),
        ("seq-mean-token-mean", {"num_sequences": 4}, 5 / 4),  # (1.5 + 3.5) / 4
        ("seq-mean-token-sum-norm", {"norm_constant": 8}, 10 / 8),  # Dr. GRPO: C = max_tokens
    ],
)
def test_global_counts_replace_local_ones(make_batch, reduction, counts, expected):
    _, batch = _batch(make_batch)
    loss = get_loss("cross_entropy", reduction=reduction)(batch, **counts).loss.item()
    assert loss == pytest.approx(expected, abs=1e-12)


def test_norm_constant_as_a_parameter_and_per_call(make_batch):
    _, batch = _batch(make_batch)
    fn = get_loss("cross_entropy", reduction="seq-mean-token-sum-norm", norm_constant=4)
    assert fn(batch).loss.item() == pytest.approx(10 / 4, abs=1e-12)
    assert fn(batch, norm_constant=5).loss.item() == pytest.approx(10 / 5, abs=1e-12)  # call wins


@pytest.mark.parametrize(
    ("counts", "match"),
    [
        ({"num_tokens": 3}, "smaller than this batch's own count"),  # 4 loss tokens here
        ({"num_tokens": 0}, "positive"),
        ({"num_tokens": math.nan}, "finite"),
        ({"num_sequences": 1}, "smaller than this batch's own count"),  # 2 non-empty here
        # a per-call norm_constant is a parameter too: its declared domain refuses it
        ({"norm_constant": -1.0}, r"cross_entropy: norm_constant=-1.0: expected a value > 0"),
    ],
)
def test_bad_global_counts(make_batch, counts, match):
    _, batch = _batch(make_batch)
    reduction = {"num_tokens": "token-mean", "num_sequences": "seq-mean-token-sum"}.get(
        next(iter(counts)), "seq-mean-token-sum-norm"
    )
    with pytest.raises(ValueError, match=match):
        get_loss("cross_entropy", reduction=reduction)(batch, **counts)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_all_masked_batch_is_zero_not_nan(make_batch, reduction):
    # Stable-RL's token-mean gives 0/0 = NaN on an all-masked micro-batch (reference_losses.md §6);
    # ours divides by max(count, 1) and returns 0 with a zero gradient.
    lp, batch = make_batch([[-1.0, -2.0]], [[-1.0, -2.0]], [[1.0, 1.0]], [[0.0, 0.0]])
    out = get_loss("ppo", reduction=reduction)(batch)
    out.loss.backward()
    assert out.loss.item() == 0.0
    assert lp[0].grad.tolist() == [0.0, 0.0]


def test_verl_token_sum_case(make_batch):
    # verl tests/trainer/ppo/test_loss_aggregation_on_cpu.py: losses [[1, 2, 30], [4, 50, 6]],
    # mask [[1, 1, 0], [1, 0, 1]] -> masked sum 1 + 2 + 4 + 6 = 13; verl reports 52 = 13 x dp 4
    # (its dp_size factor, which a single-process Tinker-style sum does not have).
    values = [[1.0, 2.0, 30.0], [4.0, 50.0, 6.0]]
    lp, batch = make_batch(
        [[-v for v in row] for row in values],
        [[0.0] * 3] * 2,
        [[0.0] * 3] * 2,
        [[1, 1, 0], [1, 0, 1]],
    )
    assert get_loss("cross_entropy")(batch).loss.item() == 13.0
    assert 4 * get_loss("cross_entropy")(batch).loss.item() == 52.0


def test_verl_masked_mean_ignores_nan_at_masked_slot(make_batch):
    # verl tests/utils/test_torch_functional.py: masked_mean([1, 2, 3, 4], [1, 0, 0, 1]) = 2.5,
    # and a NaN at a masked slot is ignored.
    lp, batch = make_batch([[-1.0, math.nan, -3.0, -4.0]], [[0.0] * 4], [[0.0] * 4], [[1, 0, 0, 1]])
    out = get_loss("cross_entropy", reduction="token-mean")(batch)
    out.loss.backward()
    assert out.loss.item() == 2.5  # (1 + 4) / 2
    assert lp[0].grad.tolist() == [-0.5, 0.0, 0.0, -0.5]
