"""Dispatch fingerprint: each arm's loss path, run once on the backend, is the declared loss."""

from __future__ import annotations

import tinker

from losslab.backends.fingerprint import dispatch_phase
from losslab.checks import PhaseResult
from losslab.losses.tinker_builtins import builtin_request
from losslab.runner.errors import BackendUnavailable
from losslab.runner.protocols import PhaseContext


def run(ctx: PhaseContext) -> PhaseResult:
    comp = ctx.comp
    builtin = comp.plan.engine.loss_path == "builtin"
    arms = {}
    for arm in comp.plan.arms:  # seed replicas train their plan arm's loss object
        loss = comp.losses[arm.name]
        arms[arm.name] = (loss, builtin_request(loss.name, loss.params) if builtin else None)
    try:
        # a client of its own: the probe's gradient must not reach any arm's first step
        client = comp.probe_client()
        return dispatch_phase(client, arms)
    except BackendUnavailable:
        raise
    except (tinker.TinkerError, OSError, RuntimeError) as e:
        raise BackendUnavailable(
            f"backend {comp.backend!r} could not run the dispatch fingerprint: {e}"
        ) from e
