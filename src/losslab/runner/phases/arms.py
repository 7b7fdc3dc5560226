"""Both arms (one pair per seed), each to the plan's steps; the treatment arm continues from the
pilot's checkpoint instead of redoing its steps."""

from __future__ import annotations

from losslab.checks import PhaseResult
from losslab.runner.protocols import PhaseContext


def run(ctx: PhaseContext) -> PhaseResult:
    sched = ctx.schedule
    ctx.log(f"arms: {len(sched.arms)} arms x {sched.steps} steps")
    for arm in sched.arms:
        ctx.train(arm, until=sched.steps)
    return PhaseResult({}, summary=f"{len(sched.arms)} arms x {sched.steps} steps")
