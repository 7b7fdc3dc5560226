"""Feasibility projection against hand-computed phase times."""

from __future__ import annotations

from pathlib import Path

import pytest

from losslab.plan import load_plan
from losslab.stats import StepTimings, feasibility_phase, project_feasibility

SEED_PLAN = Path(__file__).resolve().parents[2] / "examples" / "gsm8k_dppo_vs_grpo.json"


def test_fits_budget_by_hand() -> None:
    # pilot 5 x (30 + 2 x 10) = 250 s; per arm 50 x 30 + 100 x 10 = 2500 s train, 1319 x 0.4 =
    # 527.6 s eval; the base model's eval 527.6 s once; wall = 250 + 527.6 + 2 x 3027.6 =
    # 6832.8 s = 113.9 min <= 120; 6832.8 / 3600 = 1.898 GPU-h <= 2
    fc = project_feasibility(
        StepTimings(sample_s=30, train_s=10, eval_s_per_item=0.4), load_plan(SEED_PLAN)
    )
    assert fc.status == "pass" and fc.problems == []
    assert fc.wall_seconds == pytest.approx(6832.8)
    assert fc.gpu_hours == pytest.approx(6832.8 / 3600)
    assert fc.phases["pilot"]["seconds"] == pytest.approx(250)
    assert fc.phases["train:dppo_seed0"]["seconds"] == pytest.approx(2500)
    assert fc.phases["eval:grpo_seed0"]["seconds"] == pytest.approx(527.6)
    assert fc.phases["eval:base model"] == {"items": 1319, "seconds": pytest.approx(527.6)}


def test_every_seed_is_counted() -> None:
    # decision_rule.seeds [0, 1]: four trained units (each arm at seed 0 and at seed 1), each
    # 2500 + 527.6 = 3027.6 s, plus the base model's 527.6 s; the pilot is reused:
    # wall = 527.6 + 4 x 3027.6 = 12638 s = 210.6 min, over the 120-min budget (one seed: 6583.6 s)
    plan = load_plan(SEED_PLAN)
    plan.decision_rule.seeds = [0, 1]
    fc = project_feasibility(StepTimings(30, 10, 0.4, pilot_reused=True), plan)
    trained = sorted(k for k in fc.phases if k.startswith("train:"))
    assert trained == [
        "train:dppo_seed0",
        "train:dppo_seed0.seed1",
        "train:grpo_seed0",
        "train:grpo_seed0.seed1",
    ]
    assert fc.phases["train:grpo_seed0.seed1"]["seed"] == 1
    assert fc.wall_seconds == pytest.approx(12638)
    assert fc.status == "fail" and "210.6 min" in fc.problems[0]


def test_over_budget_lists_each_limit() -> None:
    # sample 40 s: pilot 5 x 60 = 300; base eval 659.5; arm 2000 + 1000 + 659.5 = 3659.5;
    # wall 300 + 659.5 + 7319 = 8278.5 s = 138.0 min > 120, and 8278.5 / 3600 = 2.30 GPU-h > 2
    fc = project_feasibility(StepTimings(40, 10, 0.5), load_plan(SEED_PLAN))
    assert fc.status == "fail"
    assert fc.wall_seconds == pytest.approx(8278.5)
    assert fc.problems == [
        "projected wall time 138.0 min exceeds budget.max_wall_minutes 120",
        "projected 2.30 GPU-hours exceeds budget.gpu_hours 2",
    ]


def test_parallel_arms_and_known_hours() -> None:
    # parallel: wall = 250 + 659.5 (base) + 3159.5; GPU-hours still count both arms:
    # 2 GPUs x (250 + 659.5 + 2 x 3159.5) = 2 x 7228.5 s
    fc = project_feasibility(
        StepTimings(30, 10, 0.5, gpus=2, parallel_arms=True, measured_s=1800), load_plan(SEED_PLAN)
    )
    assert fc.wall_seconds == pytest.approx(4069)
    assert fc.gpu_hours == pytest.approx(2 * 7228.5 / 3600)
    assert fc.known_gpu_hours == pytest.approx(1.0)  # 2 GPUs x 1800 s


def test_reused_pilot_is_not_counted_twice() -> None:
    # Same timings as test_fits_budget_by_hand, but the treatment arm continues from the pilot:
    # wall = 527.6 + 2 x 3027.6 = 6582.8 s (the 250 s pilot is inside the treatment arm's 2500 s)
    fc = project_feasibility(
        StepTimings(sample_s=30, train_s=10, eval_s_per_item=0.4, pilot_reused=True),
        load_plan(SEED_PLAN),
    )
    assert fc.wall_seconds == pytest.approx(6582.8)
    assert fc.gpu_hours == pytest.approx(6582.8 / 3600)
    assert fc.phases["pilot"]["seconds"] == pytest.approx(250)
    assert fc.phases["pilot"]["reused_by_treatment_arm"] is True


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_bad_timings_are_named(bad: float) -> None:
    with pytest.raises(ValueError, match="timings.train_s must be finite and >= 0"):
        StepTimings(1.0, bad, 0.1)


def test_phase_checks_each_budget_limit_and_honours_required() -> None:
    # the over-budget timings above: 138.0 min > 120 and 2.30 GPU-h > 2, one failed row each
    plan = load_plan(SEED_PLAN)
    result = feasibility_phase(StepTimings(40, 10, 0.5), plan)
    assert [(c.name, c.bound, c.passed) for c in result.checks] == [
        ("projected wall minutes", "<= 120", False),
        ("projected GPU-hours", "<= 2", False),
    ]
    assert result.checks[0].measured == pytest.approx(8278.5 / 60)
    assert result.record()["status"] == "fail" and result.record()["timings"]["sample_s"] == 40
    assert plan.feasibility_required and not result.passed
    assert feasibility_phase(StepTimings(30, 10, 0.4), plan).passed  # 113.9 min, 1.90 GPU-h
    lax = plan.model_copy(update={"feasibility_required": False})  # recorded, never stops
    relaxed = feasibility_phase(StepTimings(40, 10, 0.5), lax)
    assert relaxed.passed and len(relaxed.failures) == 2


def test_timings_from_pilot_rows() -> None:
    # two pilot steps: sample (3 + 1 snapshot, 5) -> 4.5 s per rollout step; forward_backward +
    # optim (1 + 0.5, 2 + 0.5) = 4 s over 2 steps x 2 updates -> 1 s per optim step
    rows = [
        {"time/sample_s": 3.0, "time/snapshot_s": 1.0, "time/forward_backward_s": 1.0,
         "time/optim_s": 0.5},
        {"time/sample_s": 5.0, "time/forward_backward_s": 2.0, "time/optim_s": 0.5},
    ]  # fmt: skip
    st = StepTimings.from_pilot(
        rows, updates_per_batch=2, eval_s_per_item=0.25, gpus=1.0, measured_s=12.0
    )
    assert (st.sample_s, st.train_s, st.eval_s_per_item) == (4.5, 1.0, 0.25)
    assert st.pilot_reused and st.measured_s == 12.0
