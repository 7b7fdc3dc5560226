"""The efficiency endpoint in the report: accuracy against training tokens, and its area.

The runner scores each arm's current weights on the first m test items every k rollout steps
(`engine.eval_every`, `eval_every_items`) and keeps the result in that step's metrics row
(`efficiency/accuracy`, `efficiency/items`). Here, per trained unit:

    x_j = sum of `tokens/completion_total` over the steps up to and including step j
          (the completion tokens trained on: the loss tokens, the tokens the budget buys)
    y_j = efficiency/accuracy at step j
    start (0, y_0): the base model's accuracy on the same first m items (eval_base_model.jsonl),
          when the base model was evaluated; else the curve starts at its first point
    area  = trapezoid sum of y over x (accuracy x tokens)
    mean  = area / (x_last - x_first): the curve's average accuracy per training token, which
          compares arms that spent different numbers of tokens

Reported, never deciding: the decision rule's criteria are per-item metrics of the final
checkpoints (`plan.validate` accepts no other), and the subset is smaller than the eval's n.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import pairwise
from typing import Any

ACCURACY, ITEMS, TOKENS = "efficiency/accuracy", "efficiency/items", "tokens/completion_total"
NOT_DECIDING = (
    "reported, not deciding: the decision rule's criteria are per-item metrics of the final "
    "checkpoints; this curve is on the first {m} test items only"
)


def efficiency_curve(
    rows: Sequence[Mapping[str, Any]], base_rows: Sequence[Mapping[str, Any]] | None
) -> dict[str, Any] | None:
    """One unit's points [[tokens, accuracy], ...], its area and mean; None without points."""
    points, tokens, items = [], 0.0, None
    for row in rows:
        tokens += float(row.get(TOKENS) or 0.0)
        if isinstance(row.get(ACCURACY), int | float):
            points.append([tokens, float(row[ACCURACY])])
            items = int(row.get(ITEMS) or 0)
    if not points:
        return None
    if base_rows and items:
        first = base_rows[:items]
        points.insert(0, [0.0, sum(bool(r.get("correct")) for r in first) / len(first)])
    area = sum((x1 - x0) * (y0 + y1) / 2 for (x0, y0), (x1, y1) in pairwise(points))
    span = points[-1][0] - points[0][0]
    return {
        "points": points,
        "items": items,
        "area": area,
        "mean_accuracy": area / span if span > 0 else None,
        "starts_at_base_model": bool(base_rows and items),
    }


def efficiency_facts(
    metrics: Mapping[str, Sequence[Mapping[str, Any]]],
    base_rows: Sequence[Mapping[str, Any]] | None,
) -> dict[str, Any] | None:
    """Every unit's curve (module docstring); None when the run had no efficiency endpoint."""
    curves = {u: c for u, rows in metrics.items() if (c := efficiency_curve(rows, base_rows))}
    if not curves:
        return None
    m = max(c["items"] or 0 for c in curves.values())
    return {"units": curves, "deciding": False, "note": NOT_DECIDING.format(m=m)}
