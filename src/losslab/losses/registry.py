"""Losses by name: `get_loss(name, **params)` and spec strings for plans and the CLI.

Spec strings follow `losslab.callspec`'s call grammar with bare words allowed (plans read the
same grammar, `losslab.plan.parse_registry_spec`):

    spec  := NAME [ "(" [ param ("," param)* [","] ] ")" ]
    param := KEY "=" value
    value := number | inf | 'quoted' | "quoted" | None | bare-word     e.g. 1e-3, 10, inf, token-mean

Examples: `ppo`, `ppo(clip_low=0.8, clip_high=1.2)`,
`dppo_binary_tv(low=0.15, high=0.15, clip_ratio_c=10, reduction=seq-mean-token-sum-norm)`.
Integers are read as floats (every numeric parameter is a float).

Names, parameters, defaults, domains and metric keys are each loss's declaration
(`losslab.losses.declarations`, stdlib only); the registry binds a name to the function its
declaration names and validates with `LossDeclaration.resolve`, the check `plan check` runs
too. Any violation is a ValueError naming the loss, the key, the value and what was expected.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from losslab.callspec import CallSpecError, format_call, parse_call
from losslab.losses.data import TokenData
from losslab.losses.declarations import LOSSES, PARAM_ALIASES, LossDeclaration, loss_declaration
from losslab.losses.policy import LossOutput

LOSS_NAMES: tuple[str, ...] = tuple(LOSSES)
"""The built-in losses' registry names, in declaration order (`LOSSES` is the live table)."""


@dataclass(frozen=True)
class LossFn:
    """A loss with its parameters bound; call it on TokenData to get a LossOutput."""

    name: str
    params: dict[str, Any]
    """Every configurable parameter with its (validated) value, defaults included."""
    fn: Callable[..., LossOutput] = field(repr=False, compare=False)
    provenance: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)
    """Where each parameter's value came from (`build_loss`: plan, a pinned revision, default)."""

    def __call__(
        self,
        batch: TokenData,
        *,
        num_tokens: float | None = None,
        num_sequences: float | None = None,
        norm_constant: float | None = None,
    ) -> LossOutput:
        """Evaluate on `batch`; the counts are the full batch's when this is a minibatch."""
        params = dict(self.params)
        if norm_constant is not None:
            params["norm_constant"] = norm_constant
        return self.fn(batch, num_tokens=num_tokens, num_sequences=num_sequences, **params)

    @property
    def declaration(self) -> LossDeclaration:
        return loss_declaration(self.name)

    @property
    def needs_policy_inputs(self) -> bool:
        """Whether the loss reads sampler log-probs and advantages (its declaration says)."""
        return self.declaration.reads_policy_inputs

    @property
    def spec(self) -> str:
        """The canonical spec string; `parse_loss_spec(fn.spec)` rebuilds an equal LossFn, and a
        plan accepts it as an arm's `loss`."""
        params = {k: v for k, v in self.params.items() if v is not None}
        return format_call(self.name, params, bare_words=True)


def loss_parameters(name: str) -> dict[str, Any]:
    """The configurable parameters of loss `name` with their defaults."""
    return dict(loss_declaration(name).defaults)


def _implementation(declaration: LossDeclaration) -> Callable[..., LossOutput]:
    """The `@loss_function(declaration)` function the declaration names (`module:attribute`)."""
    module, _, attribute = declaration.function.partition(":")
    fn = getattr(importlib.import_module(module), attribute, None)
    if getattr(fn, "declaration", None) is not declaration:
        raise ValueError(
            f"loss {declaration.name!r}: {declaration.function} is not a function bound to its "
            "declaration with @loss_function(...)"
        )
    return fn  # type: ignore[return-value]


def get_loss(name: str, **params: Any) -> LossFn:
    """The loss `name` with `params` bound and validated (missing ones take their defaults).

    Raises:
        ValueError: unknown loss name, unknown parameter, or invalid value; the message lists
            the valid names/parameters/choices.
    """
    declaration = loss_declaration(name)
    return LossFn(name=name, params=declaration.resolve(params), fn=_implementation(declaration))


def parse_loss_spec(text: str) -> LossFn:
    """Parse `name(key=value, ...)` into a LossFn (grammar in the module docstring)."""
    if not isinstance(text, str):
        raise ValueError(f"loss spec must be a string, got {type(text).__name__}")
    try:
        name, params = parse_call(text, what="loss spec", bare_words=True)
    except CallSpecError as exc:
        if exc.part is not None:
            raise
        raise ValueError(
            f"{exc}, e.g. 'ppo(clip_low=0.8, clip_high=1.2)'; valid losses: {', '.join(LOSSES)}"
        ) from None
    # numbers are floats here: `10` and `10.0` are the same parameter value
    floats = {k: float(v) if type(v) is int else v for k, v in params.items()}
    return get_loss(name, **floats)


class ResolvedLossLike(Protocol):
    """What `build_loss` reads of a resolved loss (`losslab.plan.ResolvedLoss`; `losses` may not
    import `plan`): the registry name and `{parameter: LossParam(value, source)}`."""

    name: str

    @property
    def params(self) -> Mapping[str, Any]: ...


DEFAULT_SOURCE = "default"


def build_loss(resolved: ResolvedLossLike) -> LossFn:
    """The one constructor of a configured loss from its resolved value (name + params).

    Each parameter's provenance is kept on the result (`LossFn.provenance`); parameters the
    resolved value does not set take the loss function's default, provenance `default`.

    Raises:
        ValueError: unknown loss, unknown parameter or invalid value (as `get_loss`).
    """
    values = {key: param.value for key, param in resolved.params.items()}
    loss = get_loss(resolved.name, **values)
    given = {PARAM_ALIASES.get(k, k): p.source for k, p in resolved.params.items()}
    provenance = {key: given.get(key, DEFAULT_SOURCE) for key in loss.params}
    return replace(loss, provenance=provenance)
