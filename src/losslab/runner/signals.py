"""SIGTERM handled like Ctrl-C: a cluster scheduler's stop leaves a resumable run directory.

`sigterm_as_interrupt()` makes SIGTERM raise `Terminated` in the main thread. `Terminated` is a
KeyboardInterrupt, so every path that already cleans up after Ctrl-C (the runner's "resumable"
log line, atomic writes removing their temp files) handles it the same way; only the message and
the exit code (143 = 128 + SIGTERM) differ.

Ctrl-C (SIGINT) gets the same handler, so both count as *received*: once the run has unwound
(lock released, log line written, the message printed) `guarded` ends the process with
`os._exit` instead of a normal interpreter shutdown, which took 7-24 s (torch and thread
teardown) after the message. A second signal while the first unwinds exits at once: every file
is written atomically, so the directory stays resumable.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

EXIT_SIGINT = 130
EXIT_SIGTERM = 143


class Terminated(KeyboardInterrupt):
    """The process received SIGTERM."""

    exit_code = EXIT_SIGTERM


def interrupt_name(e: BaseException) -> str:
    """`terminated (SIGTERM)` or `interrupted` (Ctrl-C), for messages."""
    return "terminated (SIGTERM)" if isinstance(e, Terminated) else "interrupted"


def interrupt_exit_code(e: BaseException) -> int:
    return EXIT_SIGTERM if isinstance(e, Terminated) else EXIT_SIGINT


_RECEIVED: list[int] = []  # signals received inside the outermost `sigterm_as_interrupt`
_DEPTH = [0]


def signal_received() -> int | None:
    """The first SIGINT/SIGTERM received by this process's guarded command, else None (an
    interrupt raised by code, as tests do, is not a signal)."""
    return _RECEIVED[0] if _RECEIVED else None


def _on_signal(signum: int, frame: Any) -> None:
    if _RECEIVED:  # the second one: the user or the scheduler will not wait for the clean-up
        os.write(2, b"second signal: exiting now; the run directory stays resumable\n")
        os._exit(EXIT_SIGTERM if signum == signal.SIGTERM else EXIT_SIGINT)
    _RECEIVED.append(signum)
    if signum == signal.SIGTERM:
        raise Terminated(f"terminated by signal {signum}")
    raise KeyboardInterrupt


def exit_now_if_signalled(code: int) -> None:
    """After a received signal's message: flush and end the process at once with `code`,
    skipping the interpreter's slow shutdown (nothing is left to write: the run unwound)."""
    if signal_received() is None or code not in (EXIT_SIGINT, EXIT_SIGTERM):
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While inside, SIGTERM raises `Terminated` and SIGINT `KeyboardInterrupt` in the main
    thread, and a second one exits at once (elsewhere: unchanged)."""
    try:
        previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    except ValueError:  # not the main thread: signals can only be set there
        yield
        return
    if _DEPTH[0] == 0:
        _RECEIVED.clear()
    _DEPTH[0] += 1
    try:
        yield
    finally:
        _DEPTH[0] -= 1
        for sig, handler in previous.items():
            signal.signal(sig, handler)
