"""What the runner needs from the layers below it, as two small protocols.

`Components` gathers every call the phases make (preflight, restoration, training, gate,
feasibility, evaluation, decision); `losslab.runner.components.DefaultComponents` implements it
with losslab's own packages. Keeping the phases behind this seam lets a test drive the whole
run-directory, checkpoint and resume machinery with a fake in a fraction of a second.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True)
class Schedule:
    """What the runner orchestrates, read from the plan.

    Args:
        arms: arm names in plan order.
        treatment: the arm the pilot runs (the decision rule's "treatment" role).
        steps: RL steps (rollout batches) per arm.
        pilot_steps: the first `pilot_steps` steps of the treatment arm form the gate's pilot;
            the treatment arm continues from the pilot's checkpoint instead of redoing them.
        seeds: each arm's seed; the global RNGs are reseeded with it before the arm starts.
        units: with several seeds (decision_rule.seeds), `arms` lists one trained unit per
            (plan arm, seed) and `units` maps each to its plan arm; empty means every entry of
            `arms` is a plan arm.
    """

    arms: tuple[str, ...]
    treatment: str
    steps: int
    pilot_steps: int
    seeds: dict[str, int]
    units: dict[str, str] = field(default_factory=dict)

    def plan_arm(self, unit: str) -> str:
        """The plan arm a trained unit replicates (the unit itself with one seed)."""
        return self.units.get(unit, unit)


class ArmTrainer(Protocol):
    """One arm's training state behind a training client.

    Determinism contract: `step(i)` depends only on the weights, optimizer state, `cursor`,
    the global RNG state and `i`, so restoring those from a checkpoint reproduces the step.
    """

    def step(self, step: int) -> dict[str, Any]:
        """Run RL step `step` (sample, advantages, updates) and return its metrics row."""
        ...

    @property
    def cursor(self) -> dict[str, Any]:
        """JSON-safe position in the training data (what the next step draws)."""
        ...

    def save(self, folder: Path) -> dict[str, Any]:
        """Write weights and optimizer state into `folder`; return a JSON-safe description."""
        ...

    def load(self, folder: Path, info: dict[str, Any], cursor: dict[str, Any]) -> None:
        """Restore what `save` wrote (and the data cursor)."""
        ...

    def close(self) -> None: ...


class Components(Protocol):
    """The calls the run phases make; each returns JSON-safe artifacts.

    Check phases (preflight, restoration, gate, feasibility) return
    `{"passed": bool, "checks": [{"check", "measured", "bound", "passed", "note"}], "failures":
    [the failed rows], ...}`; the runner stops on the first failure and the report tabulates
    `checks`.
    """

    schedule: Schedule

    def preflight(self) -> dict[str, Any]:
        """Correctness preflight report: {"passed": bool, "checks": [...], ...}."""
        ...

    def restoration(self) -> dict[str, Any]:
        """Restoration preflight report: {"passed": bool, "checks": [...], ...}."""
        ...

    def make_trainer(self, arm: str) -> ArmTrainer: ...

    def executed_config(self, arm: str, trainer: ArmTrainer) -> dict[str, dict[str, Any]]:
        """{key: {"plan": planned value, "executed": value the backend reports}}."""
        ...

    def gate(
        self, pilot_rows: list[dict[str, Any]], executed: dict[str, dict[str, Any]]
    ) -> dict[str, Any]:
        """Activation gate on the pilot rows and the treatment arm's executed config."""
        ...

    def eval_probe(self, trainer: ArmTrainer) -> dict[str, Any]:
        """Time a few evaluation items on the pilot's weights: {"eval_s_per_item": ...}."""
        ...

    def feasibility(self, timings: dict[str, Any]) -> dict[str, Any]:
        """Projected cost from the pilot: `timings` has the pilot's metrics `rows`, its
        `pilot_seconds`, `setup_seconds` and the eval probe's `eval_s_per_item`."""
        ...

    def evaluate(self, arm: str, trainer: ArmTrainer) -> list[dict[str, Any]]:
        """Per-item evaluation rows of the arm's final weights ({"id", "correct", ...})."""
        ...

    def decide(self, evals: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
        """Apply the plan's decision rule to the paired evaluation rows; the verdict record."""
        ...

    def environment(self) -> dict[str, Any]:
        """Versions, device and whatever identifies where the run ran (no secrets)."""
        ...
