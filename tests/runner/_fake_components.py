"""A fake `Components` for runner tests: a tiny torch model trained by Adam on random data.

It exercises everything the runner owns (phase order, artifacts, checkpoints, RNG capture,
resume, stop-on-failure) in milliseconds: its phase table is the real one (`PHASES`, read at run
time) with the check phases and the decision replaced by fakes. Each step draws its batch from the *global* torch RNG,
so a resume that failed to restore RNG state, weights, optimizer state or the cursor would give
different final weights and evaluation results.

The fake "plan" is a small JSON file:
    {"arms": ["base", "treat"], "steps": 4, "pilot_steps": 2, "gate_min": 0.0,
     "preflight_pass": true, "executed_model": "fake-model", "seeds": [7]}
With several `seeds`, every arm trains once per seed (units `<arm>` at 7, `<arm>.seed<s>` else)
and `decide` applies losslab.stats.seeds like the real components.
`factory(interrupt_at=k)` raises KeyboardInterrupt at the k-th training step call (Ctrl-C).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from losslab.backends.executed import compare_config
from losslab.checks import Check, PhaseResult
from losslab.engine import evaluation_result
from losslab.plan import DecisionRule
from losslab.runner import phases as phase_table
from losslab.runner.artifacts import read_rows
from losslab.runner.protocols import Phase, PhaseContext, Schedule
from losslab.runner.rundir import BASE_MODEL
from losslab.stats.decision import verdict_line
from losslab.stats.seeds import decision_phase
from losslab.tasks.audit import generation_audit
from losslab.tasks.base import Problem

N_EVAL = 40


def write_fake_plan(path: Path, **overrides: Any) -> Path:
    plan = {
        "arms": ["base", "treat"],
        "steps": 4,
        "pilot_steps": 2,
        "gate_min": 0.0,
        "preflight_pass": True,
        "executed_model": "fake-model",
        "seeds": [7],
    }
    plan.update(overrides)
    path.write_text(json.dumps(plan))
    return path


class FakeTrainer:
    def __init__(self, arm: str, lr: float, calls: dict[str, int], interrupt_at: int | None):
        self.arm = arm
        self.model = torch.nn.Linear(4, 1)  # initialised from the global torch RNG (seeded)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=lr)
        self._cursor = {"next_step": 0}
        self._calls, self._interrupt_at = calls, interrupt_at
        self.closed = False

    def step(self, step: int) -> dict[str, Any]:
        self._calls["steps"] += 1
        if self._interrupt_at is not None and self._calls["steps"] == self._interrupt_at:
            raise KeyboardInterrupt
        assert self._cursor["next_step"] == step, "runner resumed at the wrong data cursor"
        x = torch.randn(16, 4)  # global RNG: resume must restore it
        y = x.sum(dim=1, keepdim=True)
        loss = ((self.model(x) - y) ** 2).mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self._cursor = {"next_step": step + 1}
        return {
            "loss/value": float(loss.detach()),
            "reward/mean": float(-loss.detach()),
            "loss/clip_fraction": 0.1,
            "dppo/mask_fraction": 0.05,
            "policy/drift_vs_sampler_q90": 0.01 * (step + 1),  # the engine's cross-loss key
            "tokens/completion_total": 100.0,  # the efficiency curve's x: 100 tokens a step
        }

    @property
    def cursor(self) -> dict[str, Any]:
        return dict(self._cursor)

    def save(self, folder: Path) -> dict[str, Any]:
        torch.save(
            {"model": self.model.state_dict(), "opt": self.opt.state_dict()}, folder / "s.pt"
        )
        return {"file": "s.pt"}

    def load(self, folder: Path, info: dict[str, Any], cursor: dict[str, Any]) -> None:
        state = torch.load(folder / info["file"])
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["opt"])
        self._cursor = dict(cursor)

    def close(self) -> None:
        self.closed = True


class FakeComponents:
    """Built from (plan file, backend) like the real one; `calls` counts work done."""

    def __init__(
        self,
        plan_file: Path,
        backend: str,
        interrupt_at: int | None = None,
        interrupt_eval_at: int | None = None,
    ) -> None:
        self.plan = json.loads(Path(plan_file).read_text())
        arms = tuple(self.plan["arms"])
        seeds = self.plan.get("seeds", [7])
        units = {(a if s == seeds[0] else f"{a}.seed{s}"): (a, s) for s in seeds for a in arms}
        self.schedule = Schedule(
            arms=tuple(units),
            treatment=arms[1],
            steps=self.plan["steps"],
            pilot_steps=self.plan["pilot_steps"],
            seeds={u: s for u, (_, s) in units.items()},
            units={u: a for u, (a, _) in units.items() if u != a},
        )
        self.calls = {"steps": 0, "preflight": 0, "evaluate": 0}
        self.interrupt_at = interrupt_at
        self.interrupt_eval_at = interrupt_eval_at

    @property
    def phases(self) -> tuple[Phase, ...]:
        """The real phase table, with the checks and the decision replaced by the fake's."""
        fakes = {
            "preflight": self.preflight,
            "restoration": self.restoration,
            "dispatch": self.dispatch,
            "gate": self.gate,
            "feasibility": self.feasibility,
            "audit": self.audit,
            "decision": self.decide,
        }
        return tuple(replace(p, run=fakes.get(p.name, p.run)) for p in phase_table.PHASES)

    def preflight(self, ctx: PhaseContext) -> PhaseResult:
        self.calls["preflight"] += 1
        ok = self.plan["preflight_pass"]
        check = Check("loss.max_abs_error", 0.0 if ok else 0.5, "<= 1e-05", passed=ok)
        return PhaseResult({}, checks=[check])

    def restoration(self, ctx: PhaseContext) -> PhaseResult:
        check = Check("logprob max |diff|", 0.0, "<= 1e-06", passed=True)
        return PhaseResult({}, checks=[check])

    def dispatch(self, ctx: PhaseContext) -> PhaseResult:
        rows = [
            Check(f"{arm}.dispatch", 0.0, "rtol 0.0001", passed=True) for arm in self.plan["arms"]
        ]
        return PhaseResult({}, checks=rows)

    def make_trainer(self, arm: str) -> FakeTrainer:
        lr = 0.05 if self.schedule.plan_arm(arm) == self.plan["arms"][1] else 0.01
        return FakeTrainer(arm, lr, self.calls, self.interrupt_at)

    def executed_config(self, arm: str, trainer: Any) -> PhaseResult:
        values = {"base_model": {"plan": "fake-model", "executed": self.plan["executed_model"]}}
        return compare_config(values, arm)

    def eval_probe(self, trainer: FakeTrainer) -> dict[str, Any]:
        return {"eval_s_per_item": 0.001}

    def gate(self, ctx: PhaseContext) -> PhaseResult:
        assert (
            ctx.executed(self.schedule.treatment)["base_model"]["executed"]
            == (self.plan["executed_model"])
        )
        pilot_rows = ctx.pilot_rows()
        measured = sum(r["dppo/mask_fraction"] for r in pilot_rows) / len(pilot_rows)
        check = Check(
            "dppo_masked_token_fraction",
            measured,
            f">= {self.plan['gate_min']}",
            passed=measured >= self.plan["gate_min"],
        )
        return PhaseResult({"pilot_steps": len(pilot_rows)}, checks=[check])

    def feasibility(self, ctx: PhaseContext) -> PhaseResult:
        step_seconds = [r["time/step_s"] for r in ctx.pilot_rows()]
        per_step = sum(step_seconds) / max(len(step_seconds), 1)
        projected = per_step * self.schedule.steps * len(self.schedule.arms)
        check = Check("projected wall seconds", projected, "<= 600", passed=projected <= 600)
        return PhaseResult({"projected_wall_seconds": projected}, checks=[check])

    def evaluate(self, arm: str, trainer: FakeTrainer) -> PhaseResult:
        self.calls["evaluate"] += 1
        if self.calls["evaluate"] == self.interrupt_eval_at:
            raise KeyboardInterrupt
        return evaluation_result(evaluation_result_rows(trainer))

    def audit(self, ctx: PhaseContext) -> PhaseResult:
        """The real audit on the fake's items (questions as `evaluate` writes them); one
        training question repeats test item 0's, so the overlap is 1."""
        test = [
            Problem(f"item{i}", f"what is the sum of the 4 inputs of item {i}?", "")
            for i in range(N_EVAL)
        ]
        train = [Problem("t0", test[0].question.upper(), ""), Problem("t1", "something else", "")]
        evals = {BASE_MODEL: read_rows(ctx.run_dir.base_eval_path)}
        evals.update({a: read_rows(ctx.run_dir.eval_path(a)) for a in self.schedule.arms})
        return generation_audit(train, test, evals, max_eval_overlaps=1, required=False)

    @property
    def efficiency(self) -> tuple[int, int] | None:
        """(k, m) from the fake plan's "eval_every" (every k steps, the first m = 8 items)."""
        k = self.plan.get("eval_every")
        return (k, 8) if k else None

    def evaluate_subset(self, arm: str, trainer: FakeTrainer, n_items: int) -> list[dict]:
        # like a sampler, this draws from the global RNG; the runner must put the state back, or
        # the training batches after an efficiency evaluation would change
        torch.rand(3)
        return evaluation_result_rows(trainer)[:n_items]

    def decide(self, ctx: PhaseContext) -> PhaseResult:
        evals = {arm: read_rows(ctx.run_dir.eval_path(arm)) for arm in self.schedule.arms}
        if self.schedule.units:
            return self._decide_over_seeds(evals)
        base, treat = (evals[a] for a in self.schedule.arms)
        b = sum(t["correct"] and not s["correct"] for t, s in zip(treat, base, strict=True))
        c = sum(s["correct"] and not t["correct"] for t, s in zip(treat, base, strict=True))
        delta = (b - c) / len(base)
        verdict = {
            "verdict": "validated" if delta > 0 else "inconclusive",  # stats' verdict words
            "estimate": delta,
            "b": b,
            "c": c,
            "n": len(base),
        }
        return PhaseResult(verdict, summary=verdict_line(verdict))

    def _decide_over_seeds(self, evals: dict[str, list[dict[str, Any]]]) -> PhaseResult:
        base, treat = self.plan["arms"]
        rule = DecisionRule.model_validate(
            {
                "alpha": 0.05,
                "method": "paired_hoeffding",
                "seeds": self.plan["seeds"],
                "criteria": [
                    {
                        "id": "primary",
                        "metric": "accuracy",
                        "weights": {"treatment": 1, "baseline": -1},
                        "bounds": [0, 1],
                    }
                ],
            }
        )
        units = {u: (self.schedule.plan_arm(u), self.schedule.seeds[u]) for u in evals}
        roles = {"treatment": treat, "baseline": base}
        return decision_phase(rule, evals, units=units, roles=roles)

    def environment(self) -> dict[str, Any]:
        return {"device": "cpu", "torch": torch.__version__}


def evaluation_result_rows(trainer: FakeTrainer) -> list[dict[str, Any]]:
    """The fake's graded items: the same N_EVAL inputs for every arm, right when |error| < 1."""
    g = torch.Generator().manual_seed(123)  # the same items for every arm
    x = torch.randn(N_EVAL, 4, generator=g)
    with torch.no_grad():
        pred = trainer.model(x).squeeze(1)
        err = (pred - x.sum(dim=1)).abs()
    return [
        {
            "id": f"item{i}",
            "question": f"what is the sum of the 4 inputs of item {i}?",
            "answer": f"{float(x[i].sum()):.3f}",
            "completion": f"the sum is {float(pred[i]):.3f}",
            "prediction": f"{float(pred[i]):.3f}",
            "correct": bool(e < 1.0),
            "error": float(e),
        }
        for i, e in enumerate(err)
    ]


def factory(
    interrupt_at: int | None = None,
    record: list[FakeComponents] | None = None,
    interrupt_eval_at: int | None = None,
):
    """A components factory for `run_plan`; appends each built FakeComponents to `record`.
    `interrupt_eval_at=k` raises KeyboardInterrupt at the k-th evaluation (1 = the base model)."""

    def make(plan_file: Path, backend: str) -> FakeComponents:
        comp = FakeComponents(plan_file, backend, interrupt_at, interrupt_eval_at)
        if record is not None:
            record.append(comp)
        return comp

    return make


def final_state(run_dir: Path) -> dict:
    """What must not depend on interruptions: final weights+optimizer, eval rows, verdict."""
    out = {}
    for arm in ("base", "treat"):
        ck = run_dir / "arms" / arm / "checkpoints" / "step_0004"
        state = torch.load(ck / "trainer" / "s.pt")
        out[arm] = {
            "model": {k: v.tolist() for k, v in state["model"].items()},
            "opt": {k: v.tolist() for k, v in state["opt"]["state"][0].items()},
            "cursor": json.loads((ck / "state.json").read_text())["cursor"],
            "eval": (run_dir / f"eval_{arm}.jsonl").read_text(),
            "losses": [
                r["loss/value"]
                for r in map(json.loads, (run_dir / "arms" / arm / "metrics.jsonl").open())
            ],
        }
    out["verdict"] = json.loads((run_dir / "verdict.json").read_text())
    return out
