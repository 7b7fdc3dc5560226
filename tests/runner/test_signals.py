"""Ctrl-C and SIGTERM end a run within 2 s of the message, and a second signal at once, with the
run directory resumable (issue 25, failure 7: 7-24 s after the message, and a second SIGTERM
killed the process with -15).

Real signals sent to a real child process running the fake components (each step slowed to
0.4 s so the signal lands inside one)."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from ._fake_components import final_state
from .test_reliability import SIGTERM_SCRIPT, _run, start_until_first_checkpoint

SLOW_CLOSE = SIGTERM_SCRIPT.replace(
    "fake.FakeTrainer.step = slow_step",
    "fake.FakeTrainer.step = slow_step\n"
    "fake.FakeTrainer.close = lambda self: (print('closing', file=sys.stderr, flush=True), "
    "time.sleep(60))",
)


def _line_with(proc: subprocess.Popen, words: str, timeout: float = 30) -> float:
    """Read stderr until a line holding `words`; the monotonic time it arrived."""
    assert proc.stderr is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        if words in line:
            return time.monotonic()
    raise AssertionError(f"no stderr line with {words!r}")


@pytest.mark.parametrize(
    ("sig", "code", "message"),
    [
        (signal.SIGTERM, 143, "terminated (SIGTERM). Continue with"),
        (signal.SIGINT, 130, "interrupted. Continue"),
    ],
)
def test_a_signal_exits_within_2_s_of_its_message_and_resumes(
    plan: Path, tmp_path: Path, reference: dict, sig: int, code: int, message: str
) -> None:
    run = tmp_path / "run"
    proc = start_until_first_checkpoint(SIGTERM_SCRIPT, plan, run)
    proc.send_signal(sig)
    said = _line_with(proc, message)
    proc.wait(timeout=30)
    assert time.monotonic() - said < 2.0  # before: 7-24 s of interpreter shutdown
    assert proc.returncode == code
    _run(plan, resume=run)
    assert final_state(run) == reference


def test_a_second_signal_exits_at_once_and_the_run_stays_resumable(
    plan: Path, tmp_path: Path, reference: dict
) -> None:
    run = tmp_path / "run"
    proc = start_until_first_checkpoint(SLOW_CLOSE, plan, run)
    proc.send_signal(signal.SIGTERM)
    _line_with(proc, "closing")  # the first one is unwinding: the trainer's close takes 60 s
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    assert time.monotonic() - t0 < 2.0
    assert proc.returncode == 143  # an exit code, not killed by the signal (-15)
    _run(plan, resume=run)
    assert final_state(run) == reference
