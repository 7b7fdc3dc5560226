"""One `losslab run` per run directory: an exclusive `fcntl.flock` on `RUN_DIR/.lock`.

Two processes resuming one directory at once would delete each other's checkpoints; the second
one is refused instead, with the holder's pid. The lock belongs to the open file, so the kernel
releases it when the holder exits, however it exits (SIGKILL included): a stale `.lock` file
never blocks a later resume. The file is never deleted (deleting it would let a third process
lock a new inode while the second still holds the old one).
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import os
import socket
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


def acquire(root: Path) -> RunDirLock:
    """Lock `root` for this process or raise `RunDirLocked` naming the holder.

    Raises:
        RunDirLocked: another process holds the lock.
        OSError: the folder cannot hold a lock file (read-only, missing).
    """
    root = Path(root)
    fd = os.open(root / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RunDirLocked(
            f"{root} is in use by another losslab run ({holder(root)}); wait for it to finish "
            "or stop it, then resume"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()} since {stamp}\n".encode())
    return RunDirLock(root, fd)
