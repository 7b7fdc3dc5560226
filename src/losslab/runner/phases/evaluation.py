"""Evaluation: the initial policy once, then each arm's final checkpoint, on the same test items.

Each arm's rows are written as soon as they exist (eval_<arm>.jsonl), so an interrupted
evaluation resumes at the first arm without an intact file.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from losslab.checks import PhaseResult
from losslab.engine import rows_accuracy
from losslab.runner.artifacts import read_rows
from losslab.runner.checkpoint import seed_everything
from losslab.runner.errors import RunError
from losslab.runner.protocols import PhaseContext, Schedule
from losslab.runner.rundir import BASE_MODEL, eval_file

EVAL_SEED_OFFSET = 1_000_003  # eval RNG stream differs from training's, same for every arm


def outputs(schedule: Schedule) -> Sequence[str]:
    """The base model's and the arms' evaluation files: a damaged or missing one makes a
    resume redo the phase, which recomputes only the files that are not intact."""
    return [eval_file(BASE_MODEL), *(eval_file(arm) for arm in schedule.arms)]


def run(ctx: PhaseContext) -> PhaseResult:
    base_accuracy = _evaluate_base(ctx)
    for arm in ctx.schedule.arms:
        _evaluate_arm(ctx, arm, base_accuracy)
    return PhaseResult({}, summary=f"base model and {len(ctx.schedule.arms)} arms")


def _evaluate_arm(ctx: PhaseContext, arm: str, base_accuracy: float) -> None:
    path = ctx.run_dir.eval_path(arm)
    if path.is_file() and ctx.intact(path):
        ctx.log(f"evaluation of {arm}: already done (resume)")
        return
    steps = ctx.schedule.steps
    ck = ctx.checkpoint(arm)
    if ck is None or ck.step != steps:  # the final one is damaged: redo the rest
        ctx.train(arm, until=steps)
        ck = ctx.checkpoint(arm)
    if ck is None or ck.step != steps:
        raise RunError(f"arm {arm} has no final checkpoint to evaluate")
    trainer = ctx.open_trainer(arm)
    try:
        trainer.load(ck.trainer_dir, ck.trainer, ck.cursor)
        seed_everything(ctx.schedule.seeds[arm] + EVAL_SEED_OFFSET)
        t0 = time.perf_counter()
        result = ctx.comp.evaluate(arm, trainer)
        delta = rows_accuracy(result.artifact) - base_accuracy
        ctx.log(
            f"evaluation of {arm}: {result.summary} ({delta:+.4f} vs base model), "
            f"{time.perf_counter() - t0:.1f} s"
        )
    finally:
        trainer.close()
    ctx.write_rows(path, result.artifact)


def _evaluate_base(ctx: PhaseContext) -> float:
    """Evaluate the initial policy once (a fresh trainer of the first arm, untrained; every
    arm starts from these weights, as the restoration preflight checks); its accuracy."""
    path = ctx.run_dir.base_eval_path
    if path.is_file() and ctx.intact(path):
        ctx.log("evaluation of the base model: already done (resume)")
        return rows_accuracy(read_rows(path))
    arm = ctx.schedule.arms[0]
    seed_everything(ctx.schedule.seeds[arm])  # the same initial state the arm trains from
    t0 = time.perf_counter()
    trainer = ctx.comp.make_trainer(arm)
    try:
        seed_everything(ctx.schedule.seeds[arm] + EVAL_SEED_OFFSET)
        result = ctx.comp.evaluate(arm, trainer)
    finally:
        trainer.close()
    ctx.write_rows(path, result.artifact)
    ctx.log(
        f"evaluation of the base model (initial policy): {result.summary}, "
        f"{time.perf_counter() - t0:.1f} s"
    )
    return rows_accuracy(result.artifact)
