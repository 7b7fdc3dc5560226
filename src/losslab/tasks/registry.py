"""Task by name: `gsm8k`, `arithmetic` (the embedded default) or any reasoning-gym dataset.

`TASKS` is the one table of task names. Each line declares a task: the factory that builds it
(`module:attribute`, imported on first use) and what the plan layer checks without importing it
(its hub dataset, its fixed test-split size). Stdlib only, so `losslab plan check` reads it
without torch, tinker or datasets. Adding a task is one module with a class satisfying
`losslab.tasks.base.Task` plus one line here (docs/contributing.md).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: the table must stay readable without the tasks' deps
    from losslab.tasks.base import Task

__all__ = ["TASKS", "TASK_PREFIXES", "TaskDeclaration", "make_task", "task_declaration"]

TaskFactory = Callable[..., "Task"]
"""`factory(seed=..., **config) -> Task`; `data` (the `--data` folder) is passed only to
tasks declared with `reads_data=True`."""


@dataclass(frozen=True)
class TaskDeclaration:
    """One task as the registry declares it.

    Args:
        factory: `module:attribute` of its `TaskFactory`, imported when the task is built.
        reads_data: the factory takes `data` (the `--data` folder, or `engine.task_config.data`).
        hub_path: the hub dataset it downloads when given no data (the plan's `dataset.hf_path`
            is checked against it); None: generated offline.
        test_size: items in its fixed test split (`eval.n_examples` may not exceed it); None:
            the test split is generated to `n_test` items.
    """

    factory: str
    reads_data: bool = False
    hub_path: str | None = None
    test_size: int | None = None

    @property
    def needs_hub(self) -> bool:
        """Whether building it without data downloads from the hub (or reads the hub cache)."""
        return self.hub_path is not None

    def load_factory(self) -> TaskFactory:
        module, _, attribute = self.factory.partition(":")
        return getattr(importlib.import_module(module), attribute)


_GSM8K = TaskDeclaration(
    "losslab.tasks.gsm8k:Gsm8kTask", reads_data=True, hub_path="openai/gsm8k", test_size=1319
)  # main/test has 1319 items

TASKS: dict[str, TaskDeclaration] = {
    "gsm8k": _GSM8K,
    "openai/gsm8k": _GSM8K,
    "arithmetic": TaskDeclaration("losslab.tasks.procedural:arithmetic_task"),
}
"""Task name (lower case) -> its declaration. `config` is the plan's `engine.task_config`
(plus `n_test`): GSM8K takes `n_train`, `n_test`, `format_coef`; arithmetic takes `n_test`,
`n_train`, `suffix`, `format_coef`."""


def _reasoning_gym(dataset: str, *, seed: int, **config: Any) -> Task:
    from losslab.tasks.procedural import ReasoningGymTask  # reasoning-gym loads on use only

    options = dict(config)
    dataset_config = options.pop("dataset_config", {})
    return ReasoningGymTask(dataset=dataset, config=dataset_config, seed=seed, **options)


TASK_PREFIXES: dict[str, Callable[..., Task]] = {
    "reasoning_gym:": _reasoning_gym,
    "reasoning-gym:": _reasoning_gym,
    "rg:": _reasoning_gym,
}
"""`<prefix><dataset>` -> `factory(dataset, seed=..., **config)` (offline, never reads data):
any reasoning-gym dataset; `config` holds `ReasoningGymTask` fields (`n_test`, `suffix`, ...)
and the dataset's own options under `dataset_config`."""


def task_declaration(name: str) -> TaskDeclaration | None:
    """The `TASKS` declaration of task `name` (any case); None for a `TASK_PREFIXES` task
    (generated offline) or an unknown name (`make_task` says which names exist)."""
    return TASKS.get(name.strip().lower())


def make_task(name: str, *, seed: int = 0, data: str | Path | None = None, **config: Any) -> Task:
    """Build the task `name` (a `TASKS` name or a `TASK_PREFIXES` prefix + dataset)."""
    key = name.strip()
    declaration = task_declaration(key)
    if declaration is not None:
        factory = declaration.load_factory()
        if declaration.reads_data:
            return factory(seed=seed, data=data, **config)
        if data is not None:
            raise ValueError(f"task {name!r} is generated offline; --data does not apply to it")
        return factory(seed=seed, **config)
    for prefix, prefix_factory in TASK_PREFIXES.items():
        if key.lower().startswith(prefix):
            if data is not None:
                raise ValueError(f"task {name!r} is generated offline; --data does not apply to it")
            return prefix_factory(key[len(prefix) :], seed=seed, **config)
    names = ", ".join(repr(n) for n in TASKS) + " or " + "|".join(TASK_PREFIXES) + "<dataset>"
    raise ValueError(f"unknown task {name!r}: expected {names}")
