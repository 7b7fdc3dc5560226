"""The runner's seams: a `Phase` (a row of the phase table), the `PhaseContext` a phase runs in,
and the `Components` of one run.

`_Runner` (runner/run.py) iterates `Components.phases` in order; each phase's `run(ctx)` returns a
`losslab.checks.PhaseResult` that the runner records and judges. `Components` are the run's
resources: the schedule, the arms' trainers, their evaluation and executed configuration, and
the environment; `losslab.runner.components.DefaultComponents` builds them from the plan with
losslab's own packages (its table is `losslab.runner.phases.PHASES`). Keeping them behind these
seams lets a test drive the whole run-directory, checkpoint and resume machinery with a fake in
a fraction of a second.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from losslab.checks import PhaseResult
from losslab.runner.rundir import RunDir


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
    """One run's resources; every phase and check result is a `losslab.checks.PhaseResult`."""

    schedule: Schedule

    @property
    def phases(self) -> Sequence[Phase]:
        """The phase table the runner iterates, in order (`losslab.runner.phases.PHASES`)."""
        ...

    def make_trainer(self, arm: str) -> ArmTrainer: ...

    def executed_config(self, arm: str, trainer: ArmTrainer) -> PhaseResult:
        """The backend's executed configuration of the arm against the plan: the artifact is
        `{key: {"plan", "executed", "match"}}` (executed_config.json[arm]), a check per key."""
        ...

    def eval_probe(self, trainer: ArmTrainer) -> dict[str, Any]:
        """Time a few evaluation items on the pilot's weights: {"eval_s_per_item": ...}."""
        ...

    def evaluate_subset(self, arm: str, trainer: ArmTrainer, n_items: int) -> list[dict[str, Any]]:
        """The trainer's current weights on the first `n_items` test items: per-item rows (the
        efficiency endpoint's evaluations during training, `engine.eval_every`)."""
        ...

    def evaluate(self, arm: str, trainer: ArmTrainer) -> PhaseResult:
        """The arm's final weights on the test items: the artifact is its per-item rows
        ({"id", "correct", ...}, eval_<arm>.jsonl)."""
        ...

    def environment(self) -> dict[str, Any]:
        """Versions, device and whatever identifies where the run ran (no secrets)."""
        ...


class PhaseContext(Protocol):
    """What a phase may use of the running run (`_Runner` is one): its components and
    schedule, the records of the phases it needs, the pilot's rows and the trainers.

    Training goes through `train`, which checkpoints every step and writes the arm's
    metrics.jsonl (the one writer); `open_trainer` records and checks the executed config.
    """

    comp: Any  # the run's Components; the default phases read DefaultComponents' resources
    schedule: Schedule
    run_dir: RunDir  # paths of the run directory

    def log(self, message: str) -> None: ...

    def record(self, phase: str) -> dict[str, Any]:
        """The manifest entry of an earlier phase (status, seconds and its facts)."""
        ...

    def intact(self, path: Path) -> bool:
        """Whether an artifact reads back; a damaged one is set aside (then False)."""
        ...

    def write_rows(self, path: Path, rows: list[dict[str, Any]]) -> None:
        """Write a JSON-lines artifact (eval_<arm>.jsonl) and enter it in the manifest's ledger."""
        ...

    def metrics_rows(self, arm: str) -> list[dict[str, Any]]: ...

    def pilot_rows(self) -> list[dict[str, Any]]:
        """The treatment arm's first `pilot_steps` metrics rows."""
        ...

    def executed(self, arm: str) -> dict[str, Any]:
        """The arm's recorded executed configuration ({} before its trainer was opened)."""
        ...

    def train(
        self, arm: str, until: int, before_close: Callable[[ArmTrainer], None] | None = None
    ) -> float:
        """Train `arm` to `until` completed steps from its newest checkpoint; setup seconds."""
        ...

    def checkpoint(self, arm: str) -> Any:
        """The arm's newest intact `Checkpoint`, or None."""
        ...

    def open_trainer(self, arm: str) -> ArmTrainer:
        """Seed and create the arm's trainer; record and check its executed configuration."""
        ...


@dataclass(frozen=True)
class Phase:
    """One row of the phase table.

    Args:
        name: the phase's name in manifest.json, the log and the report.
        run: `run(ctx) -> PhaseResult`; it may raise `RunError` with a message for the user.
        needs: the phases whose records it reads; each must stand earlier in the table.
        artifact: the run-directory path its `PhaseResult.record()` is written to (JSON); None:
            the record (an object) is kept in its manifest entry.
        outputs: further files it writes itself, by schedule (the evaluation's
            eval_<arm>.jsonl); a resumed run redoes a done phase whose outputs are damaged.
    """

    name: str
    run: Callable[[PhaseContext], PhaseResult]
    needs: tuple[str, ...] = ()
    artifact: str | None = None
    outputs: Callable[[Schedule], Sequence[str]] | None = None

    def files(self, schedule: Schedule) -> list[str]:
        """Every file the phase leaves (its artifact first)."""
        own = list(self.outputs(schedule)) if self.outputs is not None else []
        return ([self.artifact] if self.artifact else []) + own


def check_table(phases: Sequence[Phase]) -> tuple[Phase, ...]:
    """The table, refused with the row at fault when a name repeats or a phase needs one that
    does not stand before it."""
    seen: list[str] = []
    for phase in phases:
        if phase.name in seen:
            raise ValueError(f"phase table: {phase.name!r} appears twice")
        missing = [n for n in phase.needs if n not in seen]
        if missing:
            raise ValueError(
                f"phase table: {phase.name!r} needs {missing}, which must stand before it "
                f"(order: {[p.name for p in phases]})"
            )
        seen.append(phase.name)
    return tuple(phases)
