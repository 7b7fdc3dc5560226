"""The arms' loss objects, built once from the plan's resolved losses.

The product's promise is that the loss an arm trains with is exactly the loss the correctness
preflight checked. This module is where that holds by construction: `arm_losses(plan)` builds
one `losslab.losses.LossFn` per arm from `plan.loss(arm)` (the value resolved when the plan was
loaded), and both `losslab.conformance.preflight` and `losslab.runner.components` take their
loss objects from it, never from the plan's loss text. It lives in `conformance` because that
layer may import both `plan` and `losses`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from losslab.losses import build_loss

if TYPE_CHECKING:
    from losslab.plan import Plan

__all__ = ["arm_losses"]


def arm_losses(
    plan: Plan, *, sources: Mapping[str, Path] | None = None, offline: bool = False
) -> dict[str, Any]:
    """`{arm name: LossFn}` for every arm of `plan`, in plan order; an arm whose loss is code
    (`ResolvedLoss.user`) gets its `losslab.conformance.user_loss.UserLossFn`, imported once.

    Args:
        sources, offline: where a pinned function's commit is read from (`--source`) and
            whether it may be fetched, as for the preflight's references.

    Raises:
        ValueError: a resolved loss the registry rejects (unknown name or parameter, invalid
            value), or code that cannot be used (`UserLossError`); the message names the arm.
    """
    out: dict[str, Any] = {}
    for arm in plan.arms:
        resolved = plan.loss(arm)
        try:
            if resolved.user is not None:
                from losslab.conformance.user_loss import load_user_loss

                out[arm.name] = load_user_loss(
                    resolved.user, params=resolved.values, sources=sources, offline=offline
                )
                continue
            out[arm.name] = build_loss(resolved)
        except ValueError as exc:
            raise ValueError(f"arms[{arm.name!r}].loss {resolved.plan_name!r}: {exc}") from exc
    _refuse_gate_keys_code_never_logs(plan, out)
    return out


def _refuse_gate_keys_code_never_logs(plan: Plan, losses: Mapping[str, Any]) -> None:
    """A gate check on a loss metric whose arm's loss is code that never names the key: plan
    check refuses it for a file or module; a pinned function's source is only had now. The
    pilot would otherwise stop at the gate after the preflights and the pilot's steps."""
    for metric, known in plan.gate_metrics().items():
        role = known.loss_role
        if role is None or known.logged_key is None:
            continue
        arm = plan.arm(role).name
        loss = losses.get(arm)
        names_key = getattr(loss, "names_key", None)
        if names_key is not None and not names_key(known.logged_key):
            raise ValueError(
                f"arms[{arm!r}].loss {plan.loss(arm).plan_name!r}: activation_gate metric "
                f"{metric!r} reads {known.logged_key!r} from the {role} arm's loss, whose source "
                f"never names that key; it logs only what it returns, so drop the check or "
                "log the key"
            )
