"""A throwaway phase for tests/runner/test_errands.py, written as docs/contributing.md's "Add a
phase" errand says: one module with `run(ctx) -> PhaseResult` that builds its own checks.

It reads the pilot's metrics rows and checks that the pilot's rewards are finite numbers.
"""

from __future__ import annotations

import math

from losslab.checks import Check, PhaseResult
from losslab.runner.protocols import PhaseContext

MAX_ABS_REWARD = 1e6
"""The bound of the check; the tests lower it to make the check fail on purpose."""


def run(ctx: PhaseContext) -> PhaseResult:
    rewards = [float(r["reward/mean"]) for r in ctx.pilot_rows()]
    worst = max((abs(x) for x in rewards), default=math.nan)
    check = Check(
        "pilot |reward/mean| max",
        worst,
        f"<= {MAX_ABS_REWARD:g}",
        passed=math.isfinite(worst) and worst <= MAX_ABS_REWARD,
    )
    return PhaseResult({"rewards": rewards, "steps": len(rewards)}, checks=[check])
