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
    return out
