"""Two report sections that audit the verdict: the rule's power, and a second grader's opinion.

- `power_facts`: the plan's minimum detectable effect at 80% power (`losslab.stats.power`) at the
  assumed discordance, and at the discordance the final evaluation measured (the share of items
  the arms disagree on, from the verdict's McNemar counts).
- `grader_audit`: per evaluated unit, the items on which math-verify, an independent parser and
  equivalence checker, disagrees with the grade losslab recorded (`grader_disagreements`). It never
  changes a grade or the verdict; it shows where the grader is the question.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

MAX_LISTED = 50
"""Disagreements listed per unit in the HTML (report.json keeps them all)."""


def _measured_discordance(verdict: Mapping[str, Any]) -> float | None:
    """(b + c) / n of the verdict's McNemar table; with several seeds, the mean over seed pairs."""
    tables = [verdict.get("secondary", {}).get("mcnemar_exact", {})]
    if verdict.get("per_seed"):
        tables = [s.get("mcnemar") or {} for s in verdict["per_seed"]]
    shares = [t["discordant"] / t["n"] for t in tables if t.get("discordant") is not None]
    return sum(shares) / len(shares) if shares else None


def power_facts(
    plan: Mapping[str, Any], verdict: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """The power lines of the plan's rule at the eval's n, assumed and (after the decision)
    measured discordance; None when the plan has no decision rule."""
    from losslab.plan import DecisionRule
    from losslab.stats.power import rule_power

    if not plan.get("decision_rule") or not (plan.get("eval") or {}).get("n_examples"):
        return None
    rule = DecisionRule.model_validate(plan["decision_rule"])
    n = int(plan["eval"]["n_examples"])
    facts: dict[str, Any] = {
        "n": n,
        "assumed": [p.to_dict() | {"lines": p.lines()} for p in rule_power(rule, n)],
        "measured": None,
    }
    measured = _measured_discordance(verdict) if verdict else None
    if measured is not None and measured > 0:
        n_eval = int(verdict["n"]) if verdict and verdict.get("n") else n
        facts["measured"] = [
            p.to_dict() | {"lines": p.lines()}
            for p in rule_power(rule, n_eval, discordance=measured)
        ]
    return facts


def grader_audit(evals: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """Per unit, math-verify's disagreements with the recorded grades (module docstring)."""
    import importlib.metadata as md

    try:
        from losslab.tasks.grading import grader_disagreements

        version = md.version("math-verify")
    except (ImportError, md.PackageNotFoundError):
        return {"available": False, "reason": "math-verify is not installed"}
    units = {}
    for unit, rows in evals.items():
        found = grader_disagreements(rows)
        units[unit] = {"items": len(rows), "disagreements": [d.to_dict() for d in found]}
    return {"available": True, "grader": f"math-verify {version}", "units": units}


def audit_rows(unit_facts: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The HTML table rows of one unit's disagreements (the first `MAX_LISTED`)."""
    return [
        {
            "item": d["id"],
            "reference": d["reference"],
            "losslab answer": d["losslab_prediction"],
            "losslab correct": d["losslab_correct"],
            "math-verify answer": d["math_verify_prediction"],
            "math-verify correct": d["math_verify_correct"],
            "completion (end)": d["completion_tail"],
        }
        for d in unit_facts["disagreements"][:MAX_LISTED]
    ]
