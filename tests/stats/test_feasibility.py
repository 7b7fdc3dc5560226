"""Feasibility projection against hand-computed phase times."""

from __future__ import annotations

from pathlib import Path

import pytest

from losslab.plan import load_plan
from losslab.stats import StepTimings, feasibility_phase, project_feasibility

SEED_PLAN = Path(__file__).resolve().parents[2] / "examples" / "gsm8k_dppo_vs_grpo.json"


def test_fits_budget_by_hand() -> None:
    # pilot 5 x (30 + 2 x 10) = 250 s; per arm 50 x 30 + 100 x 10 = 2500 s train, 1319 x 0.5 =
    # 659.5 s eval; wall = 250 + 2 x 3159.5 = 6569 s = 109.5 min <= 120; 6569 / 3600 = 1.8247 GPU-h
    fc = project_feasibility(
        StepTimings(sample_s=30, train_s=10, eval_s_per_item=0.5), load_plan(SEED_PLAN)
    )
    assert fc.status == "pass" and fc.problems == []
    assert fc.wall_seconds == pytest.approx(6569)
    assert fc.gpu_hours == pytest.approx(6569 / 3600)
    assert fc.phases["pilot"]["seconds"] == pytest.approx(250)
    assert fc.phases["train:dppo_seed0"]["seconds"] == pytest.approx(2500)
    assert fc.phases["eval:grpo_seed0"]["seconds"] == pytest.approx(659.5)


def test_over_budget_lists_each_limit() -> None:
    # sample 40 s: pilot 5 x 60 = 300; arm 2000 + 1000 + 659.5 = 3659.5; wall 7619 s = 127.0 min
    # > 120, and 7619 / 3600 = 2.116 GPU-h > 2
    fc = project_feasibility(StepTimings(40, 10, 0.5), load_plan(SEED_PLAN))
    assert fc.status == "fail"
    assert fc.wall_seconds == pytest.approx(7619)
    assert fc.problems == [
        "projected wall time 127.0 min exceeds budget.max_wall_minutes 120",
        "projected 2.12 GPU-hours exceeds budget.gpu_hours 2",
    ]


def test_parallel_arms_and_known_hours() -> None:
    # parallel: wall = 250 + 3159.5; GPU-hours still count both arms: 2 GPUs x 6569 s
    fc = project_feasibility(
        StepTimings(30, 10, 0.5, gpus=2, parallel_arms=True, measured_s=1800), load_plan(SEED_PLAN)
    )
    assert fc.wall_seconds == pytest.approx(3409.5)
    assert fc.gpu_hours == pytest.approx(2 * 6569 / 3600)
    assert fc.known_gpu_hours == pytest.approx(1.0)  # 2 GPUs x 1800 s


def test_reused_pilot_is_not_counted_twice() -> None:
    # Same timings as test_fits_budget_by_hand, but the treatment arm continues from the pilot:
    # wall = 2 x 3159.5 = 6319 s (the 250 s pilot is inside the treatment arm's 2500 s of training)
    fc = project_feasibility(
        StepTimings(sample_s=30, train_s=10, eval_s_per_item=0.5, pilot_reused=True),
        load_plan(SEED_PLAN),
    )
    assert fc.wall_seconds == pytest.approx(6319)
    assert fc.gpu_hours == pytest.approx(6319 / 3600)
    assert fc.phases["pilot"]["seconds"] == pytest.approx(250)
    assert fc.phases["pilot"]["reused_by_treatment_arm"] is True


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_bad_timings_are_named(bad: float) -> None:
    with pytest.raises(ValueError, match="timings.train_s must be finite and >= 0"):
        StepTimings(1.0, bad, 0.1)


def test_phase_checks_each_budget_limit_and_honours_required() -> None:
    # the over-budget timings above: 127.0 min > 120 and 2.116 GPU-h > 2, one failed row each
    plan = load_plan(SEED_PLAN)
    result = feasibility_phase(StepTimings(40, 10, 0.5), plan)
    assert [(c.name, c.bound, c.passed) for c in result.checks] == [
        ("projected wall minutes", "<= 120", False),
        ("projected GPU-hours", "<= 2", False),
    ]
    assert result.checks[0].measured == pytest.approx(7619 / 60)
    assert result.record()["status"] == "fail" and result.record()["timings"]["sample_s"] == 40
    assert plan.feasibility_required and not result.passed
    assert feasibility_phase(StepTimings(30, 10, 0.5), plan).passed  # 109.5 min, 1.82 GPU-h
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
