"""`DefaultComponents`: one run's resources, built once from the plan with losslab's packages.

losses       -> losslab.conformance.arm_losses (the objects both preflight and arms use)
service      -> losslab.backends.get_backend(name).create_service_client()
task         -> losslab.runner.task_data.build_task (checked against eval.n_examples and,
                at the first trainer, the model's context)
trainers     -> losslab.engine.ArmLoop (rl_step) on the service's training clients
evaluation   -> losslab.engine.evaluate_weights
environment  -> losslab.runner.startup.environment_record
phases       -> losslab.runner.phases.PHASES (each phase reads the resources above)
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict
from functools import cached_property
from pathlib import Path
from typing import Any

import tinker
from tinker import types

from losslab.backends import get_backend
from losslab.backends.executed import executed_config
from losslab.checks import PhaseResult
from losslab.conformance.arm_losses import arm_losses
from losslab.engine import EVAL_PROBE_ITEMS, ArmLoop, evaluate_weights, evaluation_result
from losslab.plan import load_plan
from losslab.runner import phases as phase_table
from losslab.runner.errors import BackendUnavailable, LossBuildError, RunError, UnsupportedPlan
from losslab.runner.protocols import Phase
from losslab.runner.startup import environment_record
from losslab.runner.task_data import build_task, check_prompts_fit, local_tokenizer
from losslab.runner.trainer import (
    BackendArmTrainer,
    TrainOrder,
    arm_config,
    seed_schedule,
    seed_train_order,
)
from losslab.stats.cost import cost_vs_pilot, plan_cost
from losslab.stats.tinker_cost import load_price_table, plan_price_table, tinker_cost
from losslab.tasks.base import ChatRenderer


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
        if self.data is not None or not self.plan.task_needs_hub:
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

    @cached_property
    def task(self) -> Any:
        return build_task(self.plan, self.data)

    def train_order(self, seed: int) -> list[Any]:
        """The training problems in the order a unit with `seed` draws them: the task's own order
        for the plan's seed, a seeded permutation of it for every other seed (the test items,
        and so the paired evaluation, stay the same for every seed)."""
        if seed not in self._train_orders:
            self._train_orders[seed] = seed_train_order(
                self.task.train, seed, self.plan.arms[0].seed
            )
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
        if not self._prompts_checked:  # the first moment model (tokenizer) and data both exist
            check_prompts_fit(self.service, self.base_model, loop.renderer, self.task, self.plan)
            self._prompts_checked = True
        return BackendArmTrainer(self.backend_impl, self.run_tag, arm, loop)

    def check_prompts(self) -> None:
        """Refuse a prompt beyond the model's context before any run directory exists (run by
        `run_plan` once the plan is loaded; `task_data.local_tokenizer` says when it can be)."""
        if self._prompts_checked or not self.backend_impl.executes_local_base_model:
            return
        tokenizer = local_tokenizer(self.base_model, self.data, self.plan)
        if tokenizer is not None:
            renderer = ChatRenderer(tokenizer, model_name=self.base_model)
            check_prompts_fit(self.service, self.base_model, renderer, self.task, self.plan)
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
        max_tokens = self.plan.engine.eval_max_tokens
        return evaluate_weights(trainer.client, self.task, trainer.renderer, n_items, max_tokens)

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
        return environment_record(
            self.backend_impl.device(),
            base_model=self.base_model,
            plan_base_model=self.plan.base_model,
            task=self.plan.task_name,
            data=str(self.data) if self.data else None,
        )


def _backend(name: str, where: str) -> Any:
    try:
        return get_backend(name)
    except ValueError as e:
        raise UnsupportedPlan(f"{where}{e}") from e
