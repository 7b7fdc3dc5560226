"""SIGTERM handled like Ctrl-C: a cluster scheduler's stop leaves a resumable run directory.

`sigterm_as_interrupt()` makes SIGTERM raise `Terminated` in the main thread. `Terminated` is a
KeyboardInterrupt, so every path that already cleans up after Ctrl-C (the runner's "resumable"
log line, atomic writes removing their temp files) handles it the same way; only the message and
the exit code (143 = 128 + SIGTERM) differ.
"""

from __future__ import annotations

import signal
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


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated(f"terminated by signal {signum}")


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While inside, SIGTERM raises `Terminated` in the main thread (elsewhere: unchanged)."""
    try:
        previous = signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:  # not the main thread: signals can only be set there
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
