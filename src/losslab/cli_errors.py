"""The command line's last line of defence: no Python traceback ever reaches a user.

Every `losslab` command runs inside `guarded()`. Expected failures (a bad plan, a refused run
directory, a failed check, an unreachable backend, a full disk, a read-only folder, Ctrl-C,
SIGTERM) become one `error: ...` line naming the file, field or value, and an exit code:

    0    success
    1    a run error (the message says what to do), or a check that failed in `plan check`,
         `preflight`, `conform`, `golden check`
    2    bad input: the plan, a command-line value, the run directory, `--resume`, `--data`
    3    a run's preflight, gate, feasibility or executed-config check failed (`--force` overrides)
    4    the backend could not be reached (Tinker URL, API key, local model)
    70   a bug in losslab: the traceback was written to a file the message names
    130  interrupted by Ctrl-C (SIGINT); a run directory stays resumable
    143  terminated by SIGTERM (e.g. a cluster scheduler); a run directory stays resumable

Anything else is a bug: the traceback goes to a crash file (`LOSSLAB_CRASH_DIR`, else the
system temp folder), secrets redacted, and the message says where it is and how to report it.
"""

from __future__ import annotations

import datetime as _dt
import errno
import os
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import typer

EXIT_OK = 0
EXIT_RUN_ERROR = 1
EXIT_BAD_INPUT = 2
EXIT_BUG = 70

ISSUES_URL = "the losslab issue tracker"
CRASH_DIR_ENV = "LOSSLAB_CRASH_DIR"

T = TypeVar("T")


def _echo(message: str) -> None:
    from losslab.runner.rundir import redact

    typer.echo(redact(message), err=True)


def os_error_message(e: OSError) -> str:
    """One line for an OSError: what failed on which file, and what to do."""
    where = f" {e.filename}" if e.filename else ""
    if e.errno == errno.ENOSPC:
        return (
            f"no space left on the device while writing{where}. Free space, then run the same "
            "command again (a run continues with --resume RUN_DIR)"
        )
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return (
            f"cannot write{where}: {e.strerror} (a read-only or foreign folder). Copy the folder "
            "somewhere writable, or fix its permissions, and run the command there"
        )
    if e.errno == errno.ENOENT:
        return f"no such file or folder:{where}"
    return f"{e.strerror or type(e).__name__}:{where} ({e})"


def write_crash_file(exc: BaseException, argv: list[str]) -> Path | None:
    """The traceback of an unexpected exception, secrets redacted, in a new file; None if no
    folder can take it."""
    from losslab import __version__
    from losslab.runner.rundir import redact

    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%d-%H%M%S")
    text = "".join(
        [
            f"losslab {__version__}, Python {sys.version.split()[0]}, {stamp} UTC\n",
            f"command: {' '.join(argv)}\n\n",
            *traceback.format_exception(exc),
        ]
    )
    folders = [os.environ.get(CRASH_DIR_ENV), tempfile.gettempdir()]
    for folder in filter(None, folders):
        try:
            Path(folder).mkdir(parents=True, exist_ok=True)
            path = Path(folder) / f"losslab-crash-{stamp}-{os.getpid()}.txt"
            path.write_text(redact(text), encoding="utf-8")
            return path
        except OSError:
            continue
    return None


def expected_failure(e: BaseException) -> tuple[str, int] | None:
    """(message, exit code) for a failure the user can act on; None for a bug."""
    from losslab.plan import PlanError
    from losslab.runner.errors import RunError

    if isinstance(e, PlanError):
        return f"plan is not valid:\n{e}", EXIT_BAD_INPUT
    if isinstance(e, RunError):
        return str(e), e.exit_code
    if isinstance(e, OSError):
        return os_error_message(e), EXIT_RUN_ERROR
    if isinstance(e, MemoryError):
        return "out of memory; lower the plan's sizes (batch, eval items, tokens)", EXIT_RUN_ERROR
    if isinstance(e, RecursionError):
        return "input nested too deeply to read", EXIT_BAD_INPUT
    return None


def _pass_through() -> tuple[type[BaseException], ...]:
    """typer's own exits and usage errors, and SystemExit. typer 0.29 vendors click: its usage
    errors derive from `typer.TyperException`, while `typer.Exit`/`typer.Abort` do not."""
    return (typer.TyperException, typer.Exit, typer.Abort, SystemExit)


_PASS_THROUGH = _pass_through()


def guarded(call: Callable[[], T], argv: list[str] | None = None) -> T:
    """Run `call`; turn every exception into one message and `SystemExit(code)`.

    typer's own exits (usage errors, `typer.Exit`) pass through unchanged.
    """
    from losslab.runner.signals import (
        exit_now_if_signalled,
        interrupt_exit_code,
        interrupt_name,
        sigterm_as_interrupt,
    )

    argv = list(sys.argv if argv is None else argv)
    try:
        with sigterm_as_interrupt():
            return call()
    except _PASS_THROUGH:
        raise
    except KeyboardInterrupt as e:
        _echo(f"{interrupt_name(e)}; nothing half-written was kept")
        exit_now_if_signalled(interrupt_exit_code(e))
        raise SystemExit(interrupt_exit_code(e)) from None
    except Exception as e:
        known = expected_failure(e)
        if known is not None:
            message, code = known
            _echo(f"error: {message}")
            exit_now_if_signalled(code)  # a run unwound after Ctrl-C/SIGTERM: exit within 2 s
            raise SystemExit(code) from None
        path = write_crash_file(e, argv)
        where = f"the details were written to {path}" if path else "no file could be written"
        _echo(
            f"error: losslab hit a bug ({type(e).__name__}: {e}); {where}. Please report it on "
            f"{ISSUES_URL} with that file and the command you ran."
        )
        raise SystemExit(EXIT_BUG) from None


class GuardedGroup:
    """Mixin for the root command group: every sub-command's invocation runs under `guarded`."""

    def invoke(self, ctx: Any) -> Any:
        return guarded(lambda: super(GuardedGroup, self).invoke(ctx))  # type: ignore[misc]
