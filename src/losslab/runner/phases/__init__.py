"""The phase table of `losslab run`: one row per phase, in the order the runner runs them.

Each phase is a module here with `run(ctx) -> losslab.checks.PhaseResult` (ctx: the
`PhaseContext`, what the runner offers a phase); it reads the run's resources from `ctx.comp`
and calls its package's phase function (`conformance.preflight.preflight_phase`,
`stats.gate.evaluate_gate`, ...), which builds its own check rows. Adding a phase is one module
plus one row below (docs/contributing.md); the runner (runner/run.py) records each result,
stops on a failed check unless `--force`, and skips a done phase on `--resume`.
"""

from __future__ import annotations

from losslab.runner.phases import (
    arms,
    audit,
    decision,
    dispatch,
    evaluation,
    feasibility,
    gate,
    pilot,
    preflight,
    restoration,
)
from losslab.runner.protocols import Phase, check_table

__all__ = ["PHASES", "TRAINING_PHASE", "VERDICT_PHASE"]

PHASES: tuple[Phase, ...] = check_table(
    (
        Phase("preflight", preflight.run, artifact="preflight.json"),
        Phase("restoration", restoration.run, artifact="restoration.json"),
        Phase("dispatch", dispatch.run, artifact="dispatch.json"),
        Phase("pilot", pilot.run, outputs=pilot.outputs),
        Phase("feasibility", feasibility.run, needs=("pilot",), artifact="feasibility.json"),
        Phase("gate", gate.run, needs=("pilot",), artifact="pilot/gate.json"),
        Phase("arms", arms.run, needs=("pilot",)),
        Phase("evaluation", evaluation.run, needs=("arms",), outputs=evaluation.outputs),
        Phase("audit", audit.run, needs=("evaluation",), artifact="generation_audit.json"),
        Phase("decision", decision.run, needs=("evaluation",), artifact="verdict.json"),
    )
)
"""name, run, what it needs, its artifact: the whole order of a run, read by `_Runner`."""

TRAINING_PHASE = "arms"
"""The phase that leaves every unit's final checkpoint: on resume it is redone when one is
damaged (each unit continues from its newest intact checkpoint)."""
VERDICT_PHASE = "decision"
"""The phase whose artifact is the verdict (`RunResult.verdict`) and whose summary ends the log."""
