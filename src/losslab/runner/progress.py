"""What a run prints: rich progress bars (phase and step, with ETA) on a terminal, else plain lines.

On a terminal the bars go to stderr. When stdout is not a terminal (CI, `| tee`, `| cat`) or with
`--quiet`, every line run.log gets (one per phase start and end, one per RL step) is printed to
stdout as it happens, flushed, without bars. Every message also lands in the run directory's `run.log` with a UTC timestamp. Secrets (the
value of TINKER_API_KEY and any other value passed in `secrets`) are replaced by `***` before a
line is printed or written.
"""

from __future__ import annotations

import datetime as _dt
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from losslab.runner.rundir import open_log_nofollow, redact


def stdout_is_terminal() -> bool:
    """Whether progress bars make sense: stdout is an interactive terminal."""
    return sys.stdout.isatty()


class RunConsole:
    """Progress display plus the run log.

    Args:
        log_path: `run.log` in the run directory (appended to; None before the directory exists).
        quiet: no bars, one plain line per phase and per step (for CI logs and `nohup`); also
            the mode whenever stdout is not a terminal.
        total_phases: how many phases the phase bar counts.
    """

    def __init__(self, log_path: Path | None, *, quiet: bool, total_phases: int) -> None:
        self.log_path = log_path
        self.quiet = quiet or not stdout_is_terminal()
        quiet = self.quiet
        if quiet:  # plain lines on stdout, one per message, never wrapped or styled
            self.console = Console(file=sys.stdout, highlight=False, soft_wrap=True)
        else:
            self.console = Console(stderr=True, highlight=False)
        self._progress: Progress | None = None
        self._phase_task: TaskID | None = None
        if not quiet:
            self._progress = Progress(
                SpinnerColumn(),
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=self.console,
            )
            self._progress.start()
            self._phase_task = self._progress.add_task("phases", total=total_phases)

    def log(self, message: str, *, echo: bool = True) -> None:
        message = redact(message)
        if self.log_path is not None:
            stamp = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(open_log_nofollow(self.log_path), "a", encoding="utf-8") as f:
                f.write(f"{stamp} {message}\n")
        if echo:
            if self._progress is not None:
                self._progress.console.print(message, markup=False, soft_wrap=True)
            else:
                self.console.print(message, markup=False, soft_wrap=True)
                self.console.file.flush()  # a pipe is block-buffered: show each line now

    @contextmanager
    def phase(self, name: str, detail: str = "") -> Iterator[None]:
        """Log a phase's start and its duration; advance the phase bar when it ends."""
        if self._progress is not None and self._phase_task is not None:
            self._progress.update(self._phase_task, description=f"phase: {name}")
        self.log(f"[{name}] start{': ' + detail if detail else ''}")
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.log(f"[{name}] end after {time.perf_counter() - t0:.1f} s", echo=self.quiet)
        if self._progress is not None and self._phase_task is not None:
            self._progress.advance(self._phase_task)

    def skip_phase(self, name: str, why: str) -> None:
        self.log(f"[{name}] {why}")
        if self._progress is not None and self._phase_task is not None:
            self._progress.advance(self._phase_task)

    @contextmanager
    def steps(self, label: str, start: int, total: int) -> Iterator[StepBar]:
        """A per-step bar for one arm (starting at `start` completed steps)."""
        task = None
        if self._progress is not None:
            task = self._progress.add_task(label, total=total, completed=start)
        bar = StepBar(self, label, total, task)
        try:
            yield bar
        finally:
            if self._progress is not None and task is not None:
                self._progress.remove_task(task)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


class StepBar:
    def __init__(self, console: RunConsole, label: str, total: int, task: TaskID | None) -> None:
        self._c, self._label, self._total, self._task = console, label, total, task

    def done(self, step: int, seconds: float, summary: str) -> None:
        """Step `step` (0-based) finished after `seconds`."""
        line = f"{self._label} step {step + 1}/{self._total} {seconds:.1f} s {summary}".rstrip()
        self._c.log(line, echo=self._c.quiet)
        if self._c._progress is not None and self._task is not None:
            self._c._progress.update(self._task, completed=step + 1)
