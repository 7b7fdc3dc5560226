"""The report's per-item facts: the base model's row and the items on which the arms disagree.

`eval_<unit>.jsonl` keeps every item (id, question, reference answer, completion, extracted answer,
grade); the report lists only the discordant ones, the items the paired decision rests on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from losslab.stats.versus_base import versus_base

ITEM_FIELDS = ("completion", "prediction", "correct", "format", "reward")


def base_model_facts(
    base_rows: Sequence[Mapping[str, Any]] | None,
    evals: Mapping[str, Sequence[Mapping[str, Any]]],
    alpha: float,
) -> dict[str, Any] | None:
    """Accuracy of the initial policy and each evaluated unit's paired change against it."""
    if base_rows is None:
        return None
    n = len(base_rows)
    k = sum(bool(r.get("correct")) for r in base_rows)
    facts: dict[str, Any] = {"n": n, "correct": k, "accuracy": k / n if n else None}
    try:
        facts["versus_base"] = versus_base(evals, base_rows, alpha) if n else {}
    except ValueError as e:  # items differ: say so instead of pairing the wrong rows
        facts["versus_base"] = {}
        facts["versus_base_error"] = str(e)
    return facts


def _by_id(rows: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    return {str(r.get("id", i)): r for i, r in enumerate(rows)}


def _item_view(row: Mapping[str, Any] | None) -> dict[str, Any] | None:
    return None if row is None else {k: row.get(k) for k in ITEM_FIELDS}


def flipped_items(
    evals: Mapping[str, Sequence[Mapping[str, Any]]],
    base_rows: Sequence[Mapping[str, Any]] | None,
    units: Mapping[str, Mapping[str, Any]],
    roles: Mapping[str, str],
) -> list[dict[str, Any]]:
    """Per seed pair (treatment unit, baseline unit), every item graded differently by the two.

    `kind` is "b" (treatment right, baseline wrong) or "c" (the reverse), as in the paired table.
    """
    by_seed: dict[Any, dict[str, str]] = {}
    for unit in evals:
        role = roles.get(unit)
        if role in ("treatment", "baseline"):
            by_seed.setdefault(units.get(unit, {}).get("seed"), {}).setdefault(role, unit)
    base = _by_id(base_rows) if base_rows is not None else {}
    out = []
    for seed, pair in by_seed.items():
        if set(pair) != {"treatment", "baseline"}:
            continue
        t_unit, b_unit = pair["treatment"], pair["baseline"]
        t_rows, b_rows = _by_id(evals[t_unit]), _by_id(evals[b_unit])
        items = []
        for item in sorted(set(t_rows) & set(b_rows)):
            t, b = t_rows[item], b_rows[item]
            if bool(t.get("correct")) == bool(b.get("correct")):
                continue
            items.append(
                {
                    "id": item,
                    "kind": "b" if t.get("correct") else "c",
                    "question": t.get("question") or b.get("question"),
                    "answer": t.get("answer", b.get("answer")),
                    "treatment": _item_view(t),
                    "baseline": _item_view(b),
                    "base_model": _item_view(base.get(item)),
                }
            )
        out.append({"seed": seed, "treatment": t_unit, "baseline": b_unit, "items": items})
    return out
