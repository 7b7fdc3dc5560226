"""Generation audit: train/test overlap against the plan's bound, one score per test item in
every evaluation file (`losslab.tasks.audit`); generation_audit.json."""

from __future__ import annotations

from losslab.checks import PhaseResult
from losslab.runner.artifacts import read_rows
from losslab.runner.protocols import PhaseContext
from losslab.runner.rundir import BASE_MODEL
from losslab.tasks.audit import generation_audit


def run(ctx: PhaseContext) -> PhaseResult:
    comp, plan = ctx.comp, ctx.comp.plan
    audit = plan.generation_audit
    test = list(comp.task.test[: plan.eval.n_examples])  # the items the evaluation scored
    evals = {BASE_MODEL: read_rows(ctx.run_dir.base_eval_path)}
    evals.update({arm: read_rows(ctx.run_dir.eval_path(arm)) for arm in ctx.schedule.arms})
    return generation_audit(
        comp.task.train,
        test,
        evals,
        max_eval_overlaps=audit.max_eval_overlaps if audit else None,
        required=bool(audit and audit.required),
    )
