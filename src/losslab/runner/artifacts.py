"""The runner's view of damaged artifacts: `losslab.artifacts`' readers, their error a
`RunDirError` (exit 2, one message naming the file), and `set_aside` for what is recomputed."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from losslab import artifacts
from losslab.runner.errors import RunDirError


class DamagedArtifact(RunDirError, artifacts.ArtifactError):
    """A run-directory file that is missing, not valid JSON, or of the wrong shape."""


def read_object(path: Path) -> dict[str, Any]:
    try:
        return artifacts.read_object(path)
    except artifacts.ArtifactError as e:
        raise DamagedArtifact(e.path, e.why) from None


def read_rows(path: Path) -> list[dict[str, Any]]:
    try:
        return artifacts.read_rows(path)
    except artifacts.ArtifactError as e:
        raise DamagedArtifact(e.path, e.why) from None


def set_aside(path: Path) -> Path:
    """Rename a damaged artifact to `<name>.damaged` (kept for inspection, out of the way)."""
    path = Path(path)
    aside = path.with_name(path.name + ".damaged")
    if aside.is_symlink() or aside.is_file():  # a link is removed, never what it points to
        aside.unlink()
    elif aside.is_dir():
        shutil.rmtree(aside)
    path.rename(aside)
    return aside
