"""Restoration preflight: every arm starts from the same weights with its planned optimizer."""

from __future__ import annotations

from typing import Any

import tinker

from losslab.backends.restoration import restoration_phase
from losslab.checks import PhaseResult
from losslab.runner.errors import BackendUnavailable
from losslab.runner.protocols import PhaseContext

NOT_APPLICABLE = "restoration_preflight is not applicable in the plan"


def planned_arms(plan: Any) -> list[dict[str, Any]]:
    """The plan's restoration arms (its groups' arms, else every arm with the plan's optimizer),
    unset betas/eps filled with the values the arms will train with."""
    arms = [a.model_dump() for g in plan.restoration_preflight.groups for a in g.arms]
    if not arms:
        arms = [
            {
                "name": a.name,
                "optimizer": plan.optimizer.name,
                "optimizer_config": plan.adam_config(a),
            }
            for a in plan.arms
        ]
    for a in arms:
        full = plan.adam_config(a["name"])
        a["optimizer_config"] = {
            k: (v if v is not None else full.get(k)) for k, v in a["optimizer_config"].items()
        }
    return arms


def run(ctx: PhaseContext) -> PhaseResult:
    comp = ctx.comp
    rp = comp.plan.restoration_preflight
    if rp is None or not rp.applicable:
        return PhaseResult.not_applicable(NOT_APPLICABLE)
    try:
        return restoration_phase(
            comp.service,
            base_model=comp.base_model,
            rank=comp.plan.lora_rank,
            seeds=[a.seed for a in comp.plan.arms],
            arms=planned_arms(comp.plan),
        )
    except BackendUnavailable:
        raise
    except (tinker.TinkerError, OSError, RuntimeError, ValueError) as e:
        # the first backend call of a run: unreachable, no key, no local model, bad device
        raise BackendUnavailable(
            f"backend {comp.backend!r} could not run the restoration preflight: {e}"
        ) from e
