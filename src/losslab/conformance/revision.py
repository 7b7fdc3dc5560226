"""Pinned revision strings: `owner/repo@commit:path::function(kw=value, ...) — description`.

This is the form the plan's `correctness_preflight.paths[i].baseline_revision` and
`reference_revision` use. Keyword arguments are Python literals (`loss_mode='dppo_binary_tv'`,
`clip_ratio=0.15`); the plan also writes the shorthand `clip LO/HI` for absolute ratio bounds,
which is parsed into `clip_bounds`. Anything else inside the parentheses is kept as free text
(`notes`) and never interpreted; the text after ` — ` is kept as the description.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Any

_HEAD = re.compile(
    r"^(?P<repo>[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*)"
    r"@(?P<commit>[0-9a-fA-F]{7,40})"
    r":(?P<path>[^:\s]+)"
    r"::(?P<function>[A-Za-z_][A-Za-z0-9_.]*)"
    r"(?:\((?P<args>.*)\))?$",
    re.DOTALL,
)
_KWARG = re.compile(r"^\s*(?P<key>[A-Za-z_][A-Za-z0-9_]*)\s*=(?P<value>.*)$", re.DOTALL)
_CLIP = re.compile(r"^\s*clip\s+(?P<lo>[0-9.eE+-]+)\s*/\s*(?P<hi>[0-9.eE+-]+)\s*$")
_DESCRIPTION_SEPARATORS = (" \u2014 ", " -- ")


class RevisionError(ValueError):
    """A revision string that cannot be parsed or resolved; the message names the string."""


@dataclass(frozen=True)
class Revision:
    """A parsed pinned revision."""

    text: str
    repo: str
    commit: str
    path: str
    function: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    clip_bounds: tuple[float, float] | None = None  # from the `clip LO/HI` shorthand
    notes: tuple[str, ...] = ()  # argument text that is not kw=value (kept, not interpreted)
    description: str = ""

    @property
    def short(self) -> str:
        return f"{self.repo}@{self.commit[:8]}:{self.path}::{self.function}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "repo": self.repo,
            "commit": self.commit,
            "path": self.path,
            "function": self.function,
            "kwargs": dict(self.kwargs),
            "clip_bounds": list(self.clip_bounds) if self.clip_bounds else None,
            "notes": list(self.notes),
            "description": self.description,
        }


def _split_top_level(args: str) -> list[str]:
    """Split at commas outside quotes and brackets."""
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(args):
        if quote:
            if ch == quote and args[i - 1] != "\\":
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(args[start:i])
            start = i + 1
    parts.append(args[start:])
    return [p for p in (p.strip() for p in parts) if p]


def _hint(head: str) -> str:
    """Which part of a malformed `owner/repo@commit:path::function(...)` is wrong."""
    if "@" not in head:
        return "missing '@commit'"
    after = head.split("@", 1)[1]
    commit = re.match(r"[0-9a-fA-F]*", after).group(0)  # type: ignore[union-attr]
    rest = after[len(commit) :]
    if not 7 <= len(commit) <= 40 or (rest and rest[0] not in ":"):
        return "commit must be 7-40 hex digits"
    if not rest.startswith(":") or rest.startswith("::"):
        return "missing ':path'"
    if "::" not in rest:
        return "missing '::function'"
    return "path must have no spaces, function be an identifier, arguments be in (...)"


def parse_revision(text: str) -> Revision:
    """Parse `owner/repo@commit:path::function(kw=value, ...) — description`.

    Raises RevisionError naming the string and the part that is malformed.
    """
    if not isinstance(text, str) or not text.strip():
        raise RevisionError(f"revision {text!r}: expected 'owner/repo@commit:path::function(...)'")
    head, description = text.strip(), ""
    for sep in _DESCRIPTION_SEPARATORS:
        if sep in head:
            head, description = (s.strip() for s in head.split(sep, 1))
            break
    match = _HEAD.match(head)
    if match is None:
        hint = _hint(head)
        raise RevisionError(
            f"revision {text!r}: {hint}; expected 'owner/repo@commit:path::function(kw=value, ...)'"
        )
    kwargs: dict[str, Any] = {}
    notes: list[str] = []
    clip_bounds = None
    for part in _split_top_level(match.group("args") or ""):
        kw = _KWARG.match(part)
        clip = _CLIP.match(part)
        if kw is not None:
            key = kw.group("key")
            try:
                value = ast.literal_eval(kw.group("value").strip())
            except (ValueError, SyntaxError) as err:
                raise RevisionError(
                    f"revision {text!r}: argument {key}={kw.group('value').strip()} "
                    "is not a Python literal (number, string, bool, None, list, "
                    "dict)"
                ) from err
            if key in kwargs:
                raise RevisionError(f"revision {text!r}: argument {key} given twice")
            kwargs[key] = value
        elif clip is not None:
            try:
                clip_bounds = (float(clip.group("lo")), float(clip.group("hi")))
            except ValueError as err:
                raise RevisionError(
                    f"revision {text!r}: 'clip LO/HI' needs two numbers, got {part!r}"
                ) from err
        else:
            notes.append(part)
    return Revision(
        text=text,
        repo=match.group("repo"),
        commit=match.group("commit").lower(),
        path=match.group("path"),
        function=match.group("function"),
        kwargs=kwargs,
        clip_bounds=clip_bounds,
        notes=tuple(notes),
        description=description,
    )
