"""The pilot: the treatment arm's first `pilot_steps` steps (kept: the arm continues from them),
then a few evaluation items timed on their weights for the feasibility projection, and the
pilot's diagnostics (`engine.pilot_diagnostics`, written to pilot/diagnostics.json): the
sampler-vs-trainer gap before any update and its alignment check, the trust-region metrics at
the first update (mismatch only) beside the last (mismatch + drift), duplicate completions and
the effective group size, the seed each component used, the policy-gradient gradient norm."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import Any

from losslab.checks import PhaseResult
from losslab.engine import alignment_check, pilot_diagnostics
from losslab.runner.protocols import ArmTrainer, PhaseContext, Schedule
from losslab.runner.rundir import write_json_artifact

DIAGNOSTICS = "pilot/diagnostics.json"
_UPDATE_KEY = re.compile(r"^update(\d+)/")


def outputs(schedule: Schedule) -> Sequence[str]:
    """The diagnostics file (a resumed run redoes the pilot phase, not its steps, without it)."""
    return [DIAGNOSTICS]


def run(ctx: PhaseContext) -> PhaseResult:
    arm, k = ctx.schedule.treatment, ctx.schedule.pilot_steps
    probe: dict[str, Any] = {}
    client_seed: dict[str, Any] = {}

    def time_eval(trainer: ArmTrainer) -> None:
        client_seed.update(_reported_client_seed(trainer))
        t = time.perf_counter()
        probe.update(ctx.comp.eval_probe(trainer))
        probe["eval_probe_seconds"] = time.perf_counter() - t

    ctx.log(f"pilot: first {k} steps of {arm}")
    setup_s = ctx.train(arm, until=k, before_close=time_eval)
    facts = {"steps": k, "arm": arm, "setup_seconds": setup_s, **probe}
    rows = ctx.pilot_rows()
    diagnostics = _diagnostics(ctx, rows)
    checks = None
    if diagnostics.get("available"):
        diagnostics["seeds"] = {**diagnostics["seeds"], **_component_seeds(ctx, client_seed)}
        check = alignment_check(diagnostics["mismatch"])
        diagnostics["alignment"] = check.to_dict()
        checks = [check]
        ctx.log(f"[pilot] {_summary_line(diagnostics)}")
    write_json_artifact(ctx.run_dir.root / DIAGNOSTICS, diagnostics)
    return PhaseResult(
        {**facts, "diagnostics": DIAGNOSTICS}, checks=checks, summary=f"{k} steps of {arm}"
    )


def _diagnostics(ctx: PhaseContext, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The engine's diagnostics of the pilot rows, or why there are none (rows from a trainer
    that is not the engine's arm loop carry no first-update gap)."""
    if not rows or not all("update1/gap/abs_logprob_mean" in r for r in rows):
        return {
            "available": False,
            "reason": "the pilot's rows carry no first-update sampler/trainer gap (not the "
            "engine's arm loop, or no loss tokens)",
        }
    plan = ctx.comp.plan
    gate_metrics = getattr(plan, "gate_metrics", None)
    table = gate_metrics() if callable(gate_metrics) else {}
    update = int(getattr(plan, "updates_per_batch", None) or _last_update(rows[0]))
    group_size = int(rows[0].get("data/group_size") or 0)
    return {
        "available": True,
        **pilot_diagnostics(rows, table, group_size=group_size, update=update),
    }


def _last_update(row: dict[str, Any]) -> int:
    """The highest `update{u}/` prefix in a metrics row (1 when there is none)."""
    updates = [int(m.group(1)) for k in row if (m := _UPDATE_KEY.match(k))]
    return max(updates, default=1)


def _reported_client_seed(trainer: ArmTrainer) -> dict[str, Any]:
    """The seed the training client reports it was created with (the local backend's
    `describe()`); Tinker's client reports none."""
    describe = getattr(getattr(trainer, "client", None), "describe", None)
    try:
        reported = describe().get("seed") if callable(describe) else None
    except (AttributeError, TypeError):
        reported = None
    return {"reported": reported}


def _component_seeds(ctx: PhaseContext, client_seed: dict[str, Any]) -> dict[str, Any]:
    """The seed each component of the treatment arm used, as the run set it up
    (`runner.trainer`, `runner.checkpoint.seed_everything`, `DefaultComponents`)."""
    sched, arm = ctx.schedule, ctx.schedule.treatment
    seed = sched.seeds[arm]
    plan_arms = getattr(ctx.comp.plan, "arms", None)
    task_seed = getattr(plan_arms[0], "seed", None) if plan_arms else None
    reported = client_seed.get("reported")
    order = (
        f"the task's own order (task seed {task_seed})"
        if task_seed is None or seed == task_seed
        else f"the task's order permuted with seed {seed}"
    )
    return {
        "global_rngs": seed,
        "training_client": {
            "requested": seed,
            "reported": reported,
            "note": "reported by the client" if reported is not None else "not reported",
        },
        "task": task_seed,
        "training_order": order,
    }


def _summary_line(d: dict[str, Any]) -> str:
    m, g = d["mismatch"], d["groups"]
    parts = [
        f"sampler/trainer gap before any update: mean |d| {_g(m['abs_logprob_mean'])}, "
        f"max {_g(m['abs_logprob_max'])}, Pearson {_g(m['pearson_min'])}",
        f"alignment {'ok' if d['alignment']['passed'] else 'FAILED'}",
        f"effective group size {_g(g['effective_group_size_mean'])} of {g['planned_group_size']}",
    ]
    return "; ".join(parts)


def _g(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, int | float) else "n/a"
