"""Run a losslab loss as a Tinker custom loss (`TrainingClient.forward_backward_custom`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torch import Tensor

from losslab.losses.data import TokenData
from losslab.losses.policy import LossOutput

if TYPE_CHECKING:
    import tinker

CustomLossFn = Callable[["list[tinker.Datum]", list[Tensor]], tuple[Tensor, dict[str, float]]]
"""Tinker's `CustomLossFnV1`: `(data, logprobs_list) -> (loss, metrics)`. The one alias: the
engine, the backends and their Protocols (`losslab.backends.protocols`) use this one."""


def as_tinker_loss_fn(
    loss_fn: Callable[..., LossOutput],
    *,
    num_tokens: float | None = None,
    num_sequences: float | None = None,
    norm_constant: float | None = None,
) -> CustomLossFn:
    """Wrap `loss_fn` (a `LossFn` or any `TokenData -> LossOutput` callable) as Tinker's
    `CustomLossFnV1`: `(data, logprobs_list) -> (loss, metrics)` (the SDK's
    `TrainingClient.forward_backward_custom`).

    The SDK backpropagates the returned loss into each datum's log-prob tensor and needs a
    gradient on every one of them; losslab losses guarantee that (zero where masked). Pass the
    full batch's counts when `data` is a minibatch of a mean-reduced loss.
    """
    native = getattr(loss_fn, "tinker_custom_loss", None)
    if native is not None:  # code named by a plan (`conformance.user_loss`): its own call
        return _passthrough(native, loss_fn)
    needs_policy_inputs = getattr(loss_fn, "needs_policy_inputs", True)
    counts = {
        k: v
        for k, v in dict(
            num_tokens=num_tokens, num_sequences=num_sequences, norm_constant=norm_constant
        ).items()
        if v is not None
    }

    def custom_loss(
        data: list[tinker.Datum], logprobs_list: list[Tensor]
    ) -> tuple[Tensor, dict[str, float]]:
        batch = TokenData.from_datums(
            data, logprobs_list, require_policy_inputs=needs_policy_inputs
        )
        out = loss_fn(batch, **counts)
        return out.loss, out.metrics

    custom_loss.__name__ = f"losslab_{getattr(loss_fn, 'name', 'custom')}"
    custom_loss.loss = loss_fn  # type: ignore[attr-defined]  # the wrapped object, for audits
    return custom_loss


def _passthrough(native: CustomLossFn, loss_fn: Any) -> CustomLossFn:
    """`native` (a loss's own Tinker-form call) with the `.loss` audit attribute."""

    def custom_loss(
        data: list[tinker.Datum], logprobs_list: list[Tensor]
    ) -> tuple[Tensor, dict[str, float]]:
        return native(data, logprobs_list)

    custom_loss.__name__ = f"user_{getattr(loss_fn, 'name', 'custom')}"
    custom_loss.loss = loss_fn  # type: ignore[attr-defined]  # the wrapped object, for audits
    return custom_loss
