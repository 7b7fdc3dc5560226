"""Run-directory artifacts read back with their shape checked: a damaged file is named, with the
line, never a traceback. Stdlib only, so every layer (runner, report) reads artifacts one way.

Every artifact is written atomically (`losslab.atomic`), so damage means something outside
losslab changed it (a hand edit, a truncating copy, a bad disk).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

__all__ = [
    "LEDGER_KEY",
    "ArtifactError",
    "find_symlink",
    "ledger_entry",
    "ledger_problem",
    "read_object",
    "read_rows",
    "verify_ledger",
]

LEDGER_KEY = "artifacts"
"""manifest.json's record of each artifact as written: relative path -> {"sha256", "bytes",
"rows" (JSON lines only)}. A file that no longer matches its entry was changed outside losslab
(cut, edited, replaced): `--resume` recomputes it, `losslab report` refuses it by name."""


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


def ledger_entry(path: Path) -> dict[str, Any]:
    """What the ledger records of a just-written artifact: its sha256, size and (for JSON lines)
    the number of rows."""
    data = Path(path).read_bytes()
    entry: dict[str, Any] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    if Path(path).suffix == ".jsonl":
        entry["rows"] = sum(1 for line in data.splitlines() if line.strip())
    return entry


def ledger_problem(path: Path, entry: Any) -> str | None:
    """Why `path` no longer matches its ledger `entry` (missing, a symlink, cut to fewer rows,
    altered), or None when it matches."""
    path = Path(path)
    if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str):
        return "its entry in manifest.json is not an object with a sha256"
    if path.is_symlink():
        return "it is a symbolic link (losslab writes none)"
    if not path.is_file():
        return "the file is missing, though manifest.json records it as written"
    now = ledger_entry(path)
    if now["sha256"] == entry["sha256"]:
        return None
    if "rows" in entry and now.get("rows") != entry["rows"]:
        return f"it has {now.get('rows')} rows, manifest.json records {entry['rows']} as written"
    return (
        f"its content changed after it was written ({now['bytes']} bytes, manifest.json "
        f"records {entry.get('bytes')} bytes and another sha256)"
    )


def verify_ledger(root: Path, manifest: dict[str, Any]) -> list[tuple[Path, str]]:
    """(path, why) for each artifact of the manifest's ledger that no longer matches it."""
    ledger = manifest.get(LEDGER_KEY) or {}
    if not isinstance(ledger, dict):
        return [(Path(root) / "manifest.json", f"'{LEDGER_KEY}' is not an object")]
    out = []
    for rel, entry in sorted(ledger.items()):
        path = Path(root) / rel
        why = ledger_problem(path, entry)
        if why is not None:
            out.append((path, why))
    return out


def find_symlink(root: Path) -> Path | None:
    """The first symbolic link inside `root` (folders are not followed), or None: losslab never
    writes one, so a link in a run directory points at something that is not the run's."""
    for folder, dirs, files in os.walk(root, followlinks=False):
        for name in sorted(dirs + files):
            path = Path(folder) / name
            if path.is_symlink():
                return path
    return None
