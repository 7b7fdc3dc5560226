"""Activation gate: does the treatment loss act in this regime? Measured on the pilot's rows."""

from __future__ import annotations

from losslab.checks import PhaseResult
from losslab.engine import pilot_metrics
from losslab.runner.errors import RunError
from losslab.runner.protocols import PhaseContext
from losslab.stats.gate import NOT_APPLICABLE, evaluate_gate


def run(ctx: PhaseContext) -> PhaseResult:
    comp = ctx.comp
    # gate_for: a run that executes engine.local_base_model instead of the served base model
    # (Backend.executes_local_base_model) must accept it in executed_base_model
    gate = comp.plan.gate_for(comp.base_model)
    if gate is None or not gate.applicable:
        return PhaseResult.not_applicable(NOT_APPLICABLE)
    update = comp.plan.updates_per_batch
    executed = ctx.executed(ctx.schedule.treatment)
    model = str(executed.get("base_model", {}).get("executed") or "")
    try:
        metrics = pilot_metrics(
            ctx.pilot_rows(), comp.plan.gate_metrics(), base_model=model, update=update
        )
    except KeyError as e:
        raise RunError(f"the pilot did not log what the gate needs: {e}") from e
    return evaluate_gate(gate, metrics, measured_at_update=update)
