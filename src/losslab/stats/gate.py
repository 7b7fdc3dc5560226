"""Activation gate: the pilot's measured metrics against the plan's bounds, one row per check.

A loss whose trust region never fires (ratio == 1 with one update per fresh batch) makes the two
arms the same update; the gate stops the sweep before that costs a full run. Unknown metric names
are rejected at plan-check time (`losslab.plan.GATE_METRICS`), so here every check's metric is one
the engine's pilot produces; a metric the pilot did not report fails its check.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from losslab.plan import ActivationGate, GateCheck


@dataclass(frozen=True)
class GateCheckResult:
    """One check: the measured value, the bound (as numbers and as text), pass or fail, and why."""

    metric: str
    measured: Any
    bound: str
    min: float | None
    max: float | None
    one_of: list[Any] | None
    passed: bool
    reason: str


@dataclass(frozen=True)
class GateResult:
    """All checks; `passed` only when the gate is not applicable or every check passed."""

    applicable: bool
    passed: bool
    checks: list[GateCheckResult]

    @property
    def failed(self) -> list[GateCheckResult]:
        return [c for c in self.checks if not c.passed]

    def to_dict(self) -> dict[str, Any]:
        return {
            "applicable": self.applicable,
            "passed": self.passed,
            "checks": [asdict(c) for c in self.checks],
        }


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_bound(check: GateCheck, measured: Any) -> GateCheckResult:
    """Compare one measured value with one check's bound."""

    def result(passed: bool, reason: str) -> GateCheckResult:
        return GateCheckResult(
            check.metric,
            measured,
            check.bound_text(),
            check.min,
            check.max,
            check.one_of,
            passed,
            reason,
        )

    if measured is None:
        return result(False, "not measured by the pilot")
    if check.one_of is not None:
        if _is_number(measured):
            hit = any(_is_number(x) and float(x) == float(measured) for x in check.one_of)
        else:
            hit = measured in check.one_of
        return result(hit, "in one_of" if hit else f"{measured!r} is not one of {check.one_of!r}")
    if not _is_number(measured):
        return result(False, f"measured {measured!r} is not a number")
    if math.isnan(measured):
        return result(False, "measured NaN")
    if check.min is not None and measured < check.min:
        return result(False, f"{measured:g} < min {check.min:g}")
    if check.max is not None and measured > check.max:
        return result(False, f"{measured:g} > max {check.max:g}")
    return result(True, "within bound")


def evaluate_gate(
    checks: ActivationGate | Sequence[GateCheck] | None, metrics: Mapping[str, Any]
) -> GateResult:
    """Evaluate the plan's activation gate on the pilot's measured metrics.

    Args:
        checks: the plan's `activation_gate` (or its `checks`); None or `applicable: false` passes.
        metrics: gate metric name -> measured value (floats; a string for `executed_base_model`).
            Extra keys are ignored.
    """
    if checks is None:
        return GateResult(applicable=False, passed=True, checks=[])
    if isinstance(checks, ActivationGate):
        if not checks.applicable:
            return GateResult(applicable=False, passed=True, checks=[])
        checks = checks.checks
    results = [check_bound(c, metrics.get(c.metric)) for c in checks]
    return GateResult(applicable=True, passed=all(r.passed for r in results), checks=results)
