"""Decision: the plan's pre-registered rule on the paired evaluation rows -> verdict.json."""

from __future__ import annotations

from losslab.checks import PhaseResult
from losslab.runner.artifacts import read_rows
from losslab.runner.protocols import PhaseContext
from losslab.stats.seeds import decision_phase


def run(ctx: PhaseContext) -> PhaseResult:
    sched, plan = ctx.schedule, ctx.comp.plan
    evals = {arm: read_rows(ctx.run_dir.eval_path(arm)) for arm in sched.arms}
    # several seeds: each trained unit is (plan arm, seed); one seed: the plan's arms themselves
    units = {u: (sched.plan_arm(u), sched.seeds[u]) for u in sched.arms} if sched.units else None
    return decision_phase(plan.decision_rule, evals, units=units, plan=plan)
