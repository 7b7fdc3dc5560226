"""Activation gate: does the treatment loss act in this regime? Measured on the pilot's rows."""

from __future__ import annotations

from losslab.checks import PhaseResult
from losslab.engine import mismatch_vs_drift, pilot_metrics
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
    rows, table = ctx.pilot_rows(), comp.plan.gate_metrics()
    try:
        metrics = pilot_metrics(rows, table, base_model=model, update=update)
    except KeyError as e:
        raise RunError(f"the pilot did not log what the gate needs: {e}") from e
    result = evaluate_gate(gate, metrics, measured_at_update=update)
    # beside each per-update gate metric: its value at update 1 (mismatch only) and which of
    # mismatch or drift made it act (pilot/diagnostics.json has the whole table)
    acted = {
        r["metric"]: {k: r[k] for k in ("mismatch_only", "mismatch_and_drift", "acted_because")}
        for r in mismatch_vs_drift(rows, table, update)
        if r["metric"] in table
    }
    return result.with_facts(mismatch_vs_drift=acted)
