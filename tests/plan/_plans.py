"""Helpers for plan tests: the seed plan (examples/, shipped with the repo) as a fresh dict."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

SEED_PLAN = Path(__file__).resolve().parents[2] / "examples" / "gsm8k_dppo_vs_grpo.json"
_SEED = json.loads(SEED_PLAN.read_text(encoding="utf-8"))


def fresh_seed() -> dict[str, Any]:
    return copy.deepcopy(_SEED)


_TOKEN = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _parts(path: str) -> list[str | int]:
    return [name if name else int(idx) for name, idx in _TOKEN.findall(path)]


def set_at(data: dict[str, Any], path: str, value: Any) -> None:
    """Set `data` at a JSON path like `arms[1].lr` (creating the last key)."""
    *head, last = _parts(path)
    node: Any = data
    for part in head:
        node = node[part]
    node[last] = value


def delete_at(data: dict[str, Any], path: str) -> None:
    *head, last = _parts(path)
    node: Any = data
    for part in head:
        node = node[part]
    del node[last]
