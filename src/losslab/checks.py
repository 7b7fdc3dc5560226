"""What a phase checked and what it recorded: one `Check` row shape, one `PhaseResult`.

Stdlib only, at the bottom of the house, so every layer builds its own rows: the correctness
preflight (`conformance.preflight`), the restoration preflight and the executed configuration
(`backends`), the activation gate, feasibility and the decision (`stats`), the evaluation
(`engine`). The runner only orders phases: it writes `PhaseResult.record()`, stops on
`first_failure` (or, under `--force`, marks it `overridden`) and never reshapes a row.

A check artifact (preflight.json, restoration.json, pilot/gate.json, feasibility.json) is

    {**artifact, "passed": bool, "applicable": bool,
     "checks": [{"check", "measured", "bound", "passed", "note", "overridden"}, ...],
     "failures": [the rows that did not pass]}

which the report reads (`losslab.report`). A phase that checks nothing (`checks=None`: the
decision, the evaluation) writes its artifact as it is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

__all__ = ["Check", "PhaseResult", "checks_summary"]


@dataclass(frozen=True)
class Check:
    """One row: what was measured, the bound it was held to, and whether it held.

    Args:
        name: what is checked, unique within its phase (`"<path>.reference_gradient"`,
            `"projected wall minutes"`, a gate metric); the runner's stop message names it.
        measured: the measured value (JSON-safe: a number, a string or a small record).
        bound: the bound as text (`"<= 15"`, `"atol 1e-05, rtol 0.0001"`) or as the planned
            record it is compared with.
        passed: whether `measured` is within `bound`.
        note: why, in a few words (`"within bound"`, `"3 element(s) outside tolerance"`).
        overridden: the run continued past this failed check because of `--force`.
    """

    name: str
    measured: Any
    bound: Any
    passed: bool
    note: str = ""
    overridden: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The artifact row; its key for `name` is `check` (the row shape artifacts keep)."""
        return {
            "check": self.name,
            "measured": self.measured,
            "bound": self.bound,
            "passed": self.passed,
            "note": self.note,
            "overridden": self.overridden,
        }

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> Check:
        """A row read back from an artifact (rows written before `overridden` existed too)."""
        return cls(
            name=str(row["check"]),
            measured=row.get("measured"),
            bound=row.get("bound"),
            passed=bool(row.get("passed")),
            note=str(row.get("note") or ""),
            overridden=bool(row.get("overridden")),
        )


def checks_summary(checks: Iterable[Check]) -> str:
    """`"5/5 checks passed"`, or `"4/5 checks passed; failed: <first failed name>"`."""
    rows = list(checks)
    failed = [c.name for c in rows if not c.passed]
    text = f"{len(rows) - len(failed)}/{len(rows)} checks passed"
    return text + (f"; failed: {failed[0]}" if failed else "")


@dataclass(frozen=True)
class PhaseResult:
    """What one phase returns: its checks, the record it writes, and a one-line summary.

    Args:
        artifact: the phase's own record, JSON-safe (an object; rows for a JSON-lines file).
        checks: the check rows, in the order the report shows them; None for a phase that
            checks nothing, whose `record()` is then `artifact` unchanged.
        summary: one line for the log and the manifest (default: `checks_summary(checks)`).
        applicable: False when the plan turns the phase off; it then passes with no checks.
        required: False when the plan records this phase's failures without stopping the run
            (`correctness_preflight.required`, `feasibility_check.required`): `passed` is then
            True while `failures` still lists them.
    """

    artifact: Any
    checks: tuple[Check, ...] | None = None
    summary: str = ""
    applicable: bool = True
    required: bool = True

    def __post_init__(self) -> None:
        if self.checks is not None:
            object.__setattr__(self, "checks", tuple(self.checks))
            if not self.summary:
                object.__setattr__(self, "summary", checks_summary(self.checks))

    @classmethod
    def not_applicable(cls, why: str) -> PhaseResult:
        """A phase the plan does not ask for: passes, checks nothing, says why."""
        return cls({"note": why}, checks=(), summary=f"not applicable: {why}", applicable=False)

    @property
    def failures(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks or () if not c.passed)

    @property
    def passed(self) -> bool:
        """Every check passed, or the phase is not required to pass."""
        return not self.failures or not self.required

    @property
    def first_failure(self) -> Check | None:
        """The failed check that stops the run (None when `passed`)."""
        return None if self.passed else self.failures[0]

    def overridden(self) -> PhaseResult:
        """The same result with every failed check marked `overridden` (`--force`)."""
        checks = tuple(c if c.passed else replace(c, overridden=True) for c in self.checks or ())
        return replace(self, checks=checks if self.checks is not None else None)

    def with_facts(self, **facts: Any) -> PhaseResult:
        """The same result with `facts` added to (or replacing keys of) its artifact object."""
        return replace(self, artifact={**self.artifact, **facts})

    def record(self) -> Any:
        """What the phase's artifact file holds (see the module docstring)."""
        if self.checks is None:
            return self.artifact
        return {
            **self.artifact,
            "passed": self.passed,
            "applicable": self.applicable,
            "checks": [c.to_dict() for c in self.checks],
            "failures": [c.to_dict() for c in self.failures],
        }
