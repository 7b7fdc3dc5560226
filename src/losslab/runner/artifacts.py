"""Artifacts read back with their schema checked, so a damaged file is named, never a traceback.

Every artifact is written atomically (`losslab.atomic`), so damage means something outside
losslab changed it (a hand edit, a truncating copy, a bad disk). Readers here say which file and
which line is wrong; the runner then recomputes what it can (an evaluation, the verdict, a
metrics file rebuilt from its checkpoint) and says so.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from losslab.runner.errors import RunDirError


class DamagedArtifact(RunDirError):
    """A run-directory file that is missing, not valid JSON, or of the wrong shape."""

    def __init__(self, path: Path, why: str) -> None:
        self.path, self.why = Path(path), why
        super().__init__(f"{path} is damaged: {why}")


def read_object(path: Path) -> dict[str, Any]:
    """A JSON file holding one object."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DamagedArtifact(path, "the file is missing") from None
    except UnicodeDecodeError as e:
        raise DamagedArtifact(path, f"not UTF-8 text ({e.reason})") from None
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        raise DamagedArtifact(path, f"not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise DamagedArtifact(path, f"expected a JSON object, got {type(value).__name__}")
    return value


def read_rows(path: Path) -> list[dict[str, Any]]:
    """A JSON-lines file of objects; blank lines are skipped."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DamagedArtifact(path, "the file is missing") from None
    except UnicodeDecodeError as e:
        raise DamagedArtifact(path, f"not UTF-8 text ({e.reason})") from None
    rows = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as e:
            raise DamagedArtifact(path, f"line {lineno} is not valid JSON ({e})") from None
        if not isinstance(row, dict):
            raise DamagedArtifact(path, f"line {lineno} is not a JSON object")
        rows.append(row)
    return rows


def set_aside(path: Path) -> Path:
    """Rename a damaged artifact to `<name>.damaged` (kept for inspection, out of the way)."""
    path = Path(path)
    aside = path.with_name(path.name + ".damaged")
    if aside.exists():
        shutil.rmtree(aside) if aside.is_dir() else aside.unlink()
    path.rename(aside)
    return aside
