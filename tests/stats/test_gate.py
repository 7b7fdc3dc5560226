"""Activation gate: measured pilot metrics against the seed plan's checks."""

from __future__ import annotations

import math
from pathlib import Path

from losslab.plan import ActivationGate, load_plan
from losslab.stats import evaluate_gate

SEED_PLAN = Path(__file__).resolve().parents[2] / "examples" / "gsm8k_dppo_vs_grpo.json"
PASSING = {
    "dppo_masked_token_fraction": 0.02,
    "policy_drift_abs_p_q90": 0.01,
    "grpo_clip_fraction": 0.004,
    "executed_updates_per_batch": 2,
    "executed_base_model": "Qwen/Qwen3.5-2B",
    "reward/mean": 0.4,  # extra pilot metrics are ignored
}


def _gate() -> ActivationGate:
    gate = load_plan(SEED_PLAN).activation_gate
    assert gate is not None
    return gate


def test_all_pass() -> None:
    result = evaluate_gate(_gate(), PASSING)
    assert result.passed and result.applicable
    assert [c.bound for c in result.checks] == [
        "[0.001, 0.3]",
        ">= 0.005",
        ">= 0.0005",
        "[2, 2]",
        "one of ['Qwen/Qwen3.5-2B']",
    ]


def test_each_failure_names_value_and_bound() -> None:
    measured = dict(
        PASSING,
        dppo_masked_token_fraction=0.5,  # above max 0.3: the mask dominates
        policy_drift_abs_p_q90=math.nan,
        executed_updates_per_batch=1,  # one update per batch: ratio == 1, nothing fires
        executed_base_model="Qwen/Qwen3-8B",
    )
    del measured["grpo_clip_fraction"]
    result = evaluate_gate(_gate(), measured)
    assert not result.passed
    reasons = {c.name: c.note for c in result.failures}
    assert reasons == {
        "dppo_masked_token_fraction": "0.5 > max 0.3",
        "policy_drift_abs_p_q90": "measured NaN",
        "grpo_clip_fraction": "not measured by the pilot",
        "executed_updates_per_batch": "1 < min 2",
        "executed_base_model": "'Qwen/Qwen3-8B' is not one of ['Qwen/Qwen3.5-2B']",
    }


def test_bounds_are_inclusive() -> None:
    result = evaluate_gate(_gate(), dict(PASSING, dppo_masked_token_fraction=0.3))
    assert result.passed


def test_not_applicable_gate_passes() -> None:
    gate = _gate().model_copy(update={"applicable": False})
    result = evaluate_gate(gate, {})
    assert result.passed and not result.applicable and result.checks == ()


def test_numeric_one_of_and_record_shape() -> None:
    gate = ActivationGate.model_validate(
        {"checks": [{"metric": "executed_updates_per_batch", "one_of": [2]}]}
    )
    assert evaluate_gate(gate, {"executed_updates_per_batch": 2.0}).passed
    record = evaluate_gate(gate, {"executed_updates_per_batch": 3}).record()
    assert record["passed"] is False
    assert record["checks"][0]["measured"] == 3 and record["checks"][0]["bound"] == "one of [2]"
    assert record["checks"][0]["check"] == "executed_updates_per_batch"
    assert record["failures"] == record["checks"] and record["metrics"] == {
        "executed_updates_per_batch": 3
    }
