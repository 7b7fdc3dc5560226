"""Each interval against numbers derived by hand (derivations in comments)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from losslab.stats import (
    clopper_pearson,
    empirical_bernstein_ci,
    hoeffding_ci,
    mcnemar_exact,
    paired_t_ci,
)

from ._data import paired_counts

# 100 items: D = +1 on 10, -1 on 5, 0 on 85 -> mean(D) = (10 - 5) / 100 = 0.05
D_100 = np.array([1.0] * 10 + [-1.0] * 5 + [0.0] * 85)


def test_hoeffding_at_the_seed_plan_n() -> None:
    # range 2 (D in [-1, 1]), n 1319, alpha 0.05:
    # half = 2 * sqrt(ln(2 / 0.05) / (2 * 1319)) = 2 * sqrt(3.688879 / 2638) = 2 * 0.0373947 = 0.07479
    pos, neg = paired_counts(1319, b=80, c=52, both=700)
    ci = hoeffding_ci(pos - neg, (-1.0, 1.0), 0.05)
    assert ci.half_width == pytest.approx(0.0747894, abs=1e-7)
    assert ci.estimate == pytest.approx(28 / 1319)  # (b - c) / n
    assert ci.ci == pytest.approx((28 / 1319 - 0.0747894, 28 / 1319 + 0.0747894), abs=1e-7)


def test_hoeffding_n1_is_clipped_to_the_range() -> None:
    # n = 1: half = 2 * sqrt(ln 40 / 2) = 2.716 > the whole range, so the CI is [-1, 1]
    ci = hoeffding_ci([1.0], (-1.0, 1.0), 0.05)
    assert ci.half_width == pytest.approx(2 * math.sqrt(math.log(40) / 2))
    assert ci.ci == (-1.0, 1.0)


def test_empirical_bernstein_hand_numbers() -> None:
    # Z = (D + 1) / 2: 1 on 10 items, 0 on 5, 0.5 on 85; mean 0.525
    # sum sq. dev = 10 * 0.475^2 + 5 * 0.525^2 + 85 * 0.025^2 = 3.6875; V = 3.6875 / 99 = 0.0372475
    # ln(4 / 0.05) = 4.382027
    # half_Z = sqrt(2 V ln80 / 100) + 7 ln80 / (3 * 99) = 0.0571346 + 0.1032802 = 0.1604148
    # half_D = 2 * half_Z = 0.3208296
    ci = empirical_bernstein_ci(D_100, (-1.0, 1.0), 0.05)
    assert ci.half_width == pytest.approx(0.3208296, abs=1e-6)
    assert ci.ci == pytest.approx((0.05 - 0.3208296, 0.05 + 0.3208296), abs=1e-6)
    assert ci.details["sample_variance"] == pytest.approx(4 * 3.6875 / 99)


def test_paired_t_hand_numbers() -> None:
    # s_D^2 = 4 * V_Z = 4 * 3.6875 / 99 = 0.148990, s_D = 0.385993; t_{0.975, 99} = 1.984217
    # half = 1.984217 * 0.385993 / sqrt(100) = 0.0765892
    ci = paired_t_ci(D_100, 0.05)
    assert ci.details["t_critical"] == pytest.approx(1.984217, abs=1e-6)
    assert ci.half_width == pytest.approx(0.0765892, abs=1e-6)
    assert ci.ci == pytest.approx((0.05 - 0.0765892, 0.05 + 0.0765892), abs=1e-6)


def test_clopper_pearson_zero_successes_closed_form() -> None:
    # k = 0 of m = 10: lower 0, upper solves (1 - p)^10 = alpha / 2 -> 1 - 0.025^(1/10) = 0.308497
    assert clopper_pearson(0, 10, 0.05) == pytest.approx((0.0, 0.3084971), abs=1e-6)
    # symmetric: k = m mirrors k = 0
    assert clopper_pearson(10, 10, 0.05) == pytest.approx((1 - 0.3084971, 1.0), abs=1e-6)


def test_mcnemar_small_exact_p_value() -> None:
    # b = 8, c = 1: p = 2 * P(Bin(9, 1/2) <= 1) = 2 * (1 + 9) / 2^9 = 20 / 512 = 0.0390625
    pos, neg = paired_counts(30, b=8, c=1, both=10)
    result = mcnemar_exact(pos, neg, 0.05)
    assert (result.b, result.c) == (8, 1)
    assert result.p_value == pytest.approx(20 / 512)
    assert result.interval.estimate == pytest.approx(7 / 30)


def test_mcnemar_matches_peers_anchor() -> None:
    # peers.md §4.3 (Miller-style table, n = 1319, m = 132 discordant, b = 80):
    # estimate +2.12 pp, CI (+0.35, +3.80) pp, exact p = 0.018
    pos, neg = paired_counts(1319, b=80, c=52, both=700)
    result = mcnemar_exact(pos, neg, 0.05)
    assert result.interval.estimate == pytest.approx(0.0212, abs=5e-5)
    assert result.interval.low == pytest.approx(0.0035, abs=5e-5)
    assert result.interval.high == pytest.approx(0.0380, abs=5e-5)
    assert result.p_value == pytest.approx(0.018, abs=5e-4)
    # the unconditional interval also bounds the discordance rate, so it is wider
    assert result.unconditional_ci[0] < result.interval.low
    assert result.unconditional_ci[1] > result.interval.high


def test_all_concordant_pairs() -> None:
    pos, neg = paired_counts(50, b=0, c=0, both=30)
    result = mcnemar_exact(pos, neg, 0.05)
    assert (result.b, result.c, result.p_value) == (0, 0, 1.0)
    assert result.interval.ci == (0.0, 0.0)
    assert "no discordant pairs" in result.interval.note
    t = paired_t_ci(pos - neg, 0.05)
    assert t.ci == (0.0, 0.0) and "sd = 0" in t.note
    # Hoeffding ignores the variance: n = 50, still +-2 * sqrt(ln 40 / (2 * 50)) = +-0.384129
    assert hoeffding_ci(pos - neg, (-1, 1), 0.05).half_width == pytest.approx(0.384129, abs=1e-6)


def test_n_equal_one_edge_cases() -> None:
    assert paired_t_ci([1.0], 0.05, (-1.0, 1.0)).ci == (-1.0, 1.0)
    assert empirical_bernstein_ci([1.0], (-1.0, 1.0), 0.05).ci == (-1.0, 1.0)
    result = mcnemar_exact([1.0], [0.0], 0.05)
    # b = 1 of m = 1: Clopper-Pearson [0.025, 1], so D in (1/1) * (2 * 0.025 - 1, 1) = (-0.95, 1)
    assert result.interval.ci == pytest.approx((-0.95, 1.0))
    assert result.p_value == 1.0


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda: hoeffding_ci([], (-1, 1), 0.05), "empty"),
        (lambda: hoeffding_ci([2.0], (-1, 1), 0.05), "outside the declared range"),
        (lambda: hoeffding_ci([0.0], (-1, 1), 1.0), "alpha must lie in"),
        (lambda: hoeffding_ci([float("nan")], (-1, 1), 0.05), "non-finite"),
        (lambda: hoeffding_ci([[0.0]], (-1, 1), 0.05), "1-D"),
        (lambda: mcnemar_exact([1, 0], [1], 0.05), "not paired"),
        (lambda: mcnemar_exact([0.5], [1], 0.05), "0/1 outcomes"),
        (lambda: empirical_bernstein_ci([0.0], (1, -1), 0.05), "low < high"),
    ],
)
def test_bad_input_is_named(call, words: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=words):
        call()
