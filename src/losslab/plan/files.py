"""Reading a file the plan names (the plan itself, a loss's source file) without trusting it,
and checking a path inside a repository that a plan names (`repo_path_problem`).

Only a regular file is read, and at most `max_bytes` + 1 bytes of it: `/dev/zero` would
otherwise be read until memory runs out, and a FIFO would block forever (it is opened
non-blocking, then refused by `fstat`). A symlink to a regular file is followed. Stdlib only.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class UnreadableFile(ValueError):
    """The file could not be read as text; the message names it and says why."""


def file_kind(mode: int) -> str:
    """`a directory`, `a FIFO (named pipe)`, ... for a `st_mode` that is not a regular file."""
    for test, kind in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return kind
    return "a special file"


def read_regular_text(path: Path, max_bytes: int, what: str) -> str:
    """The UTF-8 text of the regular file `path` (`what` names it in messages: "plan file
    '/x/p.json'").

    Raises:
        FileNotFoundError: there is no such file.
        UnreadableFile: not a regular file, over `max_bytes`, unreadable, or not UTF-8.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise UnreadableFile(f"cannot read {what}: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnreadableFile(f"{what} is {file_kind(info.st_mode)}, not a regular file")
        if info.st_size > max_bytes:
            raise UnreadableFile(f"{what} is {info.st_size} bytes; at most {max_bytes} are read")
        with os.fdopen(fd, "rb", closefd=False) as stream:
            raw = stream.read(max_bytes + 1)  # the file may have grown since fstat
    except OSError as exc:
        raise UnreadableFile(f"cannot read {what}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(raw) > max_bytes:
        raise UnreadableFile(f"{what} is over {max_bytes} bytes")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnreadableFile(
            f"{what} is not UTF-8 (byte {raw[exc.start]:#04x} at offset {exc.start})"
        ) from None


def repo_path_problem(path: str) -> str | None:
    """Why a revision's file path is not a plain path inside the repository (None if it is):
    the path is read from a checkout (`--source repo=PATH`) or a git commit, so `..`, an
    absolute path or a NUL byte could read a file outside it."""
    if "\x00" in path:
        return "contains a NUL byte"
    if path.startswith(("/", "\\")):
        return "is absolute; expected a path inside the repository"
    parts = path.replace("\\", "/").split("/")
    if any(part in ("", ".", "..") for part in parts):
        return "has an empty, '.' or '..' part; expected a plain path inside the repository"
    return None
