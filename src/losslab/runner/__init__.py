"""losslab.runner: the phases of `losslab run`, the run directory, checkpoints and resume."""

from losslab.runner.errors import (
    BackendUnavailable,
    CheckFailed,
    ResumeRefused,
    RunDirError,
    RunError,
    UnsupportedPlan,
)
from losslab.runner.protocols import ArmTrainer, Components, Schedule
from losslab.runner.run import RunInterrupted, RunResult, run_plan

__all__ = [
    "ArmTrainer",
    "BackendUnavailable",
    "CheckFailed",
    "Components",
    "ResumeRefused",
    "RunDirError",
    "RunError",
    "RunInterrupted",
    "RunResult",
    "Schedule",
    "UnsupportedPlan",
    "run_plan",
]
