"""Activation gate: the pilot's measured metrics against the plan's bounds, one `Check` per check.

A loss whose trust region never fires (ratio == 1 with one update per fresh batch) makes the two
arms the same update; the gate stops the sweep before that costs a full run. Unknown metric names
are rejected at plan-check time (`losslab.plan.GATE_METRICS`), so here every check's metric is one
the engine's pilot produces; a metric the pilot did not report fails its check.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from losslab.checks import Check, PhaseResult
from losslab.plan import ActivationGate, GateCheck

NOT_APPLICABLE = "activation_gate is not applicable in the plan"


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_bound(check: GateCheck, measured: Any) -> Check:
    """Compare one measured value with one check's bound: the row names the gate metric, the
    bound as the plan's text (`"[0.001, 0.3]"`, `">= 0.005"`, `"one of [...]"`) and why."""

    def result(passed: bool, reason: str) -> Check:
        return Check(check.metric, measured, check.bound_text(), passed, note=reason)

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
    checks: ActivationGate | Sequence[GateCheck] | None,
    metrics: Mapping[str, Any],
    *,
    measured_at_update: int | None = None,
) -> PhaseResult:
    """Evaluate the plan's activation gate on the pilot's measured metrics.

    Args:
        checks: the plan's `activation_gate` (or its `checks`); None or `applicable: false` passes.
        metrics: gate metric name -> measured value (floats; a string for `executed_base_model`).
            Extra keys are ignored (and kept in the artifact's `metrics`).
        measured_at_update: the update within each pilot batch the metrics were read at
            (`updates_per_batch`), recorded in the artifact.

    Returns:
        one `Check` per gate check; the artifact (pilot/gate.json) holds the metrics.
    """
    if checks is None or (isinstance(checks, ActivationGate) and not checks.applicable):
        return PhaseResult.not_applicable(NOT_APPLICABLE)
    if isinstance(checks, ActivationGate):
        checks = checks.checks
    artifact: dict[str, Any] = {"metrics": dict(metrics)}
    if measured_at_update is not None:
        artifact["measured_at_update"] = measured_at_update
    return PhaseResult(artifact, checks=[check_bound(c, metrics.get(c.metric)) for c in checks])
