"""`DefaultComponents`: one run's resources, built once from the plan with losslab's packages.

losses       -> losslab.conformance.arm_losses (the objects both preflight and arms use)
service      -> losslab.backends.get_backend(name).create_service_client()
task         -> losslab.tasks.make_task (checked against eval.n_examples)
trainers     -> losslab.engine.ArmLoop (rl_step) on the service's training clients
evaluation   -> losslab.engine.evaluate
phases       -> losslab.runner.phases.PHASES (each phase reads the resources above)
"""

from __future__ import annotations

import importlib.metadata as md
import logging
import os
import platform
import time
from collections.abc import Mapping
from dataclasses import asdict
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import tinker
import torch
from tinker import types

from losslab.backends import get_backend
from losslab.backends.executed import executed_config
from losslab.checks import PhaseResult
from losslab.conformance.arm_losses import arm_losses
from losslab.engine import ArmLoop, evaluate, evaluation_result
from losslab.plan import load_plan
from losslab.runner import phases as phase_table
from losslab.runner.errors import (
    BackendUnavailable,
    DataError,
    LossBuildError,
    RunError,
    UnsupportedPlan,
)
from losslab.runner.protocols import Phase
from losslab.runner.trainer import BackendArmTrainer, TrainOrder, arm_config, seed_schedule
from losslab.stats.cost import cost_vs_pilot, local_config_and_tokenizer, plan_cost
from losslab.stats.tinker_cost import load_price_table, plan_price_table, tinker_cost
from losslab.tasks import make_task
from losslab.tasks.base import ChatRenderer

EVAL_PROBE_ITEMS = 32
"""Greedy answers timed after the pilot for the feasibility projection. A batching backend's cost
per item falls with the batch, so a probe of 4 overstated a 64-item evaluation about 4x on CPU;
32 (one rollout batch's worth) lands within ~1.5x at the cost of one short generation."""

VERSIONED = ("torch", "transformers", "peft", "tinker", "numpy", "scipy", "reasoning-gym")


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
                        f"{split} item {index + 1} (id {problem.id!r}): its prompt is {n} tokens "
                        f"and the plan lets the model write {budget} more, {n + budget} in all, "
                        f"beyond the model's context of {context} tokens; shorten or remove that "
                        "item, or lower engine.max_tokens / engine.eval_max_tokens"
                    )
    finally:
        quiet.setLevel(level)


class DefaultComponents:
    """Components for `run_plan` from a plan file and a backend name (`losslab.backends.BACKENDS`)."""

    def __init__(
        self,
        plan_file: Path,
        backend: str,
        data: Path | None = None,
        sources: Mapping[str, Path] | None = None,
    ) -> None:
        self.backend_impl = _backend(backend, "")
        # `--source owner/repo=PATH`: checkouts the preflight's references and an arm's pinned
        # loss function are read from instead of losslab's source cache
        self.sources = dict(sources or {})
        self.plan_file = Path(plan_file)
        self.plan = load_plan(self.plan_file)  # PlanError lists every problem, incl. features
        if self.plan.engine.backend is not None:
            _backend(self.plan.engine.backend, "plan engine.backend: ")
        self.backend = backend
        self.data = Path(data) if data is not None else None
        self.run_tag = f"losslab-{int(time.time())}"
        self._train_orders: dict[int, list[Any]] = {}
        self._prompts_checked = False
        self.schedule = seed_schedule(self.plan)
        try:  # the Tinker price table is read now: a bad one is refused before any write
            table = plan_price_table(self.plan.engine.price_table, self.plan_file)
            self._prices = load_price_table(table)
        except ValueError as e:
            raise UnsupportedPlan(f"plan engine.price_table: {e}") from e
        if self.data is not None or not self._task_needs_hub:
            # local files or generated data: checked now, before any run directory or service
            # call; a hub download stays lazy (the first phase that needs the task loads it)
            self.task  # noqa: B018

    @property
    def phases(self) -> tuple[Phase, ...]:
        """The phase table (read at run time, so a row added to `PHASES` is run)."""
        return phase_table.PHASES

    # --- shared resources, created on first use ----------------------------------------------
    @property
    def base_model(self) -> str:
        local = self.plan.engine.local_base_model
        executes_local = self.backend_impl.executes_local_base_model and local
        return local if executes_local else self.plan.base_model

    @cached_property
    def losses(self) -> dict[str, Any]:
        """`{arm: LossFn}` built once from the plan's resolved losses: the preflight checks
        these objects and the arms train them (`losslab.conformance.arm_losses`)."""
        try:
            return arm_losses(self.plan, sources=self.sources)
        except ValueError as e:
            raise LossBuildError(f"the plan's losses cannot be built: {e}") from e

    @cached_property
    def service(self) -> Any:
        try:
            return self.backend_impl.create_service_client()
        except (tinker.TinkerError, OSError, RuntimeError, ValueError) as e:  # key, device
            raise BackendUnavailable(f"backend {self.backend!r} is not available: {e}") from e

    @property
    def _task_needs_hub(self) -> bool:
        return self.plan.task_needs_hub

    @cached_property
    def task(self) -> Any:
        config = dict(self.plan.engine.task_config)
        data = self.data or config.pop("data", None)
        config.pop("data", None)
        # generated tasks make exactly n_test items; a fixed test set keeps its first n_test
        config.setdefault("n_test", self.plan.eval.n_examples)
        try:
            task = make_task(self.plan.task_name, seed=self.plan.arms[0].seed, data=data, **config)
        except (ValueError, TypeError, FileNotFoundError, OSError, RuntimeError) as e:
            raise DataError(f"task {self.plan.task_name!r} could not be built: {e}") from e
        check_task_sizes(task, self.plan.eval.n_examples, data)
        return task

    def train_order(self, seed: int) -> list[Any]:
        """The training problems in the order a unit with `seed` draws them: the task's own order
        for the plan's seed, a seeded permutation of it for every other seed (the test items,
        and so the paired evaluation, stay the same for every seed)."""
        if seed not in self._train_orders:
            train = list(self.task.train)
            if seed != self.plan.arms[0].seed:
                train = [train[i] for i in np.random.default_rng(seed).permutation(len(train))]
            self._train_orders[seed] = train
        return self._train_orders[seed]

    # --- the arms' trainers --------------------------------------------------------------------
    def _create_client(self, arm_name: str) -> Any:
        arm = self.plan.arm(self.schedule.plan_arm(arm_name))
        # adam_params at creation on every backend (TinkerServiceClient keeps them for
        # `optim_step()` and `optimizer_config()`), so the executed-config check reads the plan's
        # optimizer before the first step.
        adam = types.AdamParams(**self.plan.adam_config(arm))
        seed = self.schedule.seeds[arm_name]  # a seed replica's own seed
        try:
            return self.service.create_lora_training_client(
                self.base_model, rank=self.plan.lora_rank, seed=seed, adam_params=adam
            ).result()
        except BackendUnavailable:
            raise
        except (tinker.TinkerError, OSError, RuntimeError, ValueError) as e:
            raise BackendUnavailable(
                f"backend {self.backend!r} could not create a training client for "
                f"{self.base_model!r}: {e}"
            ) from e

    def probe_client(self) -> Any:
        """A fresh training client of the base model that no arm trains (the dispatch
        fingerprint's forward-backward stays in it)."""
        return self._create_client(self.schedule.treatment)

    def make_trainer(self, arm: str) -> BackendArmTrainer:
        config = arm_config(self.plan, self.losses, self.schedule, arm)
        task = self.task
        if config.seed != self.plan.arms[0].seed:  # a seed replica draws its own training order
            task = TrainOrder(self.task, self.train_order(config.seed))
        loop = ArmLoop(self._create_client(arm), task, config)
        if not self._prompts_checked:  # not checked at start: the model's own tokenizer now
            self._check_prompts(loop.renderer)
        return BackendArmTrainer(self.backend_impl, self.run_tag, arm, loop)

    def check_prompts(self) -> None:
        """Refuse (DataError, exit 2) a train or test prompt that does not fit the model's
        context with the tokens the plan lets it write, before any run directory exists: run by
        `run_plan` as soon as the plan is loaded. Done here when the executed model runs on this
        machine (the local backend: the tokenizer and config are read without the weights, the
        context is the in-process service's listing or the tokenizer's) and the data is local
        too; otherwise (a hub-only task, Tinker, whose context is a network call, a model
        not on this machine) `make_trainer` checks with the first trainer's tokenizer."""
        if self._prompts_checked or not self.backend_impl.executes_local_base_model:
            return
        if self.data is None and self._task_needs_hub:  # the hub download stays lazy
            return
        _, tokenizer = local_config_and_tokenizer(self.base_model)
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            return  # not on this machine under that name: checked at the first trainer
        self._check_prompts(ChatRenderer(tokenizer, model_name=self.base_model))

    def _check_prompts(self, renderer: ChatRenderer) -> None:
        context = model_context(self.service, self.base_model, renderer.tokenizer)
        budgets = {"train": self.plan.engine.max_tokens, "test": self.plan.engine.eval_max_tokens}
        check_prompt_lengths(renderer, self.task, context, budgets)
        self._prompts_checked = True

    def executed_config(self, arm: str, trainer: BackendArmTrainer) -> PhaseResult:
        planned = self.plan.adam_config(self.schedule.plan_arm(arm))
        return executed_config(
            trainer.client,
            arm,
            base_model=self.base_model,
            lora_rank=self.plan.lora_rank,
            adam=planned,
        )

    # --- evaluation ----------------------------------------------------------------------------
    def _greedy_eval(self, trainer: BackendArmTrainer, n_items: int) -> list[Any]:
        """Greedy evaluation of the trainer's current weights on the first `n_items` test items."""
        sampler = trainer.client.save_weights_and_get_sampling_client().result()
        max_tokens = self.plan.engine.eval_max_tokens
        problems = self.task.test[:n_items]
        return evaluate(sampler, self.task, problems, trainer.renderer, max_tokens=max_tokens)

    def eval_probe(self, trainer: BackendArmTrainer) -> dict[str, Any]:
        """Seconds per evaluation item, timed on a few test items (for feasibility)."""
        n_items = min(EVAL_PROBE_ITEMS, self.plan.eval.n_examples)
        t0 = time.perf_counter()
        items = self._greedy_eval(trainer, n_items)
        return {
            "eval_s_per_item": (time.perf_counter() - t0) / max(len(items), 1),
            "eval_probe_items": len(items),
        }

    def evaluate_subset(
        self, arm: str, trainer: BackendArmTrainer, n_items: int
    ) -> list[dict[str, Any]]:
        return [asdict(i) for i in self._greedy_eval(trainer, n_items)]

    @property
    def efficiency(self) -> tuple[int, int] | None:
        """(every k rollout steps, items) of the efficiency endpoint, or None when it is off."""
        e = self.plan.engine
        if e.eval_every is None:
            return None
        return e.eval_every, min(e.eval_every_items, self.plan.eval.n_examples)

    def evaluate(self, arm: str, trainer: BackendArmTrainer) -> PhaseResult:
        items = self._greedy_eval(trainer, self.plan.eval.n_examples)
        return evaluation_result([asdict(i) for i in items])

    # --- cost and environment ------------------------------------------------------------------
    @cached_property
    def _cost(self) -> Any:
        return plan_cost(self.plan, task=self.task, base_model=self.base_model)

    @cached_property
    def cost_projection(self) -> dict[str, Any]:
        """The plan-only cost projection (stats.cost) of the model this run executes."""
        try:
            cost = self._cost
        except (ValueError, RunError) as e:  # e.g. a model whose size is unknown offline
            return {"available": False, "reason": str(e)}
        projection = {"available": True, "lines": cost.lines(), **cost.to_dict()}
        if self.backend == "tinker":  # Tinker bills tokens: their counts and dollars beside
            card = tinker_cost(self.plan, cost.prompt.mean_tokens, self._prices)
            projection.update(lines=[*cost.lines(), "", *card.lines()], tinker=card.to_dict())
        return projection

    def cost_beside_pilot(self, wall_seconds: float, gpu_hours: float) -> dict[str, Any]:
        """`cost_projection` with the pilot's projection beside it (feasibility.json)."""
        cost = self.cost_projection
        if not cost.get("available"):
            return cost
        return {**cost, "vs_pilot": cost_vs_pilot(self._cost, wall_seconds, gpu_hours)}

    def environment(self) -> dict[str, Any]:
        versions = {}
        for pkg in VERSIONED:
            try:
                versions[pkg] = md.version(pkg)
            except md.PackageNotFoundError:
                versions[pkg] = None
        return {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "versions": versions,
            "device": self.backend_impl.device(),
            "torch_threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(),
            "base_model": self.base_model,
            "plan_base_model": self.plan.base_model,
            "task": self.plan.task_name,
            "data": str(self.data) if self.data else None,
        }


def _backend(name: str, where: str) -> Any:
    try:
        return get_backend(name)
    except ValueError as e:
        raise UnsupportedPlan(f"{where}{e}") from e
