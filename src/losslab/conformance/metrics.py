"""Error metrics between our value/gradient and a reference's, computed in float64.

The four numbers and the tolerance rule are the ones the plan's `correctness_preflight.tolerances`
block names: `max_abs_error`, `reference_max_abs`, `relative_l2_error`, `cosine_similarity`, and a
check `|a - b| <= atol + rtol * |b|` elementwise plus `cosine >= min_cosine` (b is the reference).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

ArrayLike = Any  # float | np.ndarray | torch.Tensor | a (ragged) sequence of those


def as_float64(values: ArrayLike) -> np.ndarray:
    """Flatten a scalar, array, tensor or ragged list of them into one float64 vector.

    Ragged per-datum lists (`grad_D[i]` of length T_i) are concatenated in datum order, so two
    sides compare token for token as long as both use the same datum order and lengths.
    """
    if hasattr(values, "detach"):  # torch.Tensor, without importing torch here
        return values.detach().to("cpu").double().numpy().reshape(-1)
    if isinstance(values, np.ndarray):
        return values.astype(np.float64).reshape(-1)
    if isinstance(values, (int, float, np.floating, np.integer)):
        return np.array([float(values)], dtype=np.float64)
    if isinstance(values, Sequence) and not isinstance(values, (str, bytes)):
        parts = [as_float64(v) for v in values]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float64)
    raise TypeError(
        f"cannot compare a value of type {type(values).__name__}: expected a number, "
        "an array, a tensor or a list of them"
    )


@dataclass(frozen=True)
class ErrorMetrics:
    """How far `actual` is from `reference` (float64). Field names are the report's keys."""

    max_abs_error: float
    reference_max_abs: float
    relative_l2_error: float
    cosine_similarity: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def compare(actual: ArrayLike, reference: ArrayLike) -> ErrorMetrics:
    """Error metrics of `actual` against `reference` (a loss scalar or a gradient), in float64.

    relative_l2_error = ||a - b|| / ||b|| (0 when both are 0, inf when only b is 0);
    cosine_similarity = <a, b> / (||a|| ||b||) (1 when both are 0, 0 when exactly one is).
    For a scalar the cosine is the sign agreement (+1 or -1).
    """
    a, b = as_float64(actual), as_float64(reference)
    if a.shape != b.shape:
        raise ValueError(
            f"cannot compare: actual has {a.size} values, reference has {b.size}; "
            "expected the same fixture layout on both sides"
        )
    diff = a - b
    diff_norm, a_norm, b_norm = (float(np.linalg.norm(x)) for x in (diff, a, b))
    if b_norm == 0.0:
        rel = 0.0 if diff_norm == 0.0 else math.inf
    else:
        rel = diff_norm / b_norm
    if a_norm == 0.0 and b_norm == 0.0:
        cos = 1.0
    elif a_norm == 0.0 or b_norm == 0.0:
        cos = 0.0
    else:
        cos = float(np.dot(a, b) / (a_norm * b_norm))
    return ErrorMetrics(
        max_abs_error=float(np.max(np.abs(diff))) if diff.size else 0.0,
        reference_max_abs=float(np.max(np.abs(b))) if b.size else 0.0,
        relative_l2_error=rel,
        cosine_similarity=cos,
    )


@dataclass(frozen=True)
class Tolerance:
    """One block of the plan's `tolerances` (e.g. `reference_gradient`).

    Args:
        atol: absolute slack added to every element's bound.
        rtol: slack relative to the reference element's magnitude, `|a-b| <= atol + rtol*|b|`.
        min_cosine: when set, the cosine similarity of the whole vector must reach it (use it for
            gradients, where a direction error matters even when every element is small).
    """

    atol: float
    rtol: float
    min_cosine: float | None = None

    @classmethod
    def from_dict(cls, block: Mapping[str, Any], where: str = "tolerance") -> Tolerance:
        unknown = set(block) - {"atol", "rtol", "min_cosine"}
        if unknown:
            raise ValueError(
                f"{where}: unknown keys {sorted(unknown)}; expected atol, rtol, min_cosine"
            )
        values: dict[str, float | None] = {}
        for key in ("atol", "rtol", "min_cosine"):
            raw = block.get(key)
            if raw is None:
                if key == "min_cosine":
                    values[key] = None
                    continue
                raise ValueError(f"{where}.{key} is missing; expected a number >= 0")
            if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw):
                raise ValueError(f"{where}.{key} = {raw!r}; expected a finite number")
            if key != "min_cosine" and raw < 0:
                raise ValueError(f"{where}.{key} = {raw!r}; expected a number >= 0")
            if key == "min_cosine" and not -1.0 <= raw <= 1.0:
                raise ValueError(f"{where}.min_cosine = {raw!r}; expected a number in [-1, 1]")
            values[key] = float(raw)
        return cls(atol=values["atol"], rtol=values["rtol"], min_cosine=values["min_cosine"])  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, float]:
        out = {"atol": self.atol, "rtol": self.rtol}
        if self.min_cosine is not None:
            out["min_cosine"] = self.min_cosine
        return out


@dataclass(frozen=True)
class ToleranceCheck:
    """Outcome of one tolerance check: the metrics, whether it passed and why not."""

    passed: bool
    metrics: ErrorMetrics
    tolerance: Tolerance
    violations: int  # elements with |a-b| > atol + rtol*|b|
    worst_index: int  # element with the largest excess over its bound (-1 when empty)
    worst_excess: float  # |a-b| - (atol + rtol*|b|) at worst_index (<= 0 when all pass)
    cosine_ok: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "tolerance": self.tolerance.to_dict(),
            "violations": self.violations,
            "worst_index": self.worst_index,
            "worst_excess": self.worst_excess,
            "cosine_ok": self.cosine_ok,
            **self.metrics.to_dict(),
        }


def check_tolerance(
    actual: ArrayLike, reference: ArrayLike, tolerance: Tolerance
) -> ToleranceCheck:
    """Check `|a - b| <= atol + rtol * |b|` elementwise (b = reference) and the cosine floor.

    NaN anywhere fails the check (a NaN comparison is never within tolerance).
    """
    a, b = as_float64(actual), as_float64(reference)
    metrics = compare(a, b)
    bound = tolerance.atol + tolerance.rtol * np.abs(b)
    excess = np.abs(a - b) - bound
    excess = np.where(np.isnan(excess), np.inf, excess)
    violations = int(np.count_nonzero(excess > 0))
    worst = int(np.argmax(excess)) if excess.size else -1
    worst_excess = float(excess[worst]) if excess.size else 0.0
    cosine_ok = tolerance.min_cosine is None or (
        not math.isnan(metrics.cosine_similarity)
        and metrics.cosine_similarity >= tolerance.min_cosine
    )
    return ToleranceCheck(
        passed=violations == 0 and cosine_ok,
        metrics=metrics,
        tolerance=tolerance,
        violations=violations,
        worst_index=worst,
        worst_excess=worst_excess,
        cosine_ok=cosine_ok,
    )
