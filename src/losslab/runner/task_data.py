"""The run's task as data: built from the plan (`--data` or the plan's task config), checked
against `eval.n_examples` and, once a tokenizer exists, against the model's context; every
refusal is a `DataError` (exit 2) naming the item and the numbers, before any step runs.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from losslab.runner.errors import DataError
from losslab.stats.cost import local_config_and_tokenizer
from losslab.tasks import make_task


def build_task(plan: Any, data: Path | None) -> Any:
    """The plan's task (`--data` wins over the plan's `engine.task_config.data`), with exactly
    `eval.n_examples` test items (`check_task_sizes`)."""
    config = dict(plan.engine.task_config)
    data = data or config.pop("data", None)
    config.pop("data", None)
    # generated tasks make exactly n_test items; a fixed test set keeps its first n_test
    config.setdefault("n_test", plan.eval.n_examples)
    try:
        task = make_task(plan.task_name, seed=plan.arms[0].seed, data=data, **config)
    except (ValueError, TypeError, FileNotFoundError, OSError, RuntimeError) as e:
        raise DataError(f"task {plan.task_name!r} could not be built: {e}") from e
    check_task_sizes(task, plan.eval.n_examples, data)
    return task


def check_task_sizes(task: Any, n_eval: int, data: Any) -> None:
    """Refuse a task with fewer test items than `eval.n_examples`: the verdict's n is planned,
    so a smaller test set is an error, never a silently smaller n."""
    have = len(task.test)
    if have < n_eval:
        source = f"--data {data}" if data else f"task {getattr(task, 'name', '?')!r}"
        raise DataError(
            f"{source} has {have} test items but the plan's eval.n_examples is {n_eval}; "
            f"supply the full test split, or set eval.n_examples to {have} in the plan (the "
            "decision rule's interval then widens accordingly)"
        )
    if not task.train:
        raise DataError(f"task {getattr(task, 'name', '?')!r} has no training problems")


UNKNOWN_CONTEXT = 10**9
"""A tokenizer's `model_max_length` at or above this is transformers' "no limit" placeholder."""


def model_context(service: Any, base_model: str, tokenizer: Any) -> int | None:
    """The model's context length in tokens: what the service lists for `base_model`
    (`get_server_capabilities`), else the tokenizer's `model_max_length`; None when neither
    says (then prompt lengths are not checked up front)."""
    try:
        caps = service.get_server_capabilities()
        for model in getattr(caps, "supported_models", None) or []:
            length = getattr(model, "max_context_length", None)
            if getattr(model, "model_name", None) == base_model and isinstance(length, int):
                return length
    except Exception:  # a service without the call: fall back to the tokenizer
        pass
    length = getattr(tokenizer, "model_max_length", None)
    return length if isinstance(length, int) and 0 < length < UNKNOWN_CONTEXT else None


def check_prompt_lengths(
    renderer: Any, task: Any, context: int | None, budgets: dict[str, int]
) -> None:
    """Refuse (DataError, exit 2) the first train or test item whose prompt plus the tokens the
    plan lets the model write (`budgets`: split -> max_tokens) does not fit in the model's
    context, naming the split, the item and the numbers; before, it failed inside the pilot."""
    if context is None:
        return
    # transformers warns "Token indices sequence length is longer than the specified maximum"
    # for such a prompt: that is what this check reports, by item, so its warning is held back
    quiet = logging.getLogger("transformers.tokenization_utils_base")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        for split, problems in (("train", task.train), ("test", task.test)):
            budget = budgets[split]
            for index, problem in enumerate(problems):
                n = renderer.build_prompt(task.messages(problem)).length
                if n + budget > context:
                    raise DataError(
                        f"{split} item {index + 1} (id {problem.id!r}): its prompt is {n} tokens and "
                        f"the plan lets the model write {budget} more, {n + budget} in all, beyond "
                        f"the model's context of {context} tokens; shorten or remove that item, or "
                        "lower engine.max_tokens / engine.eval_max_tokens"
                    )
    finally:
        quiet.setLevel(level)


def check_prompts_fit(service: Any, base_model: str, renderer: Any, task: Any, plan: Any) -> None:
    """`check_prompt_lengths` at the model's context (`model_context`) with the plan's budgets:
    `engine.max_tokens` for train items, `engine.eval_max_tokens` for test items."""
    context = model_context(service, base_model, renderer.tokenizer)
    budgets = {"train": plan.engine.max_tokens, "test": plan.engine.eval_max_tokens}
    check_prompt_lengths(renderer, task, context, budgets)


def local_tokenizer(base_model: str, data: Path | None, plan: Any) -> Any:
    """The executed model's tokenizer read from this machine without its weights
    (`stats.cost.local_config_and_tokenizer`, never a download), so prompt lengths can be
    checked before any work; None when it cannot be had yet: a hub-only task (its download
    stays lazy), or a model not on this machine under that name (then `make_trainer` checks
    with the first trainer's tokenizer; on Tinker the context is a network call)."""
    if data is None and plan.task_needs_hub:
        return None
    _, tokenizer = local_config_and_tokenizer(base_model)
    return (
        tokenizer if tokenizer is not None and getattr(tokenizer, "chat_template", None) else None
    )
