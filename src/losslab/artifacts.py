"""Run-directory artifacts read back with their shape checked: a damaged file is named, with the
line, never a traceback. Stdlib only, so every layer (runner, report) reads artifacts one way.

Every artifact is written atomically (`losslab.atomic`), so damage means something outside
losslab changed it (a hand edit, a truncating copy, a bad disk).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["ArtifactError", "read_object", "read_rows"]


class ArtifactError(ValueError):
    """An artifact that is missing, not UTF-8, not valid JSON, or not of its shape."""

    def __init__(self, path: Path, why: str) -> None:
        self.path, self.why = Path(path), why
        super().__init__(f"{path} is damaged: {why}")


def _read_text(path: Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ArtifactError(path, "the file is missing") from None
    except UnicodeDecodeError as e:
        raise ArtifactError(path, f"not UTF-8 text ({e.reason})") from None


def _object(path: Path, text: str, where: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        raise ArtifactError(path, f"{where}not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise ArtifactError(path, f"{where}expected a JSON object, got {type(value).__name__}")
    return value


def read_object(path: Path) -> dict[str, Any]:
    """A JSON file holding one object."""
    return _object(path, _read_text(path), "")


def read_rows(path: Path) -> list[dict[str, Any]]:
    """A JSON-lines file of objects; blank lines are skipped."""
    lines = _read_text(path).splitlines()
    return [_object(path, line, f"line {n}: ") for n, line in enumerate(lines, 1) if line.strip()]
