"""Seeded simulation: intervals with a guarantee cover the true paired difference >= 1 - alpha.

Each dataset draws n items; per item, with probability p_b only the treatment is right, with p_c
only the baseline, else both agree (right or wrong with probability 1/2). The true difference is
Delta = p_b - p_c and McNemar's conditional parameter is pi = p_b / (p_b + p_c).
"""

from __future__ import annotations

import numpy as np
import pytest

from losslab.stats import empirical_bernstein_ci, hoeffding_ci, mcnemar_exact, paired_t_ci

ALPHA = 0.05
DATASETS = 400  # per setting; Monte-Carlo s.e. of a 0.97 coverage is ~0.009

# (p_b, p_c, n): a real gap, no gap, and rare discordance (the hard case for asymptotics)
SETTINGS = [(0.10, 0.05, 40), (0.20, 0.20, 30), (0.02, 0.01, 100)]


def _simulate(p_b: float, p_c: float, n: int, seed: int) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    delta, pi = p_b - p_c, p_b / (p_b + p_c)
    hits = dict.fromkeys(
        [
            "hoeffding",
            "bernstein",
            "mcnemar_pi",
            "mcnemar_unconditional",
            "mcnemar_conditional",
            "paired_t",
        ],
        0,
    )
    for _ in range(DATASETS):
        u_N = rng.random(n)
        treat_N = (u_N < p_b).astype(float)
        base_N = ((u_N >= p_b) & (u_N < p_b + p_c)).astype(float)
        agree_right_N = (u_N >= p_b + p_c) & (rng.random(n) < 0.5)
        treat_N[agree_right_N] = 1.0
        base_N[agree_right_N] = 1.0
        d_N = treat_N - base_N
        hits["hoeffding"] += hoeffding_ci(d_N, (-1.0, 1.0), ALPHA).covers(delta)
        hits["bernstein"] += empirical_bernstein_ci(d_N, (-1.0, 1.0), ALPHA).covers(delta)
        hits["paired_t"] += paired_t_ci(d_N, ALPHA, (-1.0, 1.0)).covers(delta)
        mc = mcnemar_exact(treat_N, base_N, ALPHA)
        if mc.b + mc.c > 0:  # pi is only defined given a discordant pair
            hits["mcnemar_pi"] += mc.pi_ci[0] <= pi <= mc.pi_ci[1]
        else:
            hits["mcnemar_pi"] += 1
        hits["mcnemar_unconditional"] += mc.unconditional_ci[0] <= delta <= mc.unconditional_ci[1]
        hits["mcnemar_conditional"] += mc.interval.covers(delta)
    return {k: v / DATASETS for k, v in hits.items()}


@pytest.fixture(scope="module")
def coverage() -> dict[tuple[float, float, int], dict[str, float]]:
    return {s: _simulate(*s, seed=i) for i, s in enumerate(SETTINGS)}


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize(
    "method", ["hoeffding", "bernstein", "mcnemar_pi", "mcnemar_unconditional"]
)
def test_guaranteed_intervals_cover(coverage, setting, method) -> None:  # type: ignore[no-untyped-def]
    assert coverage[setting][method] >= 1 - ALPHA, coverage[setting]


def test_asymptotic_intervals_undercover_with_rare_discordance(coverage) -> None:  # type: ignore[no-untyped-def]
    """Why paired-t and the conditional McNemar interval are reported but never decide: with 2%
    vs 1% discordance at n = 100 (about 3 discordant pairs) they cover Delta well below 95%."""
    rare = coverage[(0.02, 0.01, 100)]
    assert rare["paired_t"] < 1 - ALPHA
    assert rare["mcnemar_conditional"] < 1 - ALPHA
