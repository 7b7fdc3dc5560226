"""Task by name: `gsm8k`, `arithmetic` (the embedded default) or any reasoning-gym dataset.

`TASKS` is the one table of task names; adding a task is one module with a class satisfying
`losslab.tasks.base.Task` plus one line here (docs/contributing.md).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from losslab.tasks.base import Task
from losslab.tasks.gsm8k import Gsm8kTask
from losslab.tasks.procedural import ReasoningGymTask, arithmetic_task

__all__ = ["TASKS", "TASK_PREFIXES", "make_task"]

TaskFactory = Callable[..., Task]
"""`factory(seed=..., **config) -> Task`; `data` (the `--data` folder) is passed only to
tasks registered with `reads_data=True`."""

TASKS: dict[str, tuple[TaskFactory, bool]] = {
    "gsm8k": (Gsm8kTask, True),
    "openai/gsm8k": (Gsm8kTask, True),
    "arithmetic": (arithmetic_task, False),
}
"""Task name (lower case) -> (factory, reads_data). `config` is the plan's `engine.task_config`
(plus `n_test`): GSM8K takes `n_train`, `n_test`, `format_coef`; arithmetic takes `n_test`,
`n_train`, `suffix`, `format_coef`."""


def _reasoning_gym(dataset: str, *, seed: int, **config: Any) -> Task:
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


def make_task(name: str, *, seed: int = 0, data: str | Path | None = None, **config: Any) -> Task:
    """Build the task `name` (a `TASKS` name or a `TASK_PREFIXES` prefix + dataset)."""
    key = name.strip()
    if key.lower() in TASKS:
        factory, reads_data = TASKS[key.lower()]
        if reads_data:
            return factory(seed=seed, data=data, **config)
        if data is not None:
            raise ValueError(f"task {name!r} is generated offline; --data does not apply to it")
        return factory(seed=seed, **config)
    for prefix, factory in TASK_PREFIXES.items():
        if key.lower().startswith(prefix):
            if data is not None:
                raise ValueError(f"task {name!r} is generated offline; --data does not apply to it")
            return factory(key[len(prefix) :], seed=seed, **config)
    names = ", ".join(repr(n) for n in TASKS) + " or " + "|".join(TASK_PREFIXES) + "<dataset>"
    raise ValueError(f"unknown task {name!r}: expected {names}")
