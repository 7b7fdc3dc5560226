"""Feasibility: project a plan's wall time and GPU-hours from measured per-step timings.

    pilot   = pilot_steps * (sample_s + updates_per_batch * train_s)       (treatment arm)
    train_u = rollout_steps * sample_s + steps * train_s                  (each trained unit)
    eval_u  = eval.n_examples * eval_s_per_item                           (each trained unit)
    base    = eval.n_examples * eval_s_per_item                 (the initial policy, evaluated once)
    wall    = pilot + base + sum_u (train_u + eval_u)   (one after the other; max_u when parallel)
    gpu_hours = gpus * (pilot + base + sum_u (train_u + eval_u)) / 3600

A trained unit is one (arm, seed) pair: with several seeds in `decision_rule.seeds` every arm is
trained once per seed (`training_units`, the runner's `seed_schedule` names them the same way),
so a 2-seed plan costs four arms' training and evaluation, not two.

With `pilot_reused` (the runner continues the treatment arm from the pilot's checkpoint) the pilot
steps are part of that arm's training and are not counted a second time: pilot = 0 in the sums.

The result has the plan's `feasibility_check` form; status `pass` when both projections fit the
budget, `fail` otherwise, with one problem line per exceeded limit. `feasibility_phase` is the
run's phase: that projection from the pilot's timings, one `Check` per budget limit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from losslab.checks import Check, PhaseResult
from losslab.plan import FeasibilityCheck, Plan

PROJECTION_NOTE = (
    "the pilot's steps count once, inside the treatment arm that continues from them; the base "
    "model's evaluation and every seed's arms are counted; preflights, model loading and the "
    "report are not projected"
)


@dataclass(frozen=True)
class StepTimings:
    """Measured seconds (e.g. from the pilot) that the projection scales up."""

    sample_s: float
    """Seconds per rollout step: sampling groups_per_batch x group_size completions."""
    train_s: float
    """Seconds per optim step: one minibatch forward_backward plus optim_step."""
    eval_s_per_item: float
    """Seconds per evaluation item (greedy answer plus grading)."""
    gpus: float = 1.0
    """Accelerators held while running; 0 for a remote service that does not bill GPU-hours here."""
    parallel_arms: bool = False
    """Arms run at the same time (wall time is the slower arm; GPU-hours still add up)."""
    measured_s: float = 0.0
    """Seconds already spent measuring these timings (counted as known GPU-hours)."""
    pilot_reused: bool = False
    """The pilot is the treatment arm's first steps and that arm continues from it, so the pilot
    costs nothing on top of the arms. Leave False when the pilot is a separate run."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("parallel_arms", "pilot_reused"):
                continue
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise ValueError(f"timings.{f.name} must be a number, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"timings.{f.name} must be finite and >= 0, got {value!r}")

    @classmethod
    def from_pilot(
        cls,
        rows: Sequence[Mapping[str, Any]],
        *,
        updates_per_batch: int,
        eval_s_per_item: float | None,
        gpus: float,
        measured_s: float | None,
    ) -> StepTimings:
        """Mean timings of the pilot's metrics rows (the engine's `time/*` keys; an optim step
        is one of `updates_per_batch` per rollout step), for a pilot the treatment arm reuses."""
        n = max(len(rows), 1)
        sample_s = sum(r.get("time/sample_s", 0.0) + r.get("time/snapshot_s", 0.0) for r in rows)
        train_s = sum(
            r.get("time/forward_backward_s", 0.0) + r.get("time/optim_s", 0.0) for r in rows
        )
        return cls(
            sample_s=sample_s / n,
            train_s=train_s / n / updates_per_batch,
            eval_s_per_item=float(eval_s_per_item or 0.0),
            gpus=gpus,
            measured_s=float(measured_s or 0.0),
            pilot_reused=True,
        )


BASE_EVAL = "eval:base model"
"""The phase key of the initial policy's evaluation (the runner's `eval_base_model.jsonl`)."""


def training_units(plan: Plan) -> list[tuple[str, str, int]]:
    """(unit, plan arm, seed) of every arm the run trains: the plan's arms at their own seed,
    and with several `decision_rule.seeds` one per (seed, arm), seed-major; a plan arm keeps its
    name at its own seed and is `<arm>.seed<s>` at every other one."""
    seeds = list(dict.fromkeys(plan.decision_rule.seeds))
    if len(seeds) <= 1:
        return [(a.name, a.name, a.seed) for a in plan.arms]
    return [
        (a.name if s == a.seed else f"{a.name}.seed{s}", a.name, s)
        for s in seeds
        for a in plan.arms
    ]


def project_feasibility(timings: StepTimings, plan: Plan) -> FeasibilityCheck:
    """Project the plan's cost from measured timings and compare it with `plan.budget`: the
    pilot, the base model's evaluation and every trained unit (each arm at each seed)."""
    upb = plan.updates_per_batch
    pilot_s = plan.engine.pilot_steps * (timings.sample_s + upb * timings.train_s)
    phases: dict[str, dict[str, float | bool]] = {
        "pilot": {"steps": plan.engine.pilot_steps, "seconds": pilot_s},
    }
    if timings.pilot_reused:
        phases["pilot"]["reused_by_treatment_arm"] = True
        pilot_s = 0.0
    eval_s = plan.eval.n_examples * timings.eval_s_per_item
    phases[BASE_EVAL] = {"items": plan.eval.n_examples, "seconds": eval_s}
    arm_seconds = []
    for unit, _, seed in training_units(plan):
        train_s = plan.rollout_steps * timings.sample_s + plan.steps * timings.train_s
        phases[f"train:{unit}"] = {
            "seed": seed,
            "rollout_steps": plan.rollout_steps,
            "optim_steps": plan.steps,
            "sample_seconds": plan.rollout_steps * timings.sample_s,
            "train_seconds": plan.steps * timings.train_s,
            "seconds": train_s,
        }
        phases[f"eval:{unit}"] = {"items": plan.eval.n_examples, "seconds": eval_s}
        arm_seconds.append(train_s + eval_s)
    fixed_s = pilot_s + eval_s  # the base model is evaluated once, before the arms' checkpoints
    busy_s = fixed_s + sum(arm_seconds)
    wall_s = fixed_s + (max(arm_seconds) if timings.parallel_arms else sum(arm_seconds))
    gpu_hours = timings.gpus * busy_s / 3600.0
    problems = []
    budget = plan.budget
    if budget.max_wall_minutes is not None and wall_s > budget.max_wall_minutes * 60:
        problems.append(
            f"projected wall time {wall_s / 60:.1f} min exceeds budget.max_wall_minutes "
            f"{budget.max_wall_minutes:g}"
        )
    if budget.gpu_hours is not None and gpu_hours > budget.gpu_hours:
        problems.append(
            f"projected {gpu_hours:.2f} GPU-hours exceeds budget.gpu_hours {budget.gpu_hours:g}"
        )
    return FeasibilityCheck(
        status="fail" if problems else "pass",
        problems=problems,
        wall_seconds=wall_s,
        gpu_hours=gpu_hours,
        known_gpu_hours=timings.gpus * timings.measured_s / 3600.0,
        phases=phases,
    )


def feasibility_phase(timings: StepTimings, plan: Plan) -> PhaseResult:
    """The run's feasibility check: `project_feasibility` as the artifact (with the timings it
    scaled), one `Check` per limit the plan's `budget` sets. A plan whose
    `feasibility_check.required` is false records an exceeded budget without stopping."""
    fc = project_feasibility(timings, plan)
    budget = plan.budget
    checks = []
    if budget.max_wall_minutes is not None:
        checks.append(
            Check(
                "projected wall minutes",
                fc.wall_seconds / 60,
                f"<= {budget.max_wall_minutes:g}",
                passed=fc.wall_seconds <= budget.max_wall_minutes * 60,
            )
        )
    if budget.gpu_hours is not None:
        checks.append(
            Check(
                "projected GPU-hours",
                fc.gpu_hours,
                f"<= {budget.gpu_hours:g}",
                passed=fc.gpu_hours <= budget.gpu_hours,
            )
        )
    artifact = {
        **fc.model_dump(),
        "projected_wall_seconds": fc.wall_seconds,
        "timings": asdict(timings),
        "note": PROJECTION_NOTE,
    }
    return PhaseResult(artifact, checks=checks, required=plan.feasibility_required)
