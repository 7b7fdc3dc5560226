"""Feasibility: the full run's wall time and GPU-hours projected from the pilot's timings."""

from __future__ import annotations

from losslab.checks import PhaseResult
from losslab.runner.protocols import PhaseContext
from losslab.stats.feasibility import StepTimings, feasibility_phase


def run(ctx: PhaseContext) -> PhaseResult:
    comp, pilot = ctx.comp, ctx.record("pilot")
    timings = StepTimings.from_pilot(
        ctx.pilot_rows(),
        updates_per_batch=comp.plan.updates_per_batch,
        eval_s_per_item=pilot.get("eval_s_per_item"),
        gpus=comp.backend_impl.gpus(),
        measured_s=pilot.get("seconds"),
    )
    result = feasibility_phase(timings, comp.plan)
    # the plan-only projection (stats.cost) beside the pilot's measured one
    cost = comp.cost_beside_pilot(result.artifact["wall_seconds"], result.artifact["gpu_hours"])
    return result.with_facts(cost_projection=cost)
