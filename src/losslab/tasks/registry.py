"""Task by name: `gsm8k`, `arithmetic` (the embedded default) or any reasoning-gym dataset."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from losslab.tasks.base import Task
from losslab.tasks.gsm8k import Gsm8kTask
from losslab.tasks.procedural import ReasoningGymTask, arithmetic_task

__all__ = ["make_task"]

_RG_PREFIXES = ("reasoning_gym:", "reasoning-gym:", "rg:")


def make_task(name: str, *, seed: int = 0, data: str | Path | None = None, **config: Any) -> Task:
    """Build a task from its name.

    - `gsm8k` (also `openai/gsm8k`): cookbook math_rl GSM8K; `data` is the `--data` path;
      `config` may set `n_train`, `n_test`, `format_coef`.
    - `arithmetic`: the embedded default (2-term single-digit `chain_sum`); `config` may set
      `n_test`, `n_train`, `suffix`, `format_coef`.
    - `reasoning_gym:<dataset>` (or `rg:<dataset>`): any reasoning-gym dataset; `config` holds
      `ReasoningGymTask` fields (`n_test`, `suffix`, ...) and the dataset's own options under
      `dataset_config`.
    """
    key = name.strip()
    if key.lower() in ("gsm8k", "openai/gsm8k"):
        return Gsm8kTask(seed=seed, data=data, **config)
    if data is not None:
        raise ValueError(f"task {name!r} is generated offline; --data applies only to gsm8k")
    if key.lower() == "arithmetic":
        return arithmetic_task(seed=seed, **config)
    for prefix in _RG_PREFIXES:
        if key.lower().startswith(prefix):
            dataset = key[len(prefix) :]
            options = dict(config)
            dataset_config = options.pop("dataset_config", {})
            return ReasoningGymTask(dataset=dataset, config=dataset_config, seed=seed, **options)
    raise ValueError(
        f"unknown task {name!r}: expected 'gsm8k', 'arithmetic' or 'reasoning_gym:<dataset>'"
    )
