"""Reading raw JSON values without trusting their types (shared by the validation passes).

Each helper returns the value when it has the JSON type asked for and a neutral value otherwise,
so a rule can skip a field whose type error another pass already reports.
"""

from __future__ import annotations

from typing import Any


def json_number(value: Any) -> float | None:
    """A JSON number as float; None for anything else (booleans are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def json_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def json_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def json_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def format_number(x: float) -> str:
    """`3` for integral values below 1e15, else `repr` (`1e+300`, `inf`, `0.05`)."""
    return repr(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(x)
