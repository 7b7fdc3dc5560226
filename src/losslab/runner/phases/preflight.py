"""Correctness preflight: the arms' loss objects against the plan's pinned references."""

from __future__ import annotations

from losslab.checks import PhaseResult
from losslab.conformance.preflight import PreflightError, preflight_phase
from losslab.runner.errors import RunError
from losslab.runner.protocols import PhaseContext


def run(ctx: PhaseContext) -> PhaseResult:
    # the plan and the loss objects the arms train: one source of truth
    try:
        sources = getattr(ctx.comp, "sources", None)  # `losslab run --source`
        return preflight_phase(ctx.comp.plan, ctx.comp.losses, sources=sources)
    except PreflightError as e:
        raise RunError(f"correctness preflight could not run: {e}") from e
