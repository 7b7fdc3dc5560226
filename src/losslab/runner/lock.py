"""One `losslab run` per run directory: an exclusive `fcntl.flock` on `RUN_DIR/.lock`.

Two processes resuming one directory at once would delete each other's checkpoints; the second
one is refused instead, with the holder's pid. The lock belongs to the open file, so the kernel
releases it when the holder exits, however it exits (SIGKILL included): a stale `.lock` file
never blocks a later resume. The file is never deleted (deleting it would let a third process
lock a new inode while the second still holds the old one).

The file is opened with `O_NOFOLLOW` and must be a regular file: a `.lock` planted as a symlink
(or a FIFO, a device) is refused with `RunDirError` and its target is never opened, truncated or
written. `losslab report` takes the lock shared (`acquire_shared`): several reports may read one
directory at once, never while a run writes it.
"""

from __future__ import annotations

import datetime as _dt
import errno
import fcntl
import os
import socket
import stat
from pathlib import Path

from losslab.runner.errors import RunDirError

LOCK_NAME = ".lock"


class RunDirLocked(RunDirError):
    """Another live process holds the run directory."""


class RunDirLock:
    """An acquired lock on one run directory; `release()` (or process exit) frees it."""

    def __init__(self, root: Path, fd: int) -> None:
        self.root, self._fd = root, fd

    def release(self) -> None:
        if self._fd is not None:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> RunDirLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def holder(root: Path) -> str:
    """What the lock file says about its holder (`pid 123 on host since ...`), or `unknown`."""
    try:
        text = (Path(root) / LOCK_NAME).read_text(encoding="utf-8").strip()
    except OSError:
        return "an unknown process"
    return text or "an unknown process"


def open_regular(path: Path, flags: int, on_link: Exception, on_other: Exception) -> int:
    """`os.open(path, flags)` without following a symbolic link (`on_link` is raised) and
    refused unless it is a regular file (`on_other`), so a planted link or FIFO is never
    written through (the lock file, the run's log)."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise on_link from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise on_other
    return fd


def _open_lock_file(root: Path, flags: int) -> int:
    """The `.lock` file's descriptor, opened without following a link and without blocking on
    a FIFO; refused unless it is a regular file."""
    path = root / LOCK_NAME
    return open_regular(
        path,
        flags | os.O_NONBLOCK,
        on_link=RunDirError(
            f"{path} is a symbolic link; losslab never follows it (the lock would write "
            "into its target). Remove the link, then run again"
        ),
        on_other=RunDirError(f"{path} is not a regular file; remove it, then run again"),
    )


def _flock(root: Path, fd: int, mode: int, what: str) -> None:
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RunDirLocked(
            f"{root} is in use by another losslab run ({holder(root)}); {what}"
        ) from None
    except BaseException:
        os.close(fd)
        raise


def acquire(root: Path) -> RunDirLock:
    """Lock `root` for this process or raise `RunDirLocked` naming the holder.

    Raises:
        RunDirLocked: another process holds the lock.
        RunDirError: `.lock` is a symlink or not a regular file (never followed or written).
        OSError: the folder cannot hold a lock file (read-only, missing).
    """
    root = Path(root)
    fd = _open_lock_file(root, os.O_RDWR | os.O_CREAT)
    _flock(root, fd, fcntl.LOCK_EX, "wait for it to finish or stop it, then resume")
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()} since {stamp}\n".encode())
    return RunDirLock(root, fd)


def acquire_shared(root: Path) -> RunDirLock | None:
    """A shared lock on `root` for a reader (`losslab report`), or None where the folder has no
    `.lock` and cannot hold one (a read-only copy: nobody can be writing it through losslab).

    Raises:
        RunDirLocked: a run holds the directory (its files are changing).
        RunDirError: `.lock` is a symlink or not a regular file.
    """
    root = Path(root)
    try:
        fd = _open_lock_file(root, os.O_RDWR | os.O_CREAT)
    except PermissionError:
        try:
            fd = _open_lock_file(root, os.O_RDONLY)
        except FileNotFoundError:
            return None
    except OSError as e:
        if e.errno in (errno.EROFS, errno.EACCES):
            return None
        raise
    _flock(root, fd, fcntl.LOCK_SH, "rebuild the report once it has finished")
    return RunDirLock(root, fd)
