"""One test per convention the record left open (docs/conventions.md "Unpinned choices"), plus
argument validation. Expected numbers are derived in the comments."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import losslab.objectives as O

NAN = float("nan")


# ------------------------------------------------------------------ empty reductions are 0
def test_empty_masks_give_zero_not_nan() -> None:
    v = torch.tensor([1.0, NAN, 3.0])
    z = torch.zeros(3)
    assert O.masked_mean(v, z).item() == 0.0
    assert O.masked_sum(v, z).item() == 0.0
    assert O.masked_max(v, z).item() == 0.0
    assert O.advantage_mean_std(v, z).tolist() == [0.0, 0.0]
    assert O.masked_whiten(v, z, True).tolist() == [0.0, 0.0, 0.0]
    assert O.masked_whiten(v, z, False).tolist() == [0.0, 0.0, 0.0]  # + μ, and μ = 0
    # a fully masked ROW with axis: 0 for that row, the mean for the other
    vals = torch.tensor([[1.0, 2.0], [3.0, 5.0]])
    m = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    assert O.masked_mean(vals, m, axis=1).tolist() == [0.0, 4.0]
    logits = torch.randn(2, 3, 4)
    labels = torch.zeros(2, 3, dtype=torch.long)
    zm = torch.zeros(2, 3)
    assert O.entropy(logits, zm).item() == 0.0
    assert O.normalized_entropy(logits, zm).item() == 0.0
    assert O.sequence_logprob(logits, labels, zm, True).tolist() == [0.0, 0.0]
    assert (
        O.clipped_pg_loss(torch.zeros(3), torch.zeros(3), torch.ones(3), z, 0.2, 0.2).item() == 0.0
    )
    out = O.grpo_objective(
        logits, logits, logits, labels, zm, torch.tensor([1.0, 2.0]), 2, 0.1, 0.2, 0.2, True, "k3"
    )
    assert out.item() == 0.0


def test_empty_mask_gradient_is_zero_not_nan() -> None:
    v = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    O.masked_mean(v, torch.tensor([[0.0, 0.0], [1.0, 0.0]]), axis=1).sum().backward()
    assert v.grad.tolist() == [[0.0, 0.0], [1.0, 0.0]]


def test_whiten_empty_mask_raises() -> None:
    # whiten applies w at every slot; with no statistics every slot would be v·1e4
    with pytest.raises(ValueError, match="whiten: mask selects no element"):
        O.whiten(torch.ones(3), torch.zeros(3), True)


def test_empty_tensors() -> None:
    e = torch.zeros(0)
    assert O.dpo_loss(e, e, e, e, 0.1, 0.0).item() == 0.0
    assert O.value_loss(e, e, e, 0.2).item() == 0.0
    assert O.clip_fraction(e, e, 0.2).item() == 0.0
    assert O.normalize(e, 1e-8).shape == (0,)
    assert O.gae(e, e, torch.tensor(0.0), 0.9, 0.9).shape == (0,)
    with pytest.raises(ValueError, match="median_reward: rewards must have at least one element"):
        O.median_reward(e)
    with pytest.raises(ValueError, match="mode_label: labels must have at least one element"):
        O.mode_label(torch.zeros(0, dtype=torch.long))


# ------------------------------------------------------------------ cross_entropy
def test_cross_entropy_all_ignored_is_zero() -> None:
    # F.cross_entropy returns NaN here; an empty reduction is 0 in this module
    logits = torch.randn(3, 5)
    labels = torch.full((3,), -100)
    assert torch.isnan(F.cross_entropy(logits, labels, ignore_index=-100))
    assert O.cross_entropy(logits, labels, -100).item() == 0.0


def test_cross_entropy_btv_logits_and_other_ignore_index() -> None:
    # vocab is always the last dim: (B, T, V) equals F.cross_entropy on the flattened tokens
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 5, generator=g)
    labels = torch.tensor([[1, 4, 0], [2, 2, 3]])
    labels[0, 1] = 7  # ignore_index 7 (outside [0, V) is allowed only for the ignore value)
    want = F.cross_entropy(logits.reshape(-1, 5), labels.reshape(-1), ignore_index=7)
    torch.testing.assert_close(O.cross_entropy(logits, labels, 7), want)
    # ignore_index inside the vocab: those labels are skipped, not scored
    labels2 = torch.tensor([[1, 4, 0], [2, 2, 3]])
    want2 = F.cross_entropy(logits.reshape(-1, 5), labels2.reshape(-1), ignore_index=2)
    torch.testing.assert_close(O.cross_entropy(logits, labels2, 2), want2)


# ------------------------------------------------------------------ top-k / top-p
def test_top_k_ties_keep_everything_at_the_kth_value() -> None:
    # k = 2 on [3, 1, 3, 3]: the 2nd largest is 3, every entry >= 3 is kept -> 3 Trues
    out = O.top_k_mask(torch.tensor([3.0, 1.0, 3.0, 3.0]), 2)
    assert out.tolist() == [True, False, True, True]
    # k >= V keeps all
    assert O.top_k_mask(torch.tensor([[0.5, -1.0]]), 5).tolist() == [[True, True]]
    with pytest.raises(ValueError, match="top_k_mask: k must be >= 1, got 0"):
        O.top_k_mask(torch.zeros(3), 0)


def test_top_p_boundary_is_kept_and_ties_go_to_lower_index() -> None:
    # [0.5, 0.25, 0.25], p = 0.5: mass before each = [0, 0.5, 0.75]; keep where <= 0.5
    # -> [0.5, 0.25, 0] / 0.75 = [2/3, 1/3, 0] (HF's warper would give [1, 0, 0])
    out = O.top_p_mask(torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64), 0.5)
    torch.testing.assert_close(out, torch.tensor([2 / 3, 1 / 3, 0.0], dtype=torch.float64))
    # uniform [¼]*4, p = 0.5: mass before = [0, ¼, ½, ¾] -> 3 kept, the lowest indices
    out = O.top_p_mask(torch.full((4,), 0.25, dtype=torch.float64), 0.5)
    torch.testing.assert_close(out, torch.tensor([1 / 3, 1 / 3, 1 / 3, 0.0], dtype=torch.float64))
    # p = 0 keeps only the top token; p = 1 keeps all
    probs = torch.tensor([0.2, 0.5, 0.3])
    assert O.top_p_mask(probs, 0.0).tolist() == [0.0, 1.0, 0.0]
    torch.testing.assert_close(O.top_p_mask(probs, 1.0), probs)
    with pytest.raises(ValueError, match=r"top_p_mask: p must be <= 1.0, got 1.5"):
        O.top_p_mask(probs, 1.5)


def test_argmax_ties_first_index() -> None:
    out = O.argmax_tokens(torch.tensor([[1.0, 3.0, 3.0], [2.0, 2.0, 0.0]]))
    assert out.tolist() == [1, 0] and out.dtype == torch.int64


# ------------------------------------------------------------------ quantiles / normalisation
def test_quantile_lower_rank_rule_and_2d_is_global() -> None:
    x = torch.arange(10.0).flip(0)  # sorted: 0..9
    # floor(q·(n-1)): q = 0.91 -> floor(8.19) = 8 (nearest-rank ceil(q·n)-1 would give 9)
    assert O.quantile_lower(x, 0.91).item() == 8.0
    assert O.quantile_lower(x, 0.0).item() == 0.0 and O.quantile_lower(x, 1.0).item() == 9.0
    # 2-D: global over all elements, not per row
    assert O.quantile_lower(x.view(2, 5), 0.5).item() == 4.0  # floor(4.5) = 4
    # integer input keeps its dtype
    out = O.quantile_lower(torch.tensor([5, 1, 3]), 0.5)
    assert out.item() == 3 and out.dtype == torch.int64


def test_median_and_mode_are_global_for_2d() -> None:
    assert O.median_reward(torch.tensor([[1.0, 9.0], [2.0, 3.0]])).item() == 2.5  # (2 + 3) / 2
    out = O.median_reward(torch.tensor([1, 2]))
    assert out.item() == 1.5 and out.dtype == torch.float32  # integer input -> float
    assert O.mode_label(torch.tensor([[1, 2], [2, 7]])).item() == 2
    assert O.mode_label(torch.tensor([-3, -3, 4, 4])).item() == 4  # ties -> largest, negatives ok
    assert O.mode_label(torch.tensor([0.5, 0.5, 0.25])).item() == 0.5  # float labels


def test_normalize_edges() -> None:
    # n = 1: x - mean = 0 exactly, returned as 0 (the unbiased std would be NaN)
    assert O.normalize(torch.tensor([3.0]), 1e-8).tolist() == [0.0]
    # eps OUTSIDE the sqrt: x = [0, 1e-4], mean 5e-5, unbiased std = 1e-4/√2 = 7.0711e-5;
    # eps 1e-4 -> (±5e-5) / (7.0711e-5 + 1e-4) = ±0.29289 (sqrt(var + eps) would give ±0.0050)
    x = torch.tensor([0.0, 1e-4], dtype=torch.float64)
    want = 5e-5 / (1e-4 / math.sqrt(2) + 1e-4)
    torch.testing.assert_close(
        O.normalize(x, 1e-4), torch.tensor([-want, want], dtype=torch.float64)
    )
    # 2-D: global mean/std, not per row
    m = torch.tensor([[0.0, 1.0], [2.0, 3.0]])
    torch.testing.assert_close(O.normalize(m, 0.0).view(-1), O.normalize(m.view(-1), 0.0))


def test_whiten_edges() -> None:
    # one unmasked element: μ = v, σ² = 0 -> w = (v - μ)·rsqrt(1e-8) = (v - μ)·1e4
    v = torch.tensor([2.0, 2.5, 4.0], dtype=torch.float64)
    m = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
    torch.testing.assert_close(O.whiten(v, m, True), (v - 2.0) * 1e4)
    assert O.masked_whiten(v, m, True).tolist() == [0.0, 0.0, 0.0]
    # 2-D: one global mean/variance over all masked-in elements, not per row
    v2 = torch.tensor([[1.0, 2.0], [10.0, 20.0]], dtype=torch.float64)
    torch.testing.assert_close(
        O.whiten(v2, torch.ones(2, 2), True).view(-1),
        O.whiten(v2.view(-1), torch.ones(4), True),
    )


# ------------------------------------------------------------------ groups
def test_group_size_validation_and_g1() -> None:
    r = torch.arange(6.0)
    with pytest.raises(ValueError, match=r"group_size=4 must divide rewards.numel\(\)=6"):
        O.grpo_advantages(r, 4, True)
    with pytest.raises(ValueError, match="rloo_advantages: group_size must be >= 2, got 1"):
        O.rloo_advantages(r, 1)
    with pytest.raises(TypeError, match="group_size must be an int"):
        O.group_mean_baseline(r, 2.0)
    # G = 1: centred rewards are 0; scaled: 0 / (0 + 1e-6) = 0
    assert O.grpo_advantages(r, 1, True).tolist() == [0.0] * 6
    # 2-D rewards: contiguous groups over the row-major flattening, shape kept
    r2 = torch.tensor([[1.0, 3.0], [5.0, 9.0]])
    assert O.grpo_advantages(r2, 2, False).tolist() == [[-1.0, 1.0], [-2.0, 2.0]]
    assert O.group_mean_baseline(r2, 4).tolist() == [[-3.5, -1.5], [0.5, 4.5]]  # mean 4.5


def test_grpo_near_constant_group_eps_outside_sqrt() -> None:
    # group [0, 2e-6]: centred ±1e-6, biased std 1e-6 -> ±1e-6 / (1e-6 + 1e-6) = ±0.5
    r = torch.tensor([0.0, 2e-6], dtype=torch.float64)
    torch.testing.assert_close(
        O.grpo_advantages(r, 2, True), torch.tensor([-0.5, 0.5], dtype=torch.float64)
    )


# ------------------------------------------------------------------ returns layout
def test_gae_layouts() -> None:
    g = torch.Generator().manual_seed(1)
    r, v = torch.randn(4, 3, generator=g), torch.randn(4, 3, generator=g)
    # scalar next_value broadcasts over the batch
    torch.testing.assert_close(
        O.gae(r, v, 0.5, 0.9, 0.95), O.gae(r, v, torch.full((3,), 0.5), 0.9, 0.95)
    )
    # each column is an independent trajectory along dim 0
    col = O.gae(r[:, 1], v[:, 1], torch.tensor(0.5), 0.9, 0.95)
    torch.testing.assert_close(O.gae(r, v, 0.5, 0.9, 0.95)[:, 1], col)
    # 3-D (T, B, K)
    r3, v3 = torch.randn(4, 2, 2, generator=g), torch.randn(4, 2, 2, generator=g)
    out3 = O.gae(r3, v3, torch.zeros(2, 2), 0.9, 0.95)
    torch.testing.assert_close(out3[:, 1, 0], O.gae(r3[:, 1, 0], v3[:, 1, 0], 0.0, 0.9, 0.95))
    # (B, T) data with a (B,) bootstrap is the wrong layout: clear error, not a torch traceback
    with pytest.raises(ValueError, match=r"gae: next_value must be a scalar or have shape"):
        O.gae(torch.zeros(2, 5), torch.zeros(2, 5), torch.zeros(2), 0.9, 0.95)


def test_cumulative_max_edges() -> None:
    assert O.cumulative_max(torch.tensor([7.0])).tolist() == [7.0]  # T = 1
    x = torch.tensor([[[1.0, 4.0]], [[3.0, 2.0]], [[0.0, 9.0]]])  # (3, 1, 2), along dim 0
    assert O.cumulative_max(x).tolist() == [[[1.0, 4.0]], [[1.0, 4.0]], [[3.0, 4.0]]]


def test_first_nonzero_non_binary() -> None:
    # nonzero means != 0, so negative and fractional entries count
    out = O.first_nonzero_index(torch.tensor([[0.0, -2.0, 3.0], [0.0, 0.0, 0.5]]))
    assert out.tolist() == [1, 2]


def test_pad_mask_validation_and_0d() -> None:
    assert O.pad_mask_from_lengths(torch.tensor(2), 3).tolist() == [1.0, 1.0, 0.0]
    with pytest.raises(ValueError, match=r"lengths must lie in \[0, max_len=3\], got min 0, max 4"):
        O.pad_mask_from_lengths(torch.tensor([0, 4]), 3)
    with pytest.raises(ValueError, match="lengths must be whole numbers"):
        O.pad_mask_from_lengths(torch.tensor([1.5]), 3)


def test_clip_fraction_is_strict() -> None:
    # r = 1 exactly and clip 0: |r - 1| = 0 is not > 0
    assert O.clip_fraction(torch.zeros(4), torch.zeros(4), 0.0).item() == 0.0
    # r = e^{ln 1.5} ≈ 1.5 > 1 + 0.2 for 1 of 2 tokens
    lp = torch.tensor([math.log(1.5), 0.0], dtype=torch.float64)
    assert O.clip_fraction(lp, torch.zeros(2, dtype=torch.float64), 0.2).item() == 0.5


def test_entropy_edges() -> None:
    # -inf logits: 0·log 0 := 0, no NaN in value or gradient; H([½, ½, 0]) = ln 2
    logits = torch.tensor([[0.0, 0.0, -float("inf")]], requires_grad=True)
    h = O.entropy(logits, torch.ones(1))
    assert abs(h.item() - math.log(2)) < 1e-6
    h.backward()
    assert torch.isfinite(logits.grad).all()
    with pytest.raises(
        ValueError, match="normalized_entropy: logits last dim \\(V\\) must be >= 2"
    ):
        O.normalized_entropy(torch.zeros(2, 1), torch.ones(2))


def test_reverse_kl_objective_per_token_advantages() -> None:
    # (B,) advantages broadcast over T; the same values given per token (B, T) agree
    g = torch.Generator().manual_seed(3)
    lg, ref = torch.randn(2, 3, 4, generator=g), torch.randn(2, 3, 4, generator=g)
    labels = torch.randint(0, 4, (2, 3), generator=g)
    m = torch.ones(2, 3)
    a = torch.tensor([0.5, -1.0])
    per_seq = O.reverse_kl_objective(lg, ref, labels, m, a, 0.1)
    per_tok = O.reverse_kl_objective(lg, ref, labels, m, a[:, None].expand(2, 3), 0.1)
    torch.testing.assert_close(per_seq, per_tok)
    with pytest.raises(ValueError, match=r"advantages must have shape \(2,\) .* or \(2, 3\)"):
        O.reverse_kl_objective(lg, ref, labels, m, torch.zeros(3), 0.1)


def test_ppo_objective_parameter_roles_and_2d() -> None:
    # the three clips are separate: with r = 1 everywhere the policy clip is inactive, so changing
    # clip_low/clip_high cannot change the loss, while vf_clip can
    g = torch.Generator().manual_seed(4)
    T, B = 5, 2
    r, v, ov = (torch.randn(T, B, generator=g) for _ in range(3))
    lp = torch.zeros(T, B)
    args = (r, v, ov, lp, lp, torch.zeros(B), 0.99, 0.95)
    base = O.ppo_objective(*args, 0.2, 0.2, 0.2, 0.5)
    torch.testing.assert_close(O.ppo_objective(*args, 0.1, 0.4, 0.2, 0.5), base)
    assert abs(O.ppo_objective(*args, 0.2, 0.2, 0.01, 0.5).item() - base.item()) > 1e-6
    # with r = 1 the pg term is -mean(whitened adv) = 0, so loss = vf_coef · value_loss
    adv = O.gae(r, v, torch.zeros(B), 0.99, 0.95)
    torch.testing.assert_close(base, 0.5 * O.value_loss(v, ov, adv + v, 0.2))


# ------------------------------------------------------------------ validation messages
@pytest.mark.parametrize(
    ("call", "exc", "match"),
    [
        (
            lambda: O.kl_penalty(torch.zeros(2), torch.zeros(2), "mse"),
            ValueError,
            r"kl_penalty: estimator must be one of \('k1', 'k2', 'k3'\), got 'mse'",
        ),
        (
            lambda: O.grpo_objective(
                *[torch.zeros(2, 1, 3)] * 3,
                torch.zeros(2, 1, dtype=torch.long),
                torch.ones(2, 1),
                torch.zeros(2),
                2,
                0.1,
                0.2,
                0.2,
                True,
                "kl",
            ),
            ValueError,
            "kl_penalty: estimator must be one of",
        ),
        (
            lambda: O.dpo_loss(*[torch.zeros(2)] * 4, 0.0, 0.0),
            ValueError,
            r"dpo_loss: beta must be > 0.0, got 0.0",
        ),
        (
            lambda: O.ipo_loss(*[torch.zeros(2)] * 4, -1),
            ValueError,
            "ipo_loss: beta must be > 0.0, got -1",
        ),
        (
            lambda: O.masked_mean(torch.zeros(3), torch.zeros(4)),
            ValueError,
            r"masked_mean: shapes do not broadcast: values\(3,\), mask\(4,\)",
        ),
        (
            lambda: O.masked_mean(torch.zeros(2, 3), torch.ones(2, 3), axis=2),
            ValueError,
            r"masked_mean: axis must be None, an int or a tuple of ints in \[-2, 1\]",
        ),
        (
            lambda: O.token_logprobs(torch.zeros(2, 3), torch.tensor([0, 3])),
            ValueError,
            r"token_logprobs: labels must lie in \[0, 3\), found 3",
        ),
        (
            lambda: O.token_logprobs(torch.zeros(2, 3), torch.tensor([0.0, 1.0])),
            ValueError,
            "token_logprobs: labels must be an integer tensor",
        ),
        (
            lambda: O.logprob_at_temperature(torch.zeros(2, 3), torch.tensor([0, 1]), 0.0),
            ValueError,
            "logprob_at_temperature: temperature must be > 0.0, got 0.0",
        ),
        (
            lambda: O.gae(torch.zeros(3), torch.zeros(4), 0.0, 0.9, 0.9),
            ValueError,
            r"gae: rewards and values must have the same shape, got \(3,\) and \(4,\)",
        ),
        (
            lambda: O.discounted_returns(torch.zeros(3), 1.5),
            ValueError,
            "discounted_returns: gamma must be <= 1.0, got 1.5",
        ),
        (
            lambda: O.clipped_pg_loss(*[torch.zeros(2)] * 4, -0.1, 0.2),
            ValueError,
            "clipped_pg_loss: clip_low must be >= 0.0, got -0.1",
        ),
        (
            lambda: O.huber_value_loss(torch.zeros(2), torch.zeros(2), 0.0),
            ValueError,
            "huber_value_loss: delta must be > 0.0, got 0.0",
        ),
        (
            lambda: O.bucketize_reward(torch.zeros(2), torch.tensor([1.0, 0.0])),
            ValueError,
            "bucketize_reward: boundaries must be sorted ascending",
        ),
        (
            lambda: O.quantile_lower(torch.zeros(2), 1.2),
            ValueError,
            "quantile_lower: q must be <= 1.0, got 1.2",
        ),
        (lambda: O.normalize(torch.zeros(2), -1e-8), ValueError, "normalize: eps must be >= 0.0"),
        (
            lambda: O.sequence_logprob(
                torch.zeros(1, 2, 3), torch.zeros(1, 2, dtype=torch.long), torch.ones(1, 2), 1
            ),
            TypeError,
            "length_normalize must be a bool",
        ),
        (
            lambda: O.whiten([1.0, 2.0], torch.ones(2), True),
            TypeError,
            "whiten: values must be a torch.Tensor, got list",
        ),
        (
            lambda: O.top_p_mask(torch.tensor([0.5, -0.1]), 0.5),
            ValueError,
            "top_p_mask: probs must be non-negative",
        ),
        (
            lambda: O.cross_entropy(torch.zeros(2, 3), torch.zeros(3, dtype=torch.long), -100),
            ValueError,
            r"cross_entropy: labels must have shape logits.shape\[:-1\] = \(2,\), got \(3,\)",
        ),
    ],
)
def test_validation_errors_name_argument_value_and_expectation(call, exc, match) -> None:
    with pytest.raises(exc, match=match):
        call()
