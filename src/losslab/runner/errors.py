"""Errors a run reports to the user as one clear message (the CLI prints them without a traceback)."""

from __future__ import annotations

from typing import Any


class RunError(Exception):
    """A run could not start or continue; the message says why and what to do."""

    exit_code = 1


class RunDirError(RunError):
    """The run directory is missing, not a run directory, or cannot be written."""

    exit_code = 2


class DiskFull(RunError):
    """A write found no space left on the device; the run directory stays resumable (exit 1)."""

    exit_code = 1


class ResumeRefused(RunError):
    """`--resume` pointed at a run from another plan, backend or losslab version."""

    exit_code = 2


class UnsupportedPlan(RunError):
    """The plan asks for an experiment feature losslab does not implement."""

    exit_code = 2


class LossBuildError(RunError):
    """An arm's loss cannot be built (code that does not import, has an unknown signature or
    returns no differentiable loss; a resolved value its declaration refuses): bad input."""

    exit_code = 2


class DataError(RunError):
    """The task's data (`--data` files, the hub copy) is unreadable or too small for the plan."""

    exit_code = 2


class BackendUnavailable(RunError):
    """The backend could not be reached or could not create a client."""

    exit_code = 4


class CheckFailed(RunError):
    """A preflight, the activation gate, feasibility or the executed config failed a bound.

    Args:
        phase: the phase that ran the check ("preflight", "gate", ...).
        check: the check's name as the plan spells it.
        measured: the measured value.
        bound: the plan's bound, as text ("[0.001, 0.3]", "<= 1e-05", "one of [...]").
        artifact: the artifact holding the full table.
    """

    exit_code = 3

    def __init__(self, phase: str, check: str, measured: Any, bound: str, artifact: str) -> None:
        self.phase, self.check, self.measured, self.bound = phase, check, measured, bound
        self.summary = (
            f"{phase} failed: check '{check}' measured {_fmt(measured)}, bound {bound} "
            f"(full table: {artifact})"
        )
        super().__init__(
            f"{self.summary}. Pass --force to continue anyway; the report will say so."
        )


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return repr(value) if isinstance(value, str) else str(value)
