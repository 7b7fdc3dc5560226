"""The pilot: the treatment arm's first `pilot_steps` steps (kept: the arm continues from them),
then a few evaluation items timed on their weights for the feasibility projection."""

from __future__ import annotations

import time
from typing import Any

from losslab.checks import PhaseResult
from losslab.runner.protocols import ArmTrainer, PhaseContext


def run(ctx: PhaseContext) -> PhaseResult:
    arm, k = ctx.schedule.treatment, ctx.schedule.pilot_steps
    probe: dict[str, Any] = {}

    def time_eval(trainer: ArmTrainer) -> None:
        t = time.perf_counter()
        probe.update(ctx.comp.eval_probe(trainer))
        probe["eval_probe_seconds"] = time.perf_counter() - t

    ctx.log(f"pilot: first {k} steps of {arm}")
    setup_s = ctx.train(arm, until=k, before_close=time_eval)
    facts = {"steps": k, "arm": arm, "setup_seconds": setup_s, **probe}
    return PhaseResult(facts, summary=f"{k} steps of {arm}")
