"""Atomic writes of files and folders: readers see the old version or the whole new one, never half.

Stdlib only, so every layer may import it (runner artifacts, engine metrics and evaluations,
report, conformance goldens and preflight reports, the local backend's checkpoints and model
folders all build on it).

How: write a hidden temp file (or fill a hidden temp folder) in the target's own folder, so the
final `os.replace` is a rename within one file system, which POSIX makes atomic. File contents
and the parent folder are fsynced, so after a crash a renamed file is never empty. Temp files
and folders get the modes an ordinary `open`/`mkdir` would give (mkstemp's 0600 and mkdtemp's
0700 would make shared artifacts unreadable to the group and others).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = [
    "as_disk_full",
    "atomic_dir",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "fsync_dir",
]

StrPath = str | os.PathLike[str]


def _read_umask() -> int:
    # os.umask can only be read by setting it; done once at import, while no other thread writes
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _read_umask()
FILE_MODE = 0o666 & ~_UMASK  # what open(path, "w") would give
DIR_MODE = 0o777 & ~_UMASK  # what path.mkdir() would give


def fsync_dir(path: StrPath) -> None:
    """Flush a folder's entries (a rename into it) to disk; a no-op where folders can't be opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: StrPath, data: bytes) -> Path:
    """Write `data` to `path` (parent folders created) so that readers see either the old file or
    the whole new one; on any error the old file stays and no temp file is left. Returns `path`."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise _naming(e, path) from None
    try:
        with os.fdopen(fd, "wb") as f:
            _write_all(f, data)
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise _naming(e, path) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path


def _write_all(f: Any, data: bytes) -> None:
    """Write, flush and fsync: where a full disk shows up (ENOSPC, naming no file)."""
    f.write(data)
    f.flush()
    os.fsync(f.fileno())


def _naming(e: OSError, path: Path) -> OSError:
    """`e` naming the file being written: a write()'s ENOSPC names no file, and the user needs
    to know which artifact did not fit."""
    if e.filename is not None:
        return e
    return type(e)(e.errno, e.strerror or os.strerror(e.errno or 0), str(path))


_DISK_FULL_TEXT = ("no space left", "os error 28", "file write failed", "disk quota")


def as_disk_full(e: BaseException, folder: StrPath) -> OSError | None:
    """An ENOSPC `OSError` naming `folder` when `e` is a full disk seen through a library that
    does not raise OSError (safetensors' `SafetensorError`, torch.save's `RuntimeError`), else
    None. Judged by the message, and for torch's bare "file write failed" by the folder's file
    system having (almost) no space left."""
    if isinstance(e, OSError):
        return e if e.errno in (errno.ENOSPC, errno.EDQUOT) else None
    text = str(e).lower()
    if not any(marker in text for marker in _DISK_FULL_TEXT):
        return None
    if "file write failed" in text and "space" not in text:
        try:
            if shutil.disk_usage(folder).free > 1 << 20:  # a write that failed for another reason
                return None
        except OSError:
            pass
    return OSError(errno.ENOSPC, "No space left on device", str(folder))


def atomic_write_text(path: StrPath, text: str, *, encoding: str = "utf-8") -> Path:
    """`atomic_write_bytes` of `text` encoded with `encoding`."""
    return atomic_write_bytes(path, text.encode(encoding))


def atomic_write_json(path: StrPath, obj: Any, **json_kwargs: Any) -> Path:
    """Write `json.dumps(obj, **json_kwargs)` plus a final newline atomically.

    The text is built before anything is written, so an object that can't be serialized raises
    and leaves the old file as it was.
    """
    return atomic_write_text(path, json.dumps(obj, **json_kwargs) + "\n")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@contextmanager
def atomic_dir(
    target: StrPath, *, prefix: str | None = None, overwrite: bool = True
) -> Iterator[Path]:
    """Yield an empty hidden temp folder next to `target`; on success rename it to `target`.

    If the `with` body raises, the temp folder is removed and `target` is left as it was. The
    parent folder is created if missing.

    Args:
        target: the folder to create or replace.
        prefix: name prefix of the temp folder (default `.<target name>.`). Give one when a
            clean-up elsewhere removes leftovers of killed writers by that prefix.
        overwrite: replace an existing `target` whole (True), or raise `FileExistsError` and keep
            it (False: e.g. a cache that a concurrent writer may have filled first, where theirs
            is as good as ours).
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(
        tempfile.mkdtemp(prefix=f".{target.name}." if prefix is None else prefix, dir=target.parent)
    )
    try:
        tmp.chmod(DIR_MODE)
        yield tmp
        _rename_into_place(tmp, target, overwrite=overwrite)
    finally:
        if os.path.lexists(tmp):
            _remove(tmp)


def _rename_into_place(tmp: Path, target: Path, *, overwrite: bool) -> None:
    if os.path.lexists(target):
        if not overwrite:
            raise FileExistsError(
                errno.EEXIST, "atomic_dir: target exists (overwrite=False)", target
            )
        # rename rather than delete the old one first: a kill mid-delete would leave a half target.
        # The name keeps tmp's prefix, so whatever cleans up leftover temp folders finds it too.
        old = tmp.with_name(tmp.name + ".old")
        os.replace(target, old)
        try:
            os.replace(tmp, target)
        except BaseException:
            os.replace(old, target)
            raise
        _remove(old)
    else:
        try:
            os.replace(tmp, target)
        except OSError as e:  # a concurrent writer created target after the check above
            if overwrite or e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            raise FileExistsError(errno.EEXIST, "atomic_dir: target exists", target) from e
    fsync_dir(target.parent)
