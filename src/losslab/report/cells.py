"""How one value reads in a cell of the report: None as a dash, booleans as yes/no, floats to a
few significant digits, dicts as "key value, ...", never raw JSON."""

from __future__ import annotations

from typing import Any


def cell(value: Any, *, digits: int = 6, list_brackets: bool = True) -> str:
    """`value` as report text; nested lists and dicts are formatted the same way."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    if isinstance(value, dict):
        return ", ".join(
            f"{k} {cell(v, digits=digits, list_brackets=list_brackets)}" for k, v in value.items()
        )
    if isinstance(value, list):
        inner = ", ".join(cell(v, digits=digits, list_brackets=list_brackets) for v in value)
        return f"[{inner}]" if list_brackets else inner
    return str(value)
