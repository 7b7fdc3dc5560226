"""The safe-name rule: a plan string that becomes part of a file name is one plain file name.

An arm's name names its folder (`arms/<name>/`, checkpoints below it), its evaluation file
(`eval_<name>.jsonl`) and, for extra seeds, `<name>.seed<s>`; a reasoning-gym task's dataset
name is a name too. A plan could otherwise write outside the run directory
(`"../../victim/train"`), over a user's file (an absolute path), or make a name the file system
refuses (NUL, over-long) or hides (a dot name). `plan check` refuses such a name at its JSON
path, before anything is written (checking each path at write time is the runner's part).

The rule is a whitelist, not a list of bad characters, so no encoding trick passes it:
`SAFE_NAME_PATTERN` - ASCII letters, digits, `_`, `-` and `.`, starting with a letter or digit
(no dot names, no leading `-` that reads as a command-line option), at most `MAX_NAME_CHARS`
characters. Stdlib only (the task names come from `losslab.tasks.registry`, stdlib only too).
"""

from __future__ import annotations

import re

from losslab.tasks.registry import TASK_PREFIXES, TASKS, task_declaration

MAX_NAME_CHARS = 64
"""Longest name accepted: `eval_<name>.seed<s>.jsonl` and the atomic writer's temporary names
(`.<name>.<random>.tmp`) stay far below the 255 bytes of a file name on every file system."""

SAFE_NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]*"
_SAFE_NAME = re.compile(SAFE_NAME_PATTERN)

SAFE_NAME_RULE = (
    f"ASCII letters, digits, '_', '-' and '.', starting with a letter or digit, at most "
    f"{MAX_NAME_CHARS} characters"
)
"""The rule in words, for error messages and the docs."""


def _shown(name: str) -> str:
    """`repr` of a name, cut to 80 characters (a plan may hold a name of a megabyte)."""
    text = repr(name)
    return text if len(text) <= 80 else text[:77] + "..."


def unsafe_name_reason(name: str) -> str | None:
    """Why `name` is not a safe file name (the first reason found), or None when it is.

    >>> unsafe_name_reason("grpo_seed0") is None
    True
    >>> unsafe_name_reason("../../victim/train")
    "'../../victim/train' contains '/', a path separator"
    """
    if name == "":
        return "is empty"
    if "\x00" in name:
        return f"{_shown(name)} contains a NUL byte"
    for sep in ("/", "\\"):
        if sep in name:
            what = "an absolute path" if name.startswith(sep) else "a path separator"
            return f"{_shown(name)} contains {sep!r}, {what}"
    if name.startswith("."):
        return f"{_shown(name)} starts with '.' (a dot name: hidden, or '.'/'..' the folder itself)"
    if len(name) > MAX_NAME_CHARS:
        return f"is {len(name)} characters long; at most {MAX_NAME_CHARS} are accepted"
    bad = next((c for c in name if not re.fullmatch(r"[A-Za-z0-9_.-]", c)), None)
    if bad is not None:
        return f"{_shown(name)} contains {bad!r}"
    if not _SAFE_NAME.fullmatch(name):
        return f"{_shown(name)} starts with {name[0]!r}, not a letter or digit"
    return None


def name_problem(name: str, what: str) -> str | None:
    """The full message for a refused name (`what`: "an arm name is used as a folder name"),
    or None when `name` is safe."""
    reason = unsafe_name_reason(name)
    if reason is None:
        return None
    return f"{reason}; {what}, so it must be one plain file name: {SAFE_NAME_RULE}"


def task_name_problem(task: str) -> str | None:
    """Why `task` (`engine.task`, else `dataset.name`) names no task, or None: a `TASKS` name,
    or a `TASK_PREFIXES` prefix followed by a dataset name that passes the safe-name rule
    (`make_task` builds exactly these; any other name would fail when the run starts)."""
    if task_declaration(task) is not None:
        return None
    key = task.strip()
    for prefix in TASK_PREFIXES:
        if key.lower().startswith(prefix):
            reason = unsafe_name_reason(key[len(prefix) :])
            if reason is None:
                return None
            return f"the dataset after {prefix!r} {reason}; a dataset name is {SAFE_NAME_RULE}"
    names = ", ".join(map(repr, TASKS))
    prefixes = "|".join(TASK_PREFIXES)
    return f"{_shown(task)} is not a task; expected one of {names} or {prefixes}<dataset>"
