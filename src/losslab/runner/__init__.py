"""losslab.runner: the phases of `losslab run`, the run directory, checkpoints and resume.

The names below are imported on first use: every command's error guard (`losslab.cli_errors`)
reads `runner.errors` and `runner.signals`, which must not pull in the engine and torch (so
`losslab plan check` stays a JSON check).
"""

from losslab.lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "BackendUnavailable": "errors",
    "CheckFailed": "errors",
    "ResumeRefused": "errors",
    "RunDirError": "errors",
    "RunError": "errors",
    "UnsupportedPlan": "errors",
    "ArmTrainer": "protocols",
    "Components": "protocols",
    "Schedule": "protocols",
    "RunInterrupted": "run",
    "RunResult": "run",
    "run_plan": "run",
}
"""Public name -> the submodule defining it."""

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
