"""The decision rule on synthetic paired results, against hand computations."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from losslab.plan import DecisionRule, load_plan
from losslab.stats import PairedOutcomes, decide, verdict_word

from ._data import paired_counts

SEED_PLAN = Path(__file__).resolve().parents[2] / "examples" / "gsm8k_dppo_vs_grpo.json"


def rule(**overrides: Any) -> DecisionRule:
    criterion = {
        "id": "primary",
        "metric": "accuracy",
        "margin": 0.0,
        "bounds": [0, 1],
        "weights": {"treatment": 1, "baseline": -1},
    }
    criterion.update(overrides)
    return DecisionRule.model_validate(
        {"alpha": 0.05, "method": "paired_hoeffding", "criteria": [criterion]}
    )


def outcomes(n: int, b: int, c: int, both: int) -> dict[str, dict[str, np.ndarray]]:
    treat, base = paired_counts(n, b, c, both)
    return {"treatment": {"accuracy": treat}, "baseline": {"accuracy": base}}


# n = 200, b = 60, c = 10, both right on 80: treatment 140/200 = 0.70, baseline 90/200 = 0.45
# estimate (60 - 10) / 200 = 0.25; half = 2 * sqrt(ln 40 / 400) = 2 * 0.0960323 = 0.1920646
HALF_200 = 2 * math.sqrt(math.log(40) / 400)


def test_validated_by_hand() -> None:
    v = decide(rule(), outcomes(200, b=60, c=10, both=80))
    assert HALF_200 == pytest.approx(0.1920646, abs=1e-7)
    assert v.verdict == "validated"
    assert v.primary.estimate == pytest.approx(0.25)
    assert v.primary.ci == pytest.approx([0.25 - 0.1920646, 0.25 + 0.1920646], abs=1e-7)
    assert v.primary.arm_means == pytest.approx({"treatment": 0.70, "baseline": 0.45})
    assert v.primary.d_range == [-1.0, 1.0]


def test_refuted_by_hand() -> None:
    v = decide(rule(), outcomes(200, b=10, c=60, both=80))
    assert v.verdict == "refuted"
    assert v.primary.ci == pytest.approx([-0.25 - HALF_200, -0.25 + HALF_200])


def test_margin_makes_a_clear_gap_inconclusive() -> None:
    # CI [0.0579, 0.4421] contains the margin 0.1
    assert decide(rule(margin=0.1), outcomes(200, b=60, c=10, both=80)).verdict == "inconclusive"


def test_small_positive_gap_is_inconclusive_not_validated() -> None:
    """Seed-plan scale: +2.12 pp at n = 1319 is inside +-0.07479, so inconclusive, even though the
    secondary exact McNemar test (p = 0.018, peers.md §4.3) would call it significant."""
    v = decide(rule(), outcomes(1319, b=80, c=52, both=700))
    assert v.verdict == "inconclusive"
    assert v.primary.half_width == pytest.approx(0.0747894, abs=1e-7)
    mc = v.primary.secondary["mcnemar_exact"]
    assert (mc["b"], mc["c"]) == (80, 52)
    assert mc["p_value"] == pytest.approx(0.018, abs=5e-4)
    assert mc["ci"][0] > 0  # the secondary CI excludes 0; the verdict still does not change


def test_identical_arms() -> None:
    treat, _ = paired_counts(300, b=0, c=0, both=120)
    v = decide(rule(), {"treatment": {"accuracy": treat}, "baseline": {"accuracy": treat.copy()}})
    assert v.verdict == "inconclusive"
    assert v.primary.estimate == 0.0
    assert v.primary.secondary["mcnemar_exact"]["p_value"] == 1.0
    assert v.primary.secondary["paired_t"]["ci"] == [0.0, 0.0]


def test_one_item() -> None:
    v = decide(rule(), outcomes(1, b=1, c=0, both=0))
    assert v.verdict == "inconclusive"  # the CI is the whole range [-1, 1]
    assert v.primary.ci == [-1.0, 1.0]
    assert v.n == 1


def test_scaled_weights_and_non_binary_metric() -> None:
    # D = 2 * reward_t - 2 * reward_b with rewards in [0, 1]: range [-2, 2] (span 4)
    # rewards t = 0.8, b = 0.3 on every item -> D = 1.0; half = 4 * sqrt(3.688879 / 200) = 4 * 0.135810 = 0.543241
    r = rule(metric="reward", weights={"treatment": 2, "baseline": -2})
    n = 100
    v = decide(r, {"treatment": {"reward": [0.8] * n}, "baseline": {"reward": [0.3] * n}})
    assert v.primary.d_range == [-2.0, 2.0]
    assert v.primary.half_width == pytest.approx(4 * math.sqrt(math.log(40) / 200))
    assert v.primary.half_width == pytest.approx(0.543241, abs=1e-6)
    assert v.verdict == "validated"
    assert v.primary.secondary["mcnemar_exact"]["applicable"] is False


def test_two_criteria_any_refuted_refutes() -> None:
    # second criterion: treatment accuracy alone above 0.9: mean 0.70, half = sqrt(ln 40 / 400)
    # = 0.0960323 -> CI [0.604, 0.796] lies below 0.9 -> refuted, so the overall verdict is refuted
    r = DecisionRule.model_validate(
        {
            "alpha": 0.05,
            "method": "paired_hoeffding",
            "criteria": [
                {
                    "id": "gap",
                    "metric": "accuracy",
                    "weights": {"treatment": 1, "baseline": -1},
                    "bounds": [0, 1],
                    "margin": 0.0,
                },
                {
                    "id": "floor",
                    "metric": "accuracy",
                    "weights": {"treatment": 1},
                    "bounds": [0, 1],
                    "margin": 0.9,
                },
            ],
        }
    )
    v = decide(r, outcomes(200, b=60, c=10, both=80))
    assert [c.verdict for c in v.criteria] == ["validated", "refuted"]
    assert v.criteria[1].ci == pytest.approx([0.7 - 0.0960323, 0.7 + 0.0960323], abs=1e-7)
    assert v.verdict == "refuted"


def test_verdict_word_boundaries() -> None:
    assert verdict_word([0.0, 0.2], 0.0) == "inconclusive"  # lower bound must exceed the margin
    assert verdict_word([0.001, 0.2], 0.0) == "validated"
    assert verdict_word([-0.2, -0.001], 0.0) == "refuted"


def test_seed_plan_verdict_record() -> None:
    plan = load_plan(SEED_PLAN)
    treat, base = paired_counts(1319, b=60, c=10, both=800)
    records = {
        "dppo_seed0": [{"id": f"test-{i}", "correct": bool(x)} for i, x in enumerate(treat)],
        # the baseline's records come in another order: items pair by id, not by position
        "grpo_seed0": [{"id": f"test-{i}", "correct": bool(x)} for i, x in enumerate(base)][::-1],
    }
    v = decide(plan.decision_rule, PairedOutcomes.from_records(records), plan=plan)
    record = json.loads(json.dumps(v.to_dict()))
    # estimate (60 - 10) / 1319 = 0.0379075; half 0.0747894 -> CI [-0.0368819, 0.1126969]
    assert record["estimate"] == pytest.approx(50 / 1319)
    assert record["ci"] == pytest.approx([50 / 1319 - 0.0747894, 50 / 1319 + 0.0747894], abs=1e-7)
    assert record["verdict"] == "inconclusive"
    assert record["method"] == "paired_hoeffding" and record["n"] == 1319
    assert record["criterion"]["arms"] == {"treatment": "dppo_seed0", "baseline": "grpo_seed0"}
    assert set(record["secondary"]) == {"mcnemar_exact", "paired_t", "empirical_bernstein"}
    statement = record["statement"]
    for words in (
        "dppo_seed0",
        "grpo_seed0",
        "1319 items of GSM8K test",
        "+0.0379",
        "inconclusive",
        "fixed final checkpoints",
        "training seeds",
    ):
        assert words in statement


def test_records_must_pair() -> None:
    with pytest.raises(ValueError, match="scored different items"):
        PairedOutcomes.from_records(
            {"a": [{"id": 1, "correct": 1}], "b": [{"id": 2, "correct": 1}]}
        )
    with pytest.raises(ValueError, match="item '1': correct = None is not a number"):
        PairedOutcomes.from_records({"a": [{"id": 1, "correct": None}]})
    with pytest.raises(ValueError, match="appears twice"):
        PairedOutcomes.from_records({"a": [{"id": 1, "correct": 1}, {"id": 1, "correct": 0}]})


def test_values_outside_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match=r"outside the plan's bounds \[0.0, 1.0\]"):
        decide(rule(), {"treatment": {"accuracy": [2.0]}, "baseline": {"accuracy": [0.0]}})


def test_unknown_arm_is_refused() -> None:
    with pytest.raises(ValueError, match="the criterion weights name 'baseline'"):
        decide(rule(), {"treatment": {"accuracy": [1.0]}, "other": {"accuracy": [0.0]}})


def test_statement_names_every_criterion_when_several() -> None:
    r = DecisionRule.model_validate(
        {
            "alpha": 0.05,
            "method": "paired_hoeffding",
            "criteria": [
                {
                    "id": "gap",
                    "metric": "accuracy",
                    "weights": {"treatment": 1, "baseline": -1},
                    "bounds": [0, 1],
                },
                {
                    "id": "floor",
                    "metric": "accuracy",
                    "weights": {"treatment": 1},
                    "bounds": [0, 1],
                    "margin": 0.9,
                },
            ],
        }
    )
    v = decide(r, outcomes(200, b=60, c=10, both=80))
    assert "(gap: validated; floor: refuted); the overall verdict is refuted" in v.statement
