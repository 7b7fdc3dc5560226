"""What each loss declares, stdlib only: its parameters (defaults and domains), its cross-parameter
rules and the metric keys it logs.

A loss is its function (torch, `losses/policy.py` or a module of its own) plus its declaration
here. `declare(...)` registers the declaration in `LOSSES`, the one table of loss names; the
function names its declaration with `@loss_function(...)` (`losses/policy.py`), which takes its
defaults, domains and reduction from it. The plan layer reads this module without torch:
`losslab plan check` validates every arm's loss parameters with `LossDeclaration.resolve`, the
same call `get_loss` makes, and checks each activation-gate metric against the metric keys the
arm's loss declares (`LossDeclaration.metrics`).

    declare(
        "dro",                                   # registry name, as plans and get_loss spell it
        "losslab.losses.policy:dro",             # module:function, imported on first use
        params={"beta": Number(0.05, min=0.0)},  # every configurable parameter, in signature order
        extra_metrics=(),                        # keys logged beyond STANDARD_METRICS
    )

Every loss also takes `reduction` (a `Reduction`, default "sum") and `norm_constant` (None or a
finite number > 0); `declare` appends both. `clip_low`/`clip_high` alias Tinker's
`clip_low_threshold`/`clip_high_threshold` for every loss that has them (`PARAM_ALIASES`).
Integers are read as floats: every numeric parameter is a float.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

__all__ = [
    "LOSSES",
    "PARAM_ALIASES",
    "REDUCTION_PARAMS",
    "STANDARD_METRICS",
    "Anchor",
    "BatchScope",
    "Choice",
    "LogRatioGuard",
    "LossDeclaration",
    "Number",
    "PpoSurrogate",
    "Reduction",
    "Surrogate",
    "ZeroAdvantage",
    "declare",
    "loss_declaration",
    "ordered",
]

# --- the choices' vocabularies (the functions annotate with the same aliases) ---

Reduction = Literal[
    "sum", "token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"
]
"""How per-token losses become one number (`losses/reductions.py` defines each)."""
Surrogate = Literal["ratio", "logprob"]
PpoSurrogate = Literal["clipped", "ratio", "logprob"]
ZeroAdvantage = Literal["keep", "negative"]
Anchor = Literal["sampler", "recomputed"]
BatchScope = Literal["token", "batch"]
LogRatioGuard = Literal["upper", "both", "zero_grad", "none"]
"""How a DPPO loss guards exp(ℓ − ℓ_a) against overflow (four conventions in the wild, team notes
dppo_implementations.md §2.3):

* "upper" (Stable-RL, losslab's default): value e^min(Δ, 20), gradient straight through (dr/dℓ = r),
  so the gradient is −A·min(e^min(Δ,20), c).
* "both" (verl `dppo_tv`): Δ clamped to [−20, 20] in value, gradient straight through: as "upper"
  plus a weight floor of e^−20.
* "zero_grad" (SkyRL `safe_exp_delta`): r = exp(clamp(Δ, −20, 20)) with torch's clamp gradient,
  so a token with |Δ| > 20 gets NO gradient.
* "none" (Spindle, prime-rl): r = e^Δ, which overflows to inf in float32 beyond Δ ≈ 88.7.
"""

STANDARD_METRICS: tuple[str, ...] = (
    "loss/value",
    "loss/tokens",
    "loss/clip_fraction",
    "loss/clip_fraction_nonzero_adv",
    "loss/masked_count",
    "ratio/mean",
    "ratio/q50",
    "ratio/q90",
    "drift/abs_p_q50",
    "drift/abs_p_q90",
    "loss/pg_grad_norm",
)
"""The keys every loss logs (`losses.policy._output` computes them; docs/interfaces.md)."""

PARAM_ALIASES: dict[str, str] = {
    "clip_low": "clip_low_threshold",
    "clip_high": "clip_high_threshold",
}
"""Short spellings accepted for a parameter, for every loss that has the long one."""

REDUCTION_PARAMS = ("reduction", "norm_constant")
"""Parameters every loss takes, appended by `declare` and applied by `loss_function`."""


# --- parameter domains ---


@dataclass(frozen=True)
class Number:
    """A float parameter: its default and its domain.

    Args:
        default: the value when a plan or caller does not set it (None only with `optional`).
        min, max: inclusive bounds (value >= min, value <= max).
        above, below: strict bounds (value > above, value < below).
        allow_inf: accept ±inf (e.g. an importance-weight cap, where inf means "no cap"); the
            bounds still apply, so `above=0` refuses -inf. Without it, inf is refused.
        optional: accept None (e.g. `norm_constant`: None means "this batch's own count").
    """

    default: float | None
    min: float | None = None
    max: float | None = None
    above: float | None = None
    below: float | None = None
    allow_inf: bool = False
    optional: bool = False

    def check(self, where: str, value: Any) -> float | None:
        """`value` as a float, or a ValueError `<where>: expected ...` naming the domain."""
        if value is None and self.optional:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{where}: expected a number")
        value = float(value)
        if math.isnan(value) or (math.isinf(value) and not self.allow_inf):
            raise ValueError(f"{where}: expected a finite number")
        for bound, holds, op in (
            (self.min, operator.ge, ">="),
            (self.above, operator.gt, ">"),
            (self.max, operator.le, "<="),
            (self.below, operator.lt, "<"),
        ):
            if bound is not None and not holds(value, bound):
                raise ValueError(f"{where}: expected a value {op} {bound:g}")
        return value


@dataclass(frozen=True)
class Choice:
    """A string parameter: its default and the options it may take (a `Literal`'s arguments)."""

    default: str
    options: tuple[str, ...]

    @classmethod
    def of(cls, literal: Any, default: str) -> Choice:
        """The choice among a `Literal` alias's arguments (`Choice.of(Surrogate, "ratio")`)."""
        return cls(default, tuple(get_args(literal)))

    def check(self, where: str, value: Any) -> str:
        if value not in self.options:
            raise ValueError(f"{where} is not valid; expected one of {', '.join(self.options)}")
        return value


Domain = Number | Choice
Rule = Callable[[Mapping[str, Any]], str | None]
"""A relation between parameters: the resolved values -> None, or what is wrong (one phrase)."""


def ordered(low: str, high: str) -> Rule:
    """The rule `low <= high` (e.g. Spindle's 0 <= clip_low_threshold <= clip_high_threshold)."""

    def rule(params: Mapping[str, Any]) -> str | None:
        if params[low] > params[high]:
            return f"{low}={params[low]} must be <= {high}={params[high]}"
        return None

    return rule


# --- the declaration ---


@dataclass(frozen=True, eq=False)
class LossDeclaration:
    """What a loss is, as data: readable without torch (see the module docstring)."""

    name: str
    """Registry name: how plans, specs and `get_loss` name the loss."""
    function: str
    """`module:attribute` of its `@loss_function(...)` function; imported on first use."""
    params: Mapping[str, Domain]
    """Every configurable parameter in signature order, `reduction` and `norm_constant` last."""
    metrics: tuple[str, ...]
    """Every metric key the loss logs (`STANDARD_METRICS` + its own); `loss_function` refuses
    an output with any other set of keys, and `plan check` reads it for the activation gate."""
    rules: tuple[Rule, ...] = ()
    reads_policy_inputs: bool = True
    """Whether it reads sampler log-probs and advantages (False: cross-entropy)."""
    batch_scope: BatchScope = "token"
    """"token": per-token/per-sequence terms, so minibatches reduced with global counts sum to
    the full batch; "batch": a statistic over the whole optimizer batch (M2PO's second moment,
    the Cov losses' top-k) decides the mask, so `loss_function` refuses global counts larger
    than the batch it is given (a gradient-accumulation split would run another algorithm)."""
    sequence_ratio: bool = False
    """The per-token term goes through a sequence-level ratio of the token ratios' geometric
    mean (GMPO), so at ratio 1 each token's gradient carries an extra 1/|o| beyond the
    reduction's weight (the preflight's `on_policy_gradient` property reads it)."""
    constant_normaliser: bool = False
    """The loss divides by a constant of its own (Dr. GRPO's C): at ratio 1 its gradient is the
    reduction's −A·m·w times one positive factor, which `on_policy_gradient` measures and
    reports instead of requiring 1."""
    detaches_tokens: bool = False
    """The loss stops the gradient of some tokens whatever the ratio (Clip-Cov's covariance-
    selected tokens): `on_policy_gradient` then holds the other tokens to −A·m·w and reports how
    many were detached (fewer than half, else the loss did nothing)."""
    defaults: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "defaults", {k: d.default for k, d in self.params.items()})

    def resolve(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """Every parameter's value: `given` (aliases allowed) checked against its domain and the
        rules, the others their defaults.

        Raises:
            ValueError: an unknown parameter (listing the valid ones), a parameter given twice
                (with an alias), a value outside its domain or a broken rule, each naming the
                loss, the key, the value and what was expected.
        """
        resolved = dict(self.defaults)
        given_keys: set[str] = set()
        for raw_key, value in given.items():
            key = PARAM_ALIASES.get(raw_key, raw_key)
            if key not in self.params:
                raise ValueError(
                    f"unknown parameter {raw_key!r} for loss {self.name!r}; "
                    f"valid parameters: {', '.join(self.params)}"
                )
            if key in given_keys:
                raise ValueError(
                    f"parameter {key!r} of loss {self.name!r} is given twice (with an alias)"
                )
            given_keys.add(key)
            resolved[key] = self.params[key].check(f"{self.name}: {key}={value!r}", value)
        for rule in self.rules:
            problem = rule(resolved)
            if problem:
                raise ValueError(f"{self.name}: {problem}")
        return resolved


LOSSES: dict[str, LossDeclaration] = {}
"""Registry name -> declaration, in declaration order: the one table of loss names."""

REDUCTION_DOMAINS: dict[str, Domain] = {
    "reduction": Choice.of(Reduction, "sum"),
    "norm_constant": Number(None, above=0.0, optional=True),
}


def _reduction_domains(default: Reduction) -> dict[str, Domain]:
    """`REDUCTION_DOMAINS` with the loss's own default reduction (its paper's aggregation)."""
    return {**REDUCTION_DOMAINS, "reduction": Choice.of(Reduction, default)}


def declare(
    name: str,
    function: str,
    *,
    params: Mapping[str, Domain],
    extra_metrics: tuple[str, ...] = (),
    rules: tuple[Rule, ...] = (),
    reads_policy_inputs: bool = True,
    reduction: Reduction = "sum",
    batch_scope: BatchScope = "token",
    sequence_ratio: bool = False,
    constant_normaliser: bool = False,
    detaches_tokens: bool = False,
) -> LossDeclaration:
    """Declare and register the loss `name` (the module docstring shows a call).

    `reduction` is the default of its `reduction` parameter (Tinker's built-ins: "sum"; the
    field's losses: their paper's aggregation, e.g. DAPO's "token-mean"); `batch_scope`,
    `sequence_ratio`, `constant_normaliser` and `detaches_tokens` see `LossDeclaration`.

    Raises:
        ValueError: the name is taken, a parameter is a reduction one, or a default is outside
            its own domain (so a wrong declaration fails on import, not in a run).
    """
    if name in LOSSES:
        raise ValueError(f"loss {name!r} is declared twice")
    clash = set(params) & set(REDUCTION_PARAMS)
    if clash:
        raise ValueError(
            f"loss {name!r}: {sorted(clash)} are every loss's; declare does not take them"
        )
    declaration = LossDeclaration(
        name=name,
        function=function,
        params={**params, **_reduction_domains(reduction)},
        metrics=STANDARD_METRICS + tuple(extra_metrics),
        rules=tuple(rules),
        reads_policy_inputs=reads_policy_inputs,
        batch_scope=batch_scope,
        sequence_ratio=sequence_ratio,
        constant_normaliser=constant_normaliser,
        detaches_tokens=detaches_tokens,
    )
    declaration.resolve(declaration.defaults)  # defaults must satisfy their domains and rules
    LOSSES[name] = declaration
    return declaration


def loss_declaration(name: str) -> LossDeclaration:
    """The declaration of loss `name`; ValueError listing the valid names otherwise."""
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; valid losses: {', '.join(LOSSES)}")
    return LOSSES[name]


# --- the losses (their functions: losslab.losses.policy; docs/interfaces.md) ---

_POLICY = "losslab.losses.policy"
_IS_CAP = Number(math.inf, above=0.0, allow_inf=True)  # importance-weight cap c; inf = none


def _clipped_has_no_cap(params: Mapping[str, Any]) -> str | None:
    if params["surrogate"] == "clipped" and params["clip_ratio_c"] != math.inf:
        return (
            f"clip_ratio_c={params['clip_ratio_c']} needs surrogate='ratio' or 'logprob'; "
            "Tinker's clipped surrogate has no importance-weight cap"
        )
    return None


IMPORTANCE_SAMPLING = declare(
    "importance_sampling",
    f"{_POLICY}:importance_sampling",
    params={"surrogate": Choice.of(Surrogate, "ratio"), "clip_ratio_c": _IS_CAP},
)

PPO = declare(
    "ppo",
    f"{_POLICY}:ppo",
    params={
        "clip_low_threshold": Number(0.8, min=0.0),
        "clip_high_threshold": Number(1.2, min=0.0),
        "surrogate": Choice.of(PpoSurrogate, "clipped"),
        "clip_ratio_c": _IS_CAP,
        "zero_adv": Choice.of(ZeroAdvantage, "keep"),
    },
    rules=(ordered("clip_low_threshold", "clip_high_threshold"), _clipped_has_no_cap),
)

CISPO = declare(
    "cispo",
    f"{_POLICY}:cispo",
    params={
        "clip_low_threshold": Number(0.0, min=0.0),
        "clip_high_threshold": Number(4.0, min=0.0),
    },
    extra_metrics=("cispo/clip_fraction",),
    rules=(ordered("clip_low_threshold", "clip_high_threshold"),),
)

DRO = declare("dro", f"{_POLICY}:dro", params={"beta": Number(0.05, min=0.0)})

CROSS_ENTROPY = declare(
    "cross_entropy", f"{_POLICY}:cross_entropy_loss", params={}, reads_policy_inputs=False
)


DPPO_METRICS = ("dppo/mask_fraction", "dppo/mask_fraction_nonzero_adv")


def _declare_dppo(name: str, threshold: float) -> LossDeclaration:
    """DPPO-Binary-TV/-KL: the divergence threshold (both directions) and the convention knobs
    in which the public implementations differ (docs/interfaces.md)."""
    params: dict[str, Domain] = {
        "low": Number(threshold, min=0.0),
        "high": Number(threshold, min=0.0),
        "anchor": Choice.of(Anchor, "sampler"),
        "weight_anchor": Choice.of(Anchor, "sampler"),
        "clip_ratio_c": Number(10.0, above=0.0, allow_inf=True),
        "log_ratio_guard": Choice.of(LogRatioGuard, "upper"),
        "kl_tau": Number(0.0, min=0.0),
        "surrogate": Choice.of(Surrogate, "ratio"),
        "zero_adv": Choice.of(ZeroAdvantage, "negative"),
    }
    return declare(name, f"{_POLICY}:{name}", params=params, extra_metrics=DPPO_METRICS)


DPPO_BINARY_TV = _declare_dppo("dppo_binary_tv", 0.15)  # the paper's / verl's TV threshold
DPPO_BINARY_KL = _declare_dppo("dppo_binary_kl", 0.05)  # the paper's KL threshold


# --- the field's policy losses (their functions: losslab.losses.field; docs/losses.md) ---
#
# Ratio bounds are written as each loss's own paper writes them: GSPO/GMPO/SAPO/CISPO-eps as
# offsets ε from 1 (or log-space bounds), the PPO family as Tinker's absolute thresholds (so
# `clip_low`/`clip_high` alias them). Each default is its paper's (or the reference
# framework's, named in the docs), and so is each default reduction.

_FIELD = "losslab.losses.field"
CispoMeaning = Literal["absolute_cap", "one_plus_eps"]
DrGrpoConstant = Literal["max_completion_length", "max_seq_len", "padded_width"]
GspoLevel = Literal["sequence", "token"]
GspoGuard = Literal["upper", "verl", "none"]
"""How GSPO guards exp(log s): "upper" losslab's straight-through clamp at 20; "verl" verl's
`torch.clamp(log s, max=10)` (value capped at e^10, NO gradient beyond); "none" TRL's plain
exp (inf beyond 88.7 in float32)."""
CorrectionLevel = Literal["token", "sequence"]
CorrectionMode = Literal["truncate", "mask"]

_PPO_BOUNDS: dict[str, Domain] = {
    "clip_low_threshold": Number(0.8, min=0.0),
    "clip_high_threshold": Number(1.2, min=0.0),
}
_ORDERED_BOUNDS = ordered("clip_low_threshold", "clip_high_threshold")
_ZERO_ADV = Choice.of(ZeroAdvantage, "keep")


def _cispo_eps_lower(params: Mapping[str, Any]) -> str | None:
    if params["epsilon_meaning"] == "absolute_cap" and params["epsilon_low"] is not None:
        return (
            f"epsilon_low={params['epsilon_low']} needs epsilon_meaning='one_plus_eps'; TRL's "
            "absolute cap (epsilon_meaning='absolute_cap') has no lower bound"
        )
    return None


def _dr_grpo_prompt_length(params: Mapping[str, Any]) -> str | None:
    if params["constant"] != "max_seq_len" and params["max_prompt_length"] != 0:
        return (
            f"max_prompt_length={params['max_prompt_length']} is read only with "
            f"constant='max_seq_len' (SkyRL's prompt + completion), not constant="
            f"{params['constant']!r}"
        )
    return None


def _sampler_pair_has_no_ppo_clip(params: Mapping[str, Any]) -> str | None:
    bounds = (params["clip_low_threshold"], params["clip_high_threshold"])
    if params["anchor"] == "sampler" and bounds != (0.0, math.inf):
        return (
            f"clip thresholds {bounds[0]}/{bounds[1]} need anchor='recomputed'; with "
            "anchor='sampler' the truncated/masked weight IS the importance ratio, there is no "
            "PPO ratio to clip (leave 0/inf)"
        )
    return None


def _logprob_value_needs_sampler(params: Mapping[str, Any]) -> str | None:
    if params["anchor"] == "recomputed" and params["surrogate"] != "ratio":
        return (
            f"surrogate={params['surrogate']!r} needs anchor='sampler'; with anchor='recomputed' "
            "the value is the weighted PPO surrogate"
        )
    return None


_CORRECTION_PARAMS: dict[str, Domain] = {
    # "sampler": the weight is π_θ/π_s itself (bypass: no separate old policy); "recomputed":
    # the weight is π_o/π_s and a PPO ratio π_θ/π_o is clipped (decoupled PPO)
    "anchor": Choice.of(Anchor, "sampler"),
    "clip_low_threshold": Number(0.0, min=0.0),
    "clip_high_threshold": Number(math.inf, min=0.0, allow_inf=True),
    "surrogate": Choice.of(Surrogate, "ratio"),
    "zero_adv": _ZERO_ADV,
}


GSPO_PARAMS: dict[str, Domain] = {
    "level": Choice.of(GspoLevel, "sequence"),
    "epsilon_low": Number(3e-4, min=0.0),
    "epsilon_high": Number(4e-4, min=0.0),
    "log_ratio_guard": Choice.of(GspoGuard, "upper"),
    "zero_adv": _ZERO_ADV,
}
GSPO = declare(
    "gspo",
    f"{_FIELD}:gspo",
    params=GSPO_PARAMS,
    extra_metrics=("gspo/seq_ratio_mean",),
    reduction="seq-mean-token-mean",
)

LUSPO = declare(
    "luspo",
    f"{_FIELD}:luspo",
    params=GSPO_PARAMS,
    extra_metrics=("gspo/seq_ratio_mean",),
    reduction="seq-mean-token-sum",
)

CISPO_EPS = declare(
    "cispo_eps",
    f"{_FIELD}:cispo_eps",
    params={
        "epsilon_meaning": Choice.of(CispoMeaning, "absolute_cap"),
        "epsilon_low": Number(None, min=0.0, optional=True),
        "epsilon_high": Number(5.0, above=0.0),
    },
    extra_metrics=("cispo/clip_fraction",),
    rules=(_cispo_eps_lower,),
    reduction="token-mean",
)

DR_GRPO = declare(
    "dr_grpo",
    f"{_FIELD}:dr_grpo",
    params={
        **_PPO_BOUNDS,
        "constant": Choice.of(DrGrpoConstant, "max_completion_length"),
        "max_completion_length": Number(256.0, min=1.0),
        "max_prompt_length": Number(0.0, min=0.0),
        "zero_adv": _ZERO_ADV,
    },
    extra_metrics=("dr_grpo/constant",),
    rules=(_ORDERED_BOUNDS, _dr_grpo_prompt_length),
    reduction="seq-mean-token-sum",
    constant_normaliser=True,
)

DAPO = declare(
    "dapo",
    f"{_FIELD}:dapo",
    params={
        "clip_low_threshold": Number(0.8, min=0.0),
        "clip_high_threshold": Number(1.28, min=0.0),
        "zero_adv": _ZERO_ADV,
    },
    rules=(_ORDERED_BOUNDS,),
    reduction="token-mean",
)

DUAL_CLIP_PPO = declare(
    "dual_clip_ppo",
    f"{_FIELD}:dual_clip_ppo",
    params={**_PPO_BOUNDS, "clip_ratio_c": Number(3.0, above=1.0), "zero_adv": _ZERO_ADV},
    extra_metrics=("dual_clip/fraction",),
    rules=(_ORDERED_BOUNDS, ordered("clip_high_threshold", "clip_ratio_c")),
    reduction="token-mean",
)

ICEPOP = declare(
    "icepop",
    f"{_FIELD}:icepop",
    params={
        "low": Number(0.5, min=0.0),
        "high": Number(5.0, above=0.0),
        **_CORRECTION_PARAMS,
    },
    extra_metrics=("icepop/mask_fraction",),
    rules=(
        ordered("low", "high"),
        _ORDERED_BOUNDS,
        _sampler_pair_has_no_ppo_clip,
        _logprob_value_needs_sampler,
    ),
    reduction="token-mean",
)

ROLLOUT_CORRECTION = declare(
    "rollout_correction",
    f"{_FIELD}:rollout_correction",
    params={
        "level": Choice.of(CorrectionLevel, "token"),
        "mode": Choice.of(CorrectionMode, "truncate"),
        "cap": Number(2.0, above=0.0),
        "lower": Number(0.0, min=0.0),
        **_CORRECTION_PARAMS,
    },
    extra_metrics=("rollout_correction/weight_mean", "rollout_correction/affected_fraction"),
    rules=(
        ordered("lower", "cap"),
        _ORDERED_BOUNDS,
        _sampler_pair_has_no_ppo_clip,
        _logprob_value_needs_sampler,
    ),
    reduction="token-mean",
)

SAPO = declare(
    "sapo",
    f"{_FIELD}:sapo",
    params={"tau_pos": Number(1.0, above=0.0), "tau_neg": Number(1.05, above=0.0)},
    extra_metrics=("sapo/gate_weight_mean",),
    reduction="seq-mean-token-mean",
)

GMPO = declare(
    "gmpo",
    f"{_FIELD}:gmpo",
    params={
        "log_ratio_low": Number(0.4, min=0.0),
        "log_ratio_high": Number(0.4, min=0.0),
        "log_ratio_guard": Choice.of(LogRatioGuard, "upper"),
        "zero_adv": _ZERO_ADV,
    },
    extra_metrics=("gmpo/seq_ratio_mean",),
    reduction="seq-mean-token-sum",
    sequence_ratio=True,
)

KL_COV = declare(
    "kl_cov",
    f"{_FIELD}:kl_cov",
    params={
        "kl_cov_ratio": Number(2e-4, min=0.0, max=1.0),
        "kl_coef": Number(1.0, min=0.0),
        "log_ratio_guard": Choice.of(LogRatioGuard, "upper"),
    },
    extra_metrics=("kl_cov/selected_fraction",),
    reduction="token-mean",
    batch_scope="batch",
)

CLIP_COV = declare(
    "clip_cov",
    f"{_FIELD}:clip_cov",
    params={
        **_PPO_BOUNDS,
        "clip_cov_ratio": Number(2e-4, min=0.0, max=1.0),
        "clip_cov_lb": Number(1.0),
        "clip_cov_ub": Number(5.0),
        "seed": Number(0.0, min=0.0),
        "log_ratio_guard": Choice.of(LogRatioGuard, "upper"),
        "zero_adv": _ZERO_ADV,
    },
    extra_metrics=("clip_cov/selected_fraction",),
    rules=(_ORDERED_BOUNDS, ordered("clip_cov_lb", "clip_cov_ub")),
    reduction="token-mean",
    detaches_tokens=True,
    batch_scope="batch",
)

M2PO = declare(
    "m2po",
    f"{_FIELD}:m2po",
    params={"tau": Number(0.04, above=0.0)},
    extra_metrics=("m2po/second_moment", "m2po/masked_fraction"),
    reduction="token-mean",
    batch_scope="batch",
)
