"""Losses by name: `get_loss(name, **params)` and spec strings for plans and the CLI.

Spec strings follow `losslab.callspec`'s call grammar with bare words allowed:

    spec  := NAME [ "(" [ param ("," param)* [","] ] ")" ]
    param := KEY "=" value
    value := number | inf | 'quoted' | "quoted" | None | bare-word     e.g. 1e-3, 10, inf, token-mean

Examples: `ppo`, `ppo(clip_low=0.8, clip_high=1.2)`,
`dppo_binary_tv(low=0.15, high=0.15, clip_ratio_c=10, reduction=seq-mean-token-sum-norm)`.
Integers are read as floats (every numeric parameter is a float).
`clip_low`/`clip_high` are accepted as short aliases of Tinker's `clip_low_threshold`/
`clip_high_threshold`. Parameters are validated like Spindle's `_loss_config`: each loss takes
only its own keys, numbers are finite (`clip_ratio_c` may be inf), 0 ≤ low ≤ high for
ppo/cispo, beta ≥ 0, thresholds ≥ 0; choices (surrogate, anchor, reduction, zero_adv) must be
one of their listed values. Any violation is a ValueError naming the key and the valid ones.
"""

from __future__ import annotations

import inspect
import math
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, Union, get_args, get_origin, get_type_hints

from losslab.callspec import CallSpecError, format_call, parse_call
from losslab.loss_names import LOSS_FUNCTIONS
from losslab.losses import policy
from losslab.losses.data import TokenData
from losslab.losses.policy import LossOutput

_LOSSES: dict[str, Callable[..., LossOutput]] = {
    name: getattr(policy, function) for name, function in LOSS_FUNCTIONS.items()
}
LOSS_NAMES: tuple[str, ...] = tuple(_LOSSES)

_CALL_TIME = ("num_tokens", "num_sequences")  # global counts change per minibatch: not config
_ALIASES = {"clip_low": "clip_low_threshold", "clip_high": "clip_high_threshold"}
_NON_NEGATIVE = {"clip_low_threshold", "clip_high_threshold", "low", "high", "beta", "kl_tau"}
_ORDERED = {"ppo", "cispo"}  # Spindle: 0 <= low <= high


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
    def needs_policy_inputs(self) -> bool:
        """Whether the loss reads sampler log-probs and advantages (all but cross_entropy)."""
        return self.name != "cross_entropy"

    @property
    def spec(self) -> str:
        """The canonical spec string; `parse_loss_spec(fn.spec)` rebuilds an equal LossFn."""
        params = {k: v for k, v in self.params.items() if v is not None}
        return format_call(self.name, params, bare_words=True)


def loss_parameters(name: str) -> dict[str, Any]:
    """The configurable parameters of loss `name` with their defaults."""
    fn = _lookup(name)
    return {
        p.name: p.default
        for p in inspect.signature(fn).parameters.values()
        if p.kind is p.KEYWORD_ONLY and p.name not in _CALL_TIME
    }


def _lookup(name: str) -> Callable[..., LossOutput]:
    if name not in _LOSSES:
        raise ValueError(f"unknown loss {name!r}; valid losses: {', '.join(LOSS_NAMES)}")
    return _LOSSES[name]


def _check_value(loss: str, key: str, value: Any, hint: Any) -> Any:
    """Validate one parameter against its annotation and the Spindle-style rules."""
    where = f"{loss}: {key}={value!r}"
    if get_origin(hint) is Literal:
        choices = get_args(hint)
        if value not in choices:
            raise ValueError(f"{where} is not valid; expected one of {', '.join(choices)}")
        return value
    # `float | None` is a types.UnionType, `Optional[float]` a typing.Union: accept both.
    optional = get_origin(hint) in (Union, types.UnionType) and type(None) in get_args(hint)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{where}: expected a number")
    value = float(value)
    if math.isnan(value) or (math.isinf(value) and key != "clip_ratio_c"):
        raise ValueError(f"{where}: expected a finite number")
    if key in _NON_NEGATIVE and value < 0:
        raise ValueError(f"{where}: expected a value >= 0")
    if key in ("clip_ratio_c", "norm_constant") and value <= 0:
        raise ValueError(f"{where}: expected a value > 0")
    return value


def get_loss(name: str, **params: Any) -> LossFn:
    """The loss `name` with `params` bound and validated (missing ones take their defaults).

    Raises:
        ValueError: unknown loss name, unknown parameter, or invalid value; the message lists
            the valid names/parameters/choices.
    """
    fn = _lookup(name)
    defaults = loss_parameters(name)
    hints = get_type_hints(fn)
    resolved: dict[str, Any] = dict(defaults)
    given: set[str] = set()
    for raw_key, value in params.items():
        key = _ALIASES.get(raw_key, raw_key)
        if key not in defaults:
            raise ValueError(
                f"unknown parameter {raw_key!r} for loss {name!r}; "
                f"valid parameters: {', '.join(defaults)}"
            )
        if key in given:
            raise ValueError(f"parameter {key!r} of loss {name!r} is given twice (with an alias)")
        given.add(key)
        resolved[key] = _check_value(name, key, value, hints[key])
    if name in _ORDERED and resolved["clip_low_threshold"] > resolved["clip_high_threshold"]:
        raise ValueError(
            f"{name}: clip_low_threshold={resolved['clip_low_threshold']} must be <= "
            f"clip_high_threshold={resolved['clip_high_threshold']}"
        )
    if (
        name == "ppo"
        and resolved["surrogate"] == "clipped"
        and resolved["clip_ratio_c"] != math.inf
    ):
        raise ValueError(
            f"ppo: clip_ratio_c={resolved['clip_ratio_c']} needs surrogate='ratio' or 'logprob'; "
            "Tinker's clipped surrogate has no importance-weight cap"
        )
    return LossFn(name=name, params=resolved, fn=fn)


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
            f"{exc}, e.g. 'ppo(clip_low=0.8, clip_high=1.2)'; valid losses: {', '.join(LOSS_NAMES)}"
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
    given = {_ALIASES.get(k, k): p.source for k, p in resolved.params.items()}
    provenance = {key: given.get(key, DEFAULT_SOURCE) for key in loss.params}
    return replace(loss, provenance=provenance)
