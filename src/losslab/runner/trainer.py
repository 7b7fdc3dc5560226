"""The arms as trained units: the schedule of (plan arm, seed) units, each unit's engine
configuration, and its trainer (the engine's `ArmLoop` on a backend's training client).

The data cursor is the step index, so the weights, the optimizer state and the step index are
the whole state (`runner.checkpoint` adds the RNG states and metrics rows).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import tinker

from losslab.backends.protocols import Backend
from losslab.engine import ArmConfig, ArmLoop, NonFiniteError, side_losses_for
from losslab.losses import as_tinker_loss_fn
from losslab.losses.tinker_builtins import builtin_request
from losslab.runner.errors import BackendUnavailable, RunError
from losslab.runner.protocols import Schedule
from losslab.stats.feasibility import training_units


def seed_schedule(plan: Any) -> Schedule:
    """The plan's schedule. One seed: the plan's arms. Several (decision_rule.seeds): one pair
    per seed, seed-major; a plan arm keeps its name at its own seed and is `<arm>.seed<s>` at
    every other seed."""
    # the same units the feasibility projection counts (stats.feasibility.training_units)
    units = {unit: (arm, seed) for unit, arm, seed in training_units(plan)}
    return Schedule(
        arms=tuple(units),
        treatment=plan.arm_roles()["treatment"],
        steps=plan.rollout_steps,
        pilot_steps=min(plan.engine.pilot_steps, plan.rollout_steps),
        seeds={u: seed for u, (_, seed) in units.items()},
        units={u: arm for u, (arm, _) in units.items() if u != arm},
    )


def arm_config(plan: Any, losses: dict[str, Any], schedule: Schedule, unit: str) -> ArmConfig:
    """The engine's configuration of a trained unit: its plan arm's loss object (`losses`, the
    ones the preflight checks), optimizer and sampling settings, and its seed; the treatment
    arm also carries the side losses the gate reads on the same batches."""
    arm = plan.arm(schedule.plan_arm(unit))
    eng, loss = plan.engine, losses[arm.name]
    side = {}
    if unit == schedule.treatment:
        side = {
            role: as_tinker_loss_fn(losses[plan.arm(role).name])
            for role in side_losses_for(plan.gate_metrics())
        }
    adam = plan.adam_config(arm)
    builtin = None
    if plan.engine.loss_path == "builtin":  # plan check made sure a built-in computes it
        builtin = builtin_request(loss.name, loss.params)
    return ArmConfig(
        name=unit,
        loss_fn=as_tinker_loss_fn(loss),
        loss_name=loss.name,
        seed=schedule.seeds[unit],
        **{k: adam[k] for k in ("learning_rate", "beta1", "beta2", "eps", "weight_decay")},
        group_size=eng.group_size,
        groups_per_batch=eng.groups_per_batch,
        temperature=eng.temperature,
        max_tokens=eng.max_tokens,
        updates_per_batch=arm.updates_per_batch,
        side_losses=side,
        builtin=builtin,
    )


@contextmanager
def backend_errors(backend: str, what: str) -> Iterator[None]:
    """Turn a backend's connection, service and numeric failures into one-line run errors."""
    try:
        yield
    except NonFiniteError as e:
        raise RunError(f"{what}: {e}") from e
    except (tinker.TinkerError, ConnectionError, TimeoutError) as e:
        raise BackendUnavailable(f"backend {backend!r} failed during {what}: {e}") from e


class BackendArmTrainer:
    """One arm (`runner.protocols.ArmTrainer`): `step(i)` is `ArmLoop.step(i)` (one
    `engine.rl_step`); the backend saves and loads the client's weights and optimizer state.
    With several seeds, `arm` is a trained unit whose seed picks the training order and the
    sampling seeds it shares with its pair."""

    def __init__(self, backend: Backend, run_tag: str, arm: str, loop: ArmLoop) -> None:
        self.backend, self.run_tag, self.arm, self.loop = backend, run_tag, arm, loop
        self.client, self.renderer = loop.client, loop.renderer

    def step(self, step: int) -> dict[str, Any]:
        if step != self.loop.next_step:
            raise RunError(
                f"arm {self.arm}: asked for step {step}, the state is at {self.loop.next_step}"
            )
        with backend_errors(self.backend.name, f"arm {self.arm} step {step}"):
            return self.loop.step(step)

    @property
    def cursor(self) -> dict[str, Any]:
        return {"next_step": self.loop.next_step}

    def save(self, folder: Path) -> dict[str, Any]:
        name = f"{self.run_tag}-{self.arm}-step{self.loop.next_step:04d}"
        with backend_errors(self.backend.name, f"saving {name}"):
            return self.backend.save_checkpoint(self.client, folder, name)

    def load(self, folder: Path, info: dict[str, Any], cursor: dict[str, Any]) -> None:
        with backend_errors(self.backend.name, f"loading the checkpoint in {folder}"):
            self.backend.load_checkpoint(self.client, folder, info)
        self.loop.next_step = int(cursor["next_step"])

    def close(self) -> None:
        self.client = None
        self.loop.client = None


def seed_train_order(train: Sequence[Any], seed: int, task_seed: int) -> list[Any]:
    """The training problems in the order a unit with `seed` draws them: the task's own order
    at the task's seed `task_seed`, a permutation of it seeded with `seed` otherwise."""
    order = list(train)
    if seed != task_seed:
        order = [order[i] for i in np.random.default_rng(seed).permutation(len(order))]
    return order


class TrainOrder:
    """The task with another training order (a seed replica's); everything else is the task's."""

    def __init__(self, task: Any, train: list[Any]) -> None:
        self._task, self.train = task, train

    def __getattr__(self, name: str) -> Any:
        return getattr(self._task, name)
