"""The power model of losslab.stats.power against seeded Monte Carlo runs of the real rule.

Each simulation draws paired Bernoulli outcomes under the discordance model (a discordant item is
a treatment win with probability (d + delta) / 2, a loss with (d - delta) / 2, D in {-1, 0, 1})
and applies the decision rule. The vectorised rule (mean(D) - h > margin, with the same
`hoeffding_half_width`) is checked against `losslab.stats.decision.decide` itself on a subset of
the simulated data sets. Tolerances are 4 Monte Carlo standard errors, sqrt(p (1 - p) / reps),
plus, where the normal approximation is tested, the slack the text states.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from losslab.plan import Criterion, DecisionRule, hoeffding_half_width, load_plan
from losslab.stats.decision import PairedOutcomes, decide
from losslab.stats.power import (
    DEFAULT_DISCORDANCE,
    criterion_power,
    exact_power,
    items_to_settle,
    mcnemar_power,
    mde_exact,
    mde_mcnemar,
    mde_normal,
    rule_power,
)
from losslab.stats.seeds import decide_over_seeds

SEED_PLAN = Path(__file__).resolve().parents[2] / "examples" / "gsm8k_dppo_vs_grpo.json"
"""The user's plan as shipped in examples/ (n = 1319, paired Hoeffding, alpha 0.05)."""

ALPHA = 0.05
D_RANGE = (-1.0, 1.0)  # treatment minus baseline accuracy, bounds [0, 1]
RULE = DecisionRule(
    alpha=ALPHA,
    method="paired_hoeffding",
    criteria=[
        Criterion(
            id="primary",
            metric="accuracy",
            weights={"treatment": 1, "baseline": -1},
            margin=0.0,
            bounds=[0, 1],
        )
    ],
)


def _draw_counts(rng, n: int, d: float, effect: float, reps: int) -> np.ndarray:
    """reps x (wins, losses, ties) under the discordance model."""
    p = [(d + effect) / 2, (d - effect) / 2, 1 - d]
    return rng.multinomial(n, p, size=reps)


def _simulated_power(n: int, d: float, effect: float, reps: int, seed: int, seeds: int = 1):
    """Share of simulated evaluations the rule validates; S seed pairs per item are independent,
    so the per-item mean over seeds sums to (wins - losses) / (n S)."""
    rng = np.random.default_rng(seed)
    counts = _draw_counts(rng, n * seeds, d, effect, reps)
    estimate = (counts[:, 0] - counts[:, 1]) / (n * seeds)
    validated = estimate - hoeffding_half_width(2.0, n, ALPHA) > 0.0
    return float(validated.mean()), counts


def _items(rng, n: int, d: float, effect: float) -> tuple[np.ndarray, np.ndarray]:
    """One simulated evaluation: per-item 0/1 outcomes of treatment and baseline."""
    kind = rng.choice(3, size=n, p=[(d + effect) / 2, (d - effect) / 2, 1 - d])
    agree = rng.integers(0, 2, size=n)  # on a tie both are right or both wrong
    treatment = np.where(kind == 0, 1, np.where(kind == 1, 0, agree))
    baseline = np.where(kind == 0, 0, np.where(kind == 1, 1, agree))
    return treatment.astype(float), baseline.astype(float)


def _tolerance(p: float, reps: int, slack: float = 0.0) -> float:
    return 4 * math.sqrt(p * (1 - p) / reps) + slack


def test_vectorised_rule_is_the_decision_rule() -> None:
    # the simulations below decide by mean(D) - h > 0; decide() must say the same word
    rng = np.random.default_rng(7)
    threshold = hoeffding_half_width(2.0, 150, ALPHA)
    words = []
    for _ in range(60):
        t, b = _items(rng, 150, 0.4, 0.15)
        verdict = decide(RULE, {"treatment": {"accuracy": t}, "baseline": {"accuracy": b}})
        expected = "validated" if (t - b).mean() > threshold else None
        assert (verdict.verdict == "validated") == (expected == "validated")
        words.append(verdict.verdict)
    assert "validated" in words and "inconclusive" in words  # both sides of the threshold seen


@pytest.mark.parametrize(
    ("n", "d", "effect"),
    [
        (1319, 0.15, 0.0835),  # the user's plan near its MDE
        (1319, 0.15, 0.0748),  # at the threshold: about half
        (200, 0.3, 0.15),
        (64, 0.5625, 0.40),  # the demo's n and measured discordance
    ],
)
def test_exact_power_matches_simulation(n: int, d: float, effect: float) -> None:
    reps = 20_000
    simulated, _ = _simulated_power(n, d, effect, reps, seed=n)
    exact = exact_power(effect, d, n, ALPHA, D_RANGE, 0.0)
    assert abs(simulated - exact) < _tolerance(exact, reps)


def test_mde_has_80_percent_power_in_simulation_on_the_users_plan() -> None:
    plan = load_plan(SEED_PLAN)
    n = plan.eval.n_examples
    (power,) = rule_power(plan.decision_rule, n)
    assert power.discordance == DEFAULT_DISCORDANCE and power.discordance_source.startswith(
        "assumed"
    )
    # the half-width is the plan text's "roughly a 7.5-point gap": 2 sqrt(ln(40) / 2638) = 0.0748
    assert power.half_width == pytest.approx(2 * math.sqrt(math.log(40) / (2 * 1319)))
    reps = 20_000
    simulated, _ = _simulated_power(n, DEFAULT_DISCORDANCE, power.mde, reps, seed=1)
    assert abs(simulated - 0.8) < _tolerance(0.8, reps)
    # ... but a true gap of that size is validated about half the time, not 80%
    at_threshold, _ = _simulated_power(n, DEFAULT_DISCORDANCE, power.threshold, reps, seed=2)
    assert abs(at_threshold - 0.5) < 0.03  # exact (3) puts it at 0.48-0.50 (discreteness)
    assert power.mde > power.threshold + 0.005
    # the normal closed form (2) agrees with the exact MDE to 2e-4 at this n (~198 discordant)
    normal = mde_normal(n, ALPHA, D_RANGE, 0.0, discordance=DEFAULT_DISCORDANCE)
    assert abs(normal - power.mde) < 2e-4


def test_any_distribution_mde_bounds_every_discordance() -> None:
    n = 1319
    worst = mde_normal(n, ALPHA, D_RANGE, 0.0)
    exacts = [mde_exact(n, ALPHA, D_RANGE, 0.0, d) for d in (0.1, 0.2, 0.4, 0.7, 1.0)]
    assert all(e is not None and e <= worst for e in exacts)
    assert exacts == sorted(exacts)  # the MDE grows with discordance
    # Bhatia-Davis's variance bound is attained by D in {-1, +1} only, i.e. d = 1
    reps = 20_000
    simulated, _ = _simulated_power(n, 1.0, worst, reps, seed=3)
    assert abs(simulated - 0.8) < _tolerance(0.8, reps, slack=0.01)


def test_no_mde_when_discordance_is_below_the_threshold() -> None:
    # d = 0.05: even every discordant item a win gives E[D] = 0.05 < h = 0.0748
    assert mde_exact(1319, ALPHA, D_RANGE, 0.0, 0.05) is None
    assert mde_normal(1319, ALPHA, D_RANGE, 0.0, discordance=0.05) is None
    reps = 5_000
    simulated, _ = _simulated_power(1319, 0.05, 0.05, reps, seed=4)
    assert simulated < 0.01
    result = criterion_power(RULE.criteria[0], 1319, ALPHA, discordance=0.05)
    assert result.mde is None and "no effect reaches 80% power" in result.lines()[0]


def test_seeds_shrink_the_mde_towards_but_never_below_the_threshold() -> None:
    n, d = 200, 0.3
    threshold = hoeffding_half_width(2.0, n, ALPHA)
    mdes = [mde_exact(n, ALPHA, D_RANGE, 0.0, d, seeds=s) for s in (1, 2, 3, 10, 100)]
    assert mdes == sorted(mdes, reverse=True)
    assert all(m > threshold for m in mdes)
    reps = 20_000
    simulated, _ = _simulated_power(n, d, mdes[2], reps, seed=5, seeds=3)
    assert abs(simulated - 0.8) < _tolerance(0.8, reps)


def test_three_seed_simulation_through_decide_over_seeds() -> None:
    # the seed path of the real rule (per-item means over seeds) validates as often as (3) says
    n, d, seeds, reps = 200, 0.3, 3, 150
    effect = mde_exact(n, ALPHA, D_RANGE, 0.0, d, seeds=seeds)
    rng = np.random.default_rng(6)
    ids = [str(i) for i in range(n)]
    hits = 0
    for _ in range(reps):
        per_seed = {}
        for s in range(seeds):
            t, b = _items(rng, n, d, effect)
            per_seed[s] = PairedOutcomes.from_arrays(
                {"treatment": {"accuracy": t}, "baseline": {"accuracy": b}}, item_ids=ids
            )
        hits += decide_over_seeds(RULE, per_seed)["verdict"] == "validated"
    assert abs(hits / reps - 0.8) < _tolerance(0.8, reps)


def test_items_to_settle_gives_80_percent_power_in_simulation() -> None:
    effect, d = 0.05, 0.2
    sd = math.sqrt(d - effect**2)  # Var(D) = E[D^2] - delta^2 = d - delta^2
    need = items_to_settle(effect, sd, ALPHA, D_RANGE, 0.0)
    # (4): sqrt(n) * 0.05 = 2 sqrt(ln(40) / 2) + 0.8416 sd -> n = 4,631 (ceil)
    z = 0.8416212335729143
    assert need == math.ceil(((2 * math.sqrt(math.log(40) / 2) + z * sd) / effect) ** 2)
    reps = 20_000
    simulated, _ = _simulated_power(need, d, effect, reps, seed=8)
    assert abs(simulated - 0.8) < _tolerance(0.8, reps, slack=0.01)
    assert items_to_settle(0.0, sd, ALPHA, D_RANGE, 0.0) is None


def test_mcnemar_mde_matches_simulated_exact_mcnemar() -> None:
    from losslab.stats.paired import mcnemar_exact

    n, d = 1319, DEFAULT_DISCORDANCE
    effect = mde_mcnemar(n, ALPHA, d, 1.0)
    assert mcnemar_power(effect, d, n, ALPHA, 1.0) == pytest.approx(0.8)
    rng = np.random.default_rng(9)
    reps = 1_000
    hits = 0
    for wins, losses, _ in _draw_counts(rng, n, d, effect, reps):
        treatment = np.r_[np.ones(wins), np.zeros(losses), np.zeros(n - wins - losses)]
        baseline = np.r_[np.zeros(wins), np.ones(losses), np.zeros(n - wins - losses)]
        result = mcnemar_exact(treatment, baseline, ALPHA)
        hits += result.p_value < ALPHA and wins > losses
    # approximation (5) ignores the discreteness of the exact test: 0.02 slack
    assert abs(hits / reps - 0.8) < _tolerance(0.8, reps, slack=0.02)


def test_inconclusive_verdict_states_the_items_that_would_settle_it() -> None:
    rng = np.random.default_rng(10)
    t, b = _items(rng, 300, 0.3, 0.04)
    verdict = decide(RULE, {"treatment": {"accuracy": t}, "baseline": {"accuracy": b}})
    assert verdict.verdict == "inconclusive"
    record = verdict.to_dict()
    settle = record["to_settle"]
    d_N = t - b
    expected = items_to_settle(d_N.mean(), d_N.std(ddof=1), ALPHA, D_RANGE, 0.0)
    assert settle["n_items"] == expected and settle["seeds"] is None
    assert f"n >= {expected} test items" in record["statement"]
    assert "More training seeds would not settle it" in record["statement"]
    # the keys the record had before stay as they were
    for key in ("verdict", "criterion", "estimate", "ci", "half_width", "method", "statement"):
        assert key in record


def test_decided_verdict_has_no_to_settle() -> None:
    t = np.ones(400)
    b = np.zeros(400)
    record = decide(RULE, {"treatment": {"accuracy": t}, "baseline": {"accuracy": b}}).to_dict()
    assert record["verdict"] == "validated" and record["to_settle"] is None


def test_plan_show_prints_the_mde_line() -> None:
    from typer.testing import CliRunner

    from losslab.cli import app

    (power,) = rule_power(load_plan(SEED_PLAN).decision_rule, 1319)
    result = CliRunner().invoke(app, ["plan", "show", str(SEED_PLAN)])
    assert result.exit_code == 0, result.output
    assert f"minimum detectable effect {power.mde:.4f} at discordance 0.15" in result.output
    assert f"{power.mde_any_distribution:.4f} at any discordance" in result.output


def test_bad_power_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="discordance must lie in"):
        mde_exact(100, ALPHA, D_RANGE, 0.0, 0.0)
    with pytest.raises(ValueError, match="power must lie in"):
        mde_normal(100, ALPHA, D_RANGE, 0.0, power=1.5)
    with pytest.raises(ValueError, match="impossible at discordance"):
        exact_power(0.5, 0.2, 100, ALPHA, D_RANGE, 0.0)
    with pytest.raises(ValueError, match="has no power model"):
        criterion_power(RULE.criteria[0], 100, ALPHA, method="bootstrap")


def test_multi_seed_inconclusive_record_says_seeds_cannot_settle_it() -> None:
    rng = np.random.default_rng(11)
    ids = [str(i) for i in range(300)]
    per_seed = {}
    for s in (0, 1):
        t, b = _items(rng, 300, 0.3, 0.03)
        per_seed[s] = PairedOutcomes.from_arrays(
            {"treatment": {"accuracy": t}, "baseline": {"accuracy": b}}, item_ids=ids
        )
    record = decide_over_seeds(RULE, per_seed)
    assert record["verdict"] == "inconclusive"
    # the deciding D is the per-item mean over the 2 seeds: (4) with its sd, n = 300 items
    d_N = np.mean(
        [
            o.values["treatment"]["accuracy"] - o.values["baseline"]["accuracy"]
            for o in per_seed.values()
        ],
        axis=0,
    )
    expected = items_to_settle(d_N.mean(), d_N.std(ddof=1), ALPHA, D_RANGE, 0.0)
    assert record["to_settle"]["n_items"] == expected
    assert record["statement"].startswith("2 training seeds (0, 1)")
    assert "More training seeds would not settle it" in record["statement"]
