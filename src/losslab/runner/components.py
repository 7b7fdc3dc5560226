"""`DefaultComponents`: the run phases wired to losslab's own packages.

    preflight    -> losslab.conformance.preflight.run_preflight
    restoration  -> losslab.backends.restoration.restoration_preflight
    trainers     -> losslab.backends.get_backend(name) + losslab.engine.ArmLoop (rl_step)
    losses       -> losslab.conformance.arm_losses (the objects both preflight and arms use)
    gate         -> losslab.engine.pilot_metrics + losslab.stats.gate.evaluate_gate
    feasibility  -> losslab.stats.feasibility.project_feasibility
    evaluation   -> losslab.engine.evaluate
    decision     -> losslab.stats.decision.decide

Every check artifact gets the runner's common shape: `passed`, `checks` (rows of check,
measured, bound, passed) and `failures`, next to the producing module's own full record.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from losslab.runner.errors import BackendUnavailable, DataError, RunError, UnsupportedPlan
from losslab.runner.protocols import Schedule

EVAL_PROBE_ITEMS = 32
"""Greedy answers timed after the pilot for the feasibility projection. A batching backend's cost
per item falls with the batch, so a probe of 4 overstated a 64-item evaluation about 4x on CPU;
32 (one rollout batch's worth) lands within ~1.5x at the cost of one short generation."""


@contextmanager
def backend_errors(backend: str, what: str) -> Iterator[None]:
    """Turn a backend's connection, service and numeric failures into one-line run errors."""
    import tinker

    from losslab.engine import NonFiniteError

    try:
        yield
    except NonFiniteError as e:
        raise RunError(f"{what}: {e}") from e
    except (tinker.TinkerError, ConnectionError, TimeoutError) as e:
        raise BackendUnavailable(f"backend {backend!r} failed during {what}: {e}") from e


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


def _rows_failures(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if not r["passed"]]


def _violations_note(check: dict[str, Any]) -> str:
    """`violations` is a count of elements outside atol + rtol*|ref| (conformance.metrics)."""
    n = int(check.get("violations") or 0)
    parts = [f"{n} element(s) outside tolerance"] if n else []
    if check.get("cosine_ok") is False:
        parts.append("cosine below min_cosine")
    return "; ".join(parts)


def _not_applicable(why: str) -> dict[str, Any]:
    return {"passed": True, "applicable": False, "checks": [], "failures": [], "note": why}


class BackendArmTrainer:
    """One arm: the engine's `ArmLoop` on a backend's training client, plus checkpoints.

    `step(i)` is `ArmLoop.step(i)` (one `engine.rl_step`); the backend saves and loads the
    client's weights and optimizer state. The data cursor is the step index, so the weights,
    the optimizer state and the step index are the whole state. With several seeds, `arm` is a
    trained unit and its seed picks the training order and sampling seeds it shares with its pair.
    """

    def __init__(self, comp: DefaultComponents, arm: str, loop: Any) -> None:
        self.comp, self.arm, self.loop = comp, arm, loop
        self.client, self.renderer = loop.client, loop.renderer

    def step(self, step: int) -> dict[str, Any]:
        if step != self.loop.next_step:
            raise RunError(
                f"arm {self.arm}: asked for step {step}, the state is at {self.loop.next_step}"
            )
        with backend_errors(self.comp.backend, f"arm {self.arm} step {step}"):
            return self.loop.step(step)

    @property
    def cursor(self) -> dict[str, Any]:
        return {"next_step": self.loop.next_step}

    def save(self, folder: Path) -> dict[str, Any]:
        name = f"{self.comp.run_tag}-{self.arm}-step{self.loop.next_step:04d}"
        with backend_errors(self.comp.backend, f"saving {name}"):
            return self.comp.backend_impl.save_checkpoint(self.client, folder, name)

    def load(self, folder: Path, info: dict[str, Any], cursor: dict[str, Any]) -> None:
        with backend_errors(self.comp.backend, f"loading the checkpoint in {folder}"):
            self.comp.backend_impl.load_checkpoint(self.client, folder, info)
        self.loop.next_step = int(cursor["next_step"])

    def close(self) -> None:
        self.client = None
        self.loop.client = None


class _TrainOrder:
    """The task with another training order (a seed replica's); everything else is the task's."""

    def __init__(self, task: Any, train: list[Any]) -> None:
        self._task, self.train = task, train

    def __getattr__(self, name: str) -> Any:
        return getattr(self._task, name)


def seed_units(plan: Any) -> dict[str, tuple[str, int]]:
    """Trained unit -> (plan arm, seed). One seed: the plan's arms. Several (decision_rule.seeds):
    one pair per seed, seed-major; a plan arm keeps its name at its own seed and is
    `<arm>.seed<s>` at every other seed."""
    seeds = list(dict.fromkeys(plan.decision_rule.seeds))
    if len(seeds) <= 1:
        return {a.name: (a.name, a.seed) for a in plan.arms}
    return {
        (a.name if s == a.seed else f"{a.name}.seed{s}"): (a.name, s)
        for s in seeds
        for a in plan.arms
    }


class DefaultComponents:
    """Components for `run_plan` from a plan file and a backend name (`losslab.backends.BACKENDS`)."""

    def __init__(self, plan_file: Path, backend: str, data: Path | None = None) -> None:
        from losslab.backends import get_backend
        from losslab.plan import load_plan

        try:
            self.backend_impl = get_backend(backend)
        except ValueError as e:
            raise UnsupportedPlan(str(e)) from e
        self.plan_file = Path(plan_file)
        self.plan = load_plan(self.plan_file)  # PlanError lists every problem, incl. features
        hint = self.plan.engine.backend
        if hint is not None:
            try:
                get_backend(hint)
            except ValueError as e:
                raise UnsupportedPlan(f"plan engine.backend: {e}") from e
        self.backend = backend
        self.data = Path(data) if data is not None else None
        self.run_tag = f"losslab-{int(time.time())}"
        self._train_orders: dict[int, list[Any]] = {}
        roles = self.plan.arm_roles()
        steps = self.plan.rollout_steps
        units = seed_units(self.plan)
        self.schedule = Schedule(
            arms=tuple(units),
            treatment=roles["treatment"],
            steps=steps,
            pilot_steps=min(self.plan.engine.pilot_steps, steps),
            seeds={u: seed for u, (_, seed) in units.items()},
            units={u: arm for u, (arm, _) in units.items() if u != arm},
        )
        if self.data is not None or not self._task_needs_hub:
            # local files or generated data: checked now, before any run directory or service
            # call; a hub download stays lazy (the first phase that needs the task loads it)
            self.task  # noqa: B018

    # --- shared resources, created on first use ----------------------------------------------
    @property
    def base_model(self) -> str:
        local = self.plan.engine.local_base_model
        return (
            local
            if (self.backend_impl.executes_local_base_model and local)
            else self.plan.base_model
        )

    @cached_property
    def losses(self) -> dict[str, Any]:
        """`{arm: LossFn}` built once from the plan's resolved losses: the preflight checks
        these objects and the arms train them (`losslab.conformance.arm_losses`)."""
        from losslab.conformance.arm_losses import arm_losses

        try:
            return arm_losses(self.plan)
        except ValueError as e:
            raise RunError(f"the plan's losses cannot be built: {e}") from e

    @cached_property
    def service(self) -> Any:
        import tinker

        try:
            return self.backend_impl.create_service_client()
        except (tinker.TinkerError, OSError, RuntimeError, ValueError) as e:  # key, device
            raise BackendUnavailable(f"backend {self.backend!r} is not available: {e}") from e

    @property
    def _task_needs_hub(self) -> bool:
        return self.plan.task_needs_hub

    @cached_property
    def task(self) -> Any:
        from losslab.tasks import make_task

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
            import numpy as np

            train = list(self.task.train)
            if seed != self.plan.arms[0].seed:
                train = [train[i] for i in np.random.default_rng(seed).permutation(len(train))]
            self._train_orders[seed] = train
        return self._train_orders[seed]

    def _create_client(self, arm_name: str) -> Any:
        import tinker
        from tinker import types

        arm = self.plan.arm(self.schedule.plan_arm(arm_name))
        seed = self.schedule.seeds[arm_name]  # a seed replica's own seed
        # adam_params at creation on every backend (TinkerServiceClient keeps them for
        # `optim_step()` and `optimizer_config()`), so the executed-config check reads the plan's
        # optimizer before the first step.
        adam = types.AdamParams(**self.plan.adam_config(arm))
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

    def _arm_config(self, arm_name: str) -> Any:
        from losslab.engine import ArmConfig, side_losses_for
        from losslab.losses import as_tinker_loss_fn
        from losslab.plan import GATE_METRICS

        arm = self.plan.arm(self.schedule.plan_arm(arm_name))
        eng = self.plan.engine
        adam = self.plan.adam_config(arm)
        loss = self.losses[arm.name]
        side = {}
        if arm_name == self.schedule.treatment:  # the gate reads side losses on the same batches
            side = {
                role: as_tinker_loss_fn(self.losses[self.plan.arm(role).name])
                for role in side_losses_for(GATE_METRICS)
            }
        return ArmConfig(
            name=arm_name,
            loss_fn=as_tinker_loss_fn(loss),
            loss_name=loss.name,
            seed=self.schedule.seeds[arm_name],
            learning_rate=adam["learning_rate"],
            beta1=adam["beta1"],
            beta2=adam["beta2"],
            eps=adam["eps"],
            weight_decay=adam["weight_decay"],
            group_size=eng.group_size,
            groups_per_batch=eng.groups_per_batch,
            temperature=eng.temperature,
            max_tokens=eng.max_tokens,
            updates_per_batch=arm.updates_per_batch,
            side_losses=side,
        )

    # --- phases -------------------------------------------------------------------------------
    def preflight(self) -> dict[str, Any]:
        from losslab.conformance.preflight import PreflightError, run_preflight

        cp = self.plan.correctness_preflight
        if cp is None or not cp.paths:
            return _not_applicable("the plan has no correctness_preflight paths")
        # the plan object and the loss objects the arms train: one source of truth. Pinned
        # sources are fetched; where they cannot be had (offline, no cache) the run goes on with
        # the labelled re-derivation, which preflight.json's `provenance` states ("pinned source
        # NOT executed"); `losslab preflight` is the strict check
        try:
            report = run_preflight(self.plan, losses=self.losses, allow_rederivation=True)
        except PreflightError as e:
            raise RunError(f"correctness preflight could not run: {e}") from e
        rows = []
        for path in report["paths"]:
            stress = path.get("stress") or {"checks": {}, "errors": {}}
            checks = {**path["checks"], **{f"stress_{k}": v for k, v in stress["checks"].items()}}
            errors = {**path["errors"], **{f"stress_{k}": v for k, v in stress["errors"].items()}}
            for name, chk in checks.items():
                err = errors.get(name, {})
                tol = chk.get("tolerance", {})
                rows.append(
                    {
                        "check": f"{path['id']}.{name}",
                        "measured": {
                            "max_abs_error": err.get("max_abs_error"),
                            "relative_l2_error": err.get("relative_l2_error"),
                            "cosine_similarity": err.get("cosine_similarity"),
                        },
                        "bound": ", ".join(f"{k} {v:g}" for k, v in tol.items() if v is not None),
                        "passed": bool(chk["passed"]),
                        "note": _violations_note(chk),
                    }
                )
        passed = bool(report["passed"]) or not cp.required
        return {**report, "passed": passed, "checks": rows, "failures": _rows_failures(rows)}

    def restoration(self) -> dict[str, Any]:
        import tinker

        from losslab.backends.restoration import restoration_preflight

        rp = self.plan.restoration_preflight
        if rp is None or not rp.applicable:
            return _not_applicable("restoration_preflight is not applicable in the plan")
        arms = [a.model_dump() for g in rp.groups for a in g.arms]
        if not arms:
            arms = [
                {
                    "name": a.name,
                    "optimizer": self.plan.optimizer.name,
                    "optimizer_config": self.plan.adam_config(a),
                }
                for a in self.plan.arms
            ]
        for a in arms:  # fill unset betas/eps with the values the arms will train with
            full = self.plan.adam_config(a["name"])
            a["optimizer_config"] = {
                k: (v if v is not None else full.get(k)) for k, v in a["optimizer_config"].items()
            }
        seeds = {a.seed for a in self.plan.arms}
        try:
            report = restoration_preflight(
                self.service,
                base_model=self.base_model,
                rank=self.plan.lora_rank,
                seed=min(seeds),
                arms=arms,
            )
        except BackendUnavailable:
            raise
        except (tinker.TinkerError, OSError, RuntimeError, ValueError) as e:
            # the first backend call of a run: unreachable, no key, no local model, bad device
            raise BackendUnavailable(
                f"backend {self.backend!r} could not run the restoration preflight: {e}"
            ) from e
        lp = report["logprobs"]
        rows = [
            {
                "check": f"log-probs {c['arm']} vs {lp['reference_arm']} (fixed batch)",
                "measured": c["max_abs_diff"],
                "bound": f"bitwise or <= {report['tolerance']:g}",
                "passed": bool(c["ok"]),
                "note": "bitwise equal" if c["bitwise_equal"] else "",
            }
            for c in lp["comparisons"]
        ]
        for opt in report["optimizers"]:
            rows.append(
                {
                    "check": f"optimizer {opt.get('arm', opt.get('name'))}",
                    "measured": opt.get("actual", opt.get("executed")),
                    "bound": opt.get("planned"),
                    "passed": not opt.get("problems"),
                    "note": "; ".join(opt.get("problems") or []),
                }
            )
        if len(seeds) > 1:
            rows.append(
                {
                    "check": "arm seeds",
                    "measured": sorted(seeds),
                    "bound": "one seed",
                    "passed": False,
                    "note": "arms must start from the same seed",
                }
            )
        passed = bool(report["passed"]) and len(seeds) == 1
        return {**report, "passed": passed, "checks": rows, "failures": _rows_failures(rows)}

    def make_trainer(self, arm: str) -> BackendArmTrainer:
        from losslab.engine import ArmLoop

        config = self._arm_config(arm)
        task = self.task
        if config.seed != self.plan.arms[0].seed:  # a seed replica draws its own training order
            task = _TrainOrder(self.task, self.train_order(config.seed))
        loop = ArmLoop(self._create_client(arm), task, config)
        return BackendArmTrainer(self, arm, loop)

    def executed_config(self, arm: str, trainer: BackendArmTrainer) -> dict[str, dict[str, Any]]:
        info = trainer.client.get_info()
        model_data = getattr(info, "model_data", None)
        executed_model = getattr(model_data, "model_name", None) or getattr(
            info, "model_name", None
        )
        out: dict[str, dict[str, Any]] = {
            "base_model": {"plan": self.base_model, "executed": executed_model},
            "lora_rank": {
                "plan": self.plan.lora_rank,
                "executed": getattr(info, "lora_rank", None),
            },
        }
        opt = getattr(trainer.client, "optimizer_config", None)
        if callable(opt):
            actual = opt()
            planned = self.plan.adam_config(self.schedule.plan_arm(arm))
            for key in ("learning_rate", "beta1", "beta2", "eps"):
                out[f"adam.{key}"] = {"plan": planned[key], "executed": actual.get(key)}
        return out

    def _greedy_eval(self, trainer: BackendArmTrainer, n_items: int) -> list[Any]:
        """Greedy evaluation of the trainer's current weights on the first `n_items` test items."""
        from losslab.engine import evaluate

        problems = self.task.test[:n_items]
        sampler = trainer.client.save_weights_and_get_sampling_client().result()
        return evaluate(
            sampler,
            self.task,
            problems,
            trainer.renderer,
            max_tokens=self.plan.engine.eval_max_tokens,
            seed=0,
        )

    def eval_probe(self, trainer: BackendArmTrainer) -> dict[str, Any]:
        """Seconds per evaluation item, timed on a few test items (for feasibility)."""
        n_items = min(EVAL_PROBE_ITEMS, self.plan.eval.n_examples)
        t0 = time.perf_counter()
        items = self._greedy_eval(trainer, n_items)
        return {
            "eval_s_per_item": (time.perf_counter() - t0) / max(len(items), 1),
            "eval_probe_items": len(items),
        }

    def gate(
        self, pilot_rows: list[dict[str, Any]], executed: dict[str, dict[str, Any]]
    ) -> dict[str, Any]:
        from losslab.engine import pilot_metrics
        from losslab.plan import GATE_METRICS
        from losslab.stats.gate import evaluate_gate

        # gate_for: a run that executes engine.local_base_model instead of the served base
        # model (see Backend.executes_local_base_model) must accept it in executed_base_model.
        gate = self.plan.gate_for(self.base_model)
        if gate is None or not gate.applicable:
            return _not_applicable("activation_gate is not applicable in the plan")
        update = self.plan.updates_per_batch
        try:
            model = str(executed.get("base_model", {}).get("executed") or "")
            metrics = pilot_metrics(pilot_rows, GATE_METRICS, base_model=model, update=update)
        except KeyError as e:
            raise RunError(f"the pilot did not log what the gate needs: {e}") from e
        result = evaluate_gate(gate, metrics)
        rows = [
            {
                "check": c.metric,
                "measured": c.measured,
                "bound": c.bound,
                "passed": c.passed,
                "note": c.reason,
            }
            for c in result.checks
        ]
        return {
            **result.to_dict(),
            "metrics": metrics,
            "measured_at_update": update,
            "checks": rows,
            "failures": _rows_failures(rows),
        }

    def feasibility(self, timings: dict[str, Any]) -> dict[str, Any]:
        from losslab.stats.feasibility import StepTimings, project_feasibility

        rows = timings["rows"]
        upb = self.plan.updates_per_batch
        sample_s = sum(r.get("time/sample_s", 0.0) + r.get("time/snapshot_s", 0.0) for r in rows)
        train_s = sum(
            r.get("time/forward_backward_s", 0.0) + r.get("time/optim_s", 0.0) for r in rows
        )
        n = max(len(rows), 1)
        st = StepTimings(
            sample_s=sample_s / n,
            train_s=train_s / n / upb,
            eval_s_per_item=float(timings.get("eval_s_per_item") or 0.0),
            gpus=self.backend_impl.gpus(),
            measured_s=float(timings.get("pilot_seconds") or 0.0),
            pilot_reused=True,  # the treatment arm continues from the pilot's checkpoint
        )
        fc = project_feasibility(st, self.plan)
        budget = self.plan.budget
        rows_out = []
        if budget.max_wall_minutes is not None:
            rows_out.append(
                {
                    "check": "projected wall minutes",
                    "measured": fc.wall_seconds / 60,
                    "bound": f"<= {budget.max_wall_minutes:g}",
                    "passed": fc.wall_seconds <= budget.max_wall_minutes * 60,
                }
            )
        if budget.gpu_hours is not None:
            rows_out.append(
                {
                    "check": "projected GPU-hours",
                    "measured": fc.gpu_hours,
                    "bound": f"<= {budget.gpu_hours:g}",
                    "passed": fc.gpu_hours <= budget.gpu_hours,
                }
            )
        passed = fc.status == "pass" or not self.plan.feasibility_required
        cost = self.cost_projection
        if cost.get("available"):  # the plan-only projection beside the pilot's measured one
            from losslab.stats.cost import cost_vs_pilot

            cost = {**cost, "vs_pilot": cost_vs_pilot(self._cost, fc.wall_seconds, fc.gpu_hours)}
        return {
            **fc.model_dump(),
            "projected_wall_seconds": fc.wall_seconds,
            "timings": asdict(st),
            "passed": passed,
            "checks": rows_out,
            "failures": _rows_failures(rows_out),
            "note": "the pilot's steps count once, inside the treatment arm that continues "
            "from them; preflights, model loading and the report are not projected",
            "cost_projection": cost,
        }

    @cached_property
    def _cost(self) -> Any:
        from losslab.stats.cost import plan_cost

        return plan_cost(self.plan, task=self.task, base_model=self.base_model)

    @cached_property
    def cost_projection(self) -> dict[str, Any]:
        """The plan-only cost projection (stats.cost) of the model this run executes."""
        try:
            cost = self._cost
        except (ValueError, RunError) as e:  # e.g. a model whose size is unknown offline
            return {"available": False, "reason": str(e)}
        return {"available": True, "lines": cost.lines(), **cost.to_dict()}

    def evaluate(self, arm: str, trainer: BackendArmTrainer) -> list[dict[str, Any]]:
        return [asdict(i) for i in self._greedy_eval(trainer, self.plan.eval.n_examples)]

    def decide(self, evals: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
        from losslab.stats.decision import PairedOutcomes, decide
        from losslab.stats.seeds import decide_over_seeds

        if not self.schedule.units:  # one seed: the plan's rule on the one pair
            outcomes = PairedOutcomes.from_records(evals)
            return decide(self.plan.decision_rule, outcomes, plan=self.plan).to_dict()
        per_seed: dict[int, dict[str, list[dict[str, Any]]]] = {}
        for unit, rows in evals.items():
            seed = self.schedule.seeds[unit]
            per_seed.setdefault(seed, {})[self.schedule.plan_arm(unit)] = rows
        outcomes_by_seed = {s: PairedOutcomes.from_records(e) for s, e in per_seed.items()}
        return decide_over_seeds(self.plan.decision_rule, outcomes_by_seed, plan=self.plan)

    def environment(self) -> dict[str, Any]:
        import importlib.metadata as md

        versions = {}
        for pkg in ("torch", "transformers", "peft", "tinker", "numpy", "scipy", "reasoning-gym"):
            try:
                versions[pkg] = md.version(pkg)
            except md.PackageNotFoundError:
                versions[pkg] = None
        device = self.backend_impl.device()
        return {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "versions": versions,
            "device": device,
            "torch_threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(),
            "base_model": self.base_model,
            "plan_base_model": self.plan.base_model,
            "task": self.plan.task_name,
            "data": str(self.data) if self.data else None,
        }
