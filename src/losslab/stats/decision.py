"""The plan's pre-registered decision rule applied to paired per-item evaluation results.

For each criterion, D_i = sum_a w_a * x_a,i over the arms the weights name (e.g. treatment accuracy
minus baseline accuracy on item i). The deciding interval is the paired Hoeffding interval of
mean(D), with D's range taken from the criterion's bounds and weights:

    validated     if  CI low  > margin
    refuted       if  CI high < margin
    inconclusive  otherwise (a positive gap smaller than the half-width is inconclusive)

Exact McNemar, paired-t and empirical-Bernstein intervals are reported beside it and never decide.
The interval covers test-set sampling for these fixed checkpoints, not training-seed variation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np

from losslab.plan import EVAL_METRICS, Criterion, DecisionRule, Plan, weighted_range
from losslab.stats.paired import (
    IntervalEstimate,
    empirical_bernstein_ci,
    hoeffding_ci,
    mcnemar_exact,
    paired_t_ci,
)
from losslab.stats.power import ToSettle, to_settle

VerdictWord = Literal["validated", "refuted", "inconclusive"]


@dataclass(frozen=True)
class PairedOutcomes:
    """Per-item metric values of each arm on the same items, in the same order.

    `values[arm][metric]` is a float array of length n; `arm` is an arm name or role (whatever the
    criteria's weights use, or resolvable through the plan's roles).
    """

    item_ids: tuple[str, ...]
    values: Mapping[str, Mapping[str, np.ndarray]]

    @property
    def n(self) -> int:
        return len(self.item_ids)

    @classmethod
    def from_arrays(
        cls,
        arrays: Mapping[str, Mapping[str, Sequence[float]]],
        item_ids: Sequence[str] | None = None,
    ) -> PairedOutcomes:
        """From per-arm, per-metric sequences that are already aligned by item."""
        lengths = {len(v) for metrics in arrays.values() for v in metrics.values()}
        if len(lengths) != 1:
            raise ValueError(
                f"arms are not paired: per-item sequences have lengths {sorted(lengths)}"
            )
        n = lengths.pop()
        ids = tuple(str(i) for i in (item_ids if item_ids is not None else range(n)))
        if len(ids) != n:
            raise ValueError(f"item_ids has {len(ids)} entries for {n} items")
        values = {
            arm: {m: np.asarray(v, dtype=np.float64) for m, v in metrics.items()}
            for arm, metrics in arrays.items()
        }
        return cls(ids, values)

    @classmethod
    def from_records(
        cls, records_by_arm: Mapping[str, Sequence[Mapping[str, Any]]], id_key: str = "id"
    ) -> PairedOutcomes:
        """From per-item evaluation records (one dict per item, e.g. a line of eval_<arm>.jsonl).

        Items are paired by `id_key`; each arm must have scored exactly the same items. A
        criterion metric is read from the record key `EVAL_METRICS` maps it to (accuracy <-
        `correct`, booleans as 0/1).
        """
        per_arm: dict[str, dict[str, Mapping[str, Any]]] = {}
        for arm, records in records_by_arm.items():
            by_id: dict[str, Mapping[str, Any]] = {}
            for k, rec in enumerate(records):
                if id_key not in rec:
                    raise ValueError(f"{arm} record {k} has no {id_key!r} field")
                item = str(rec[id_key])
                if item in by_id:
                    raise ValueError(f"{arm}: item {item!r} appears twice")
                by_id[item] = rec
            per_arm[arm] = by_id
        arms = list(per_arm)
        if not arms:
            raise ValueError("no arms given")
        ids = sorted(per_arm[arms[0]])
        for arm in arms[1:]:
            if set(per_arm[arm]) != set(ids):
                only_a = sorted(set(ids) - set(per_arm[arm]))[:5]
                only_b = sorted(set(per_arm[arm]) - set(ids))[:5]
                raise ValueError(
                    f"arms {arms[0]} and {arm} scored different items (only in {arms[0]}: "
                    f"{only_a}, only in {arm}: {only_b}); a paired verdict needs the same items"
                )
        values: dict[str, dict[str, np.ndarray]] = {}
        for arm in arms:
            values[arm] = {}
            for metric, key in EVAL_METRICS.items():
                if all(key in per_arm[arm][i] for i in ids):
                    values[arm][metric] = np.array(
                        [_number(per_arm[arm][i][key], arm, i, key) for i in ids], dtype=np.float64
                    )
        return cls(tuple(ids), values)


def _number(value: Any, arm: str, item: str, key: str) -> float:
    if isinstance(value, bool | int | float | np.bool_ | np.number):
        return float(value)
    raise ValueError(f"{arm} item {item!r}: {key} = {value!r} is not a number or boolean")


@dataclass(frozen=True)
class CriterionResult:
    """One criterion's estimate, deciding interval, secondary analyses and verdict word."""

    id: str
    metric: str
    weights: dict[str, float]
    arms: dict[str, str]
    """weight key -> the outcomes key it was read from."""
    arm_means: dict[str, float]
    bounds: list[float]
    d_range: list[float]
    margin: float
    n: int
    estimate: float
    ci: list[float]
    half_width: float
    verdict: VerdictWord
    secondary: dict[str, Any]


@dataclass(frozen=True)
class Verdict:
    """The verdict record (`verdict.json`): `to_dict()` gives the JSON object."""

    verdict: VerdictWord
    method: str
    alpha: float
    n: int
    criteria: list[CriterionResult]
    statement: str
    estimand: str | None = None
    unit: str | None = None
    seeds: list[int] = field(default_factory=list)
    to_settle: dict[str, Any] | None = None
    """For an inconclusive verdict, the test items that would settle an effect of the observed
    size (`losslab.stats.power.to_settle`); None otherwise."""

    @property
    def primary(self) -> CriterionResult:
        return self.criteria[0]

    def to_dict(self) -> dict[str, Any]:
        """One JSON object: the primary criterion's definition, estimate, CI, method, n, the
        secondary analyses, the verdict word and a plain-language statement; `criteria` lists
        every criterion's result."""
        p = self.primary
        return {
            "verdict": self.verdict,
            "criterion": {
                "id": p.id,
                "metric": p.metric,
                "weights": p.weights,
                "arms": p.arms,
                "bounds": p.bounds,
                "margin": p.margin,
                "test": comparison_kind(p.margin),
            },
            "estimate": p.estimate,
            "ci": p.ci,
            "half_width": p.half_width,
            "confidence": 1.0 - self.alpha,
            "method": self.method,
            "alpha": self.alpha,
            "n": self.n,
            "arm_means": p.arm_means,
            "secondary": p.secondary,
            "statement": self.statement,
            "estimand": self.estimand,
            "unit": self.unit,
            "seeds": self.seeds,
            "criteria": [asdict(c) for c in self.criteria],
            "to_settle": self.to_settle,
        }


def _resolve_key(key: str, outcomes: PairedOutcomes, roles: Mapping[str, str]) -> str:
    if key in outcomes.values:
        return key
    if key in roles and roles[key] in outcomes.values:
        return roles[key]
    reverse = {name: role for role, name in roles.items()}
    if key in reverse and reverse[key] in outcomes.values:
        return reverse[key]
    raise ValueError(
        f"the criterion weights name {key!r}, but the outcomes hold arms {sorted(outcomes.values)}"
    )


def verdict_word(ci: Sequence[float], margin: float) -> VerdictWord:
    """`validated` if the CI lies above the margin, `refuted` if below, else `inconclusive`."""
    if ci[0] > margin:
        return "validated"
    if ci[1] < margin:
        return "refuted"
    return "inconclusive"


def _secondary(
    columns: dict[str, np.ndarray],
    weights: Mapping[str, float],
    bounds: Sequence[float],
    d_N: np.ndarray,
    d_range: tuple[float, float],
    alpha: float,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "paired_t": paired_t_ci(d_N, alpha, d_range).to_dict(),
        "empirical_bernstein": empirical_bernstein_ci(d_N, d_range, alpha).to_dict(),
    }
    lo, hi = float(bounds[0]), float(bounds[1])
    ws = list(weights.values())
    binary = all(np.all((v == lo) | (v == hi)) for v in columns.values())
    if len(ws) == 2 and ws[0] == -ws[1] and binary:
        keys = list(weights)
        pos_key = keys[0] if ws[0] > 0 else keys[1]
        neg_key = keys[1] if ws[0] > 0 else keys[0]
        to01 = {k: (columns[k] - lo) / (hi - lo) for k in keys}
        result = mcnemar_exact(to01[pos_key], to01[neg_key], alpha, scale=abs(ws[0]) * (hi - lo))
        out["mcnemar_exact"] = {**result.to_dict(), "b_means": f"{pos_key} right, {neg_key} wrong"}
    else:
        out["mcnemar_exact"] = {
            "applicable": False,
            "reason": "needs two arms with opposite weights and binary outcomes at the bounds",
        }
    return out


def evaluate_criterion(
    criterion: Criterion,
    outcomes: PairedOutcomes,
    alpha: float,
    roles: Mapping[str, str] | None = None,
) -> CriterionResult:
    """Estimate, deciding Hoeffding CI, secondary intervals and verdict word for one criterion."""
    roles = roles or {}
    keys = {k: _resolve_key(k, outcomes, roles) for k in criterion.weights}
    columns: dict[str, np.ndarray] = {}
    for k, arm_key in keys.items():
        metrics = outcomes.values[arm_key]
        if criterion.metric not in metrics:
            raise ValueError(
                f"criterion {criterion.id!r} needs metric {criterion.metric!r}, but arm "
                f"{arm_key!r} has only {sorted(metrics)}"
            )
        col = metrics[criterion.metric]
        lo, hi = criterion.bounds
        if col.size and (col.min() < lo or col.max() > hi):
            raise ValueError(
                f"criterion {criterion.id!r}: arm {arm_key!r} {criterion.metric} values lie in "
                f"[{col.min():g}, {col.max():g}], outside the plan's bounds {criterion.bounds}"
            )
        columns[k] = col
    # D_N[i] = sum_a w_a * x_a[i]: one paired difference per item
    d_N = sum(w * columns[k] for k, w in criterion.weights.items())
    assert isinstance(d_N, np.ndarray)
    d_range = weighted_range(criterion.weights, criterion.bounds)
    deciding: IntervalEstimate = hoeffding_ci(d_N, d_range, alpha)
    assert deciding.half_width is not None  # Hoeffding is symmetric
    return CriterionResult(
        id=criterion.id,
        metric=criterion.metric,
        weights=dict(criterion.weights),
        arms=keys,
        arm_means={k: float(col.mean()) for k, col in columns.items()},
        bounds=list(criterion.bounds),
        d_range=list(d_range),
        margin=criterion.margin,
        n=int(d_N.size),
        estimate=deciding.estimate,
        ci=[deciding.low, deciding.high],
        half_width=deciding.half_width,
        verdict=verdict_word(deciding.ci, criterion.margin),
        secondary=_secondary(columns, criterion.weights, criterion.bounds, d_N, d_range, alpha),
    )


def _overall(words: Sequence[VerdictWord]) -> VerdictWord:
    """All criteria validated -> validated; any refuted -> refuted; else inconclusive."""
    if all(w == "validated" for w in words):
        return "validated"
    if any(w == "refuted" for w in words):
        return "refuted"
    return "inconclusive"


def _statement(
    result: CriterionResult,
    word: VerdictWord,
    alpha: float,
    plan: Plan | None,
    seeds: Sequence[int] | None = None,
) -> str:
    level = f"{1 - alpha:.0%}"
    pos = [k for k, w in result.weights.items() if w > 0]
    neg = [k for k, w in result.weights.items() if w < 0]

    def describe(key: str) -> str:
        arm_key = result.arms[key]
        if plan is None:
            return arm_key
        try:
            arm = plan.arm(arm_key)
        except KeyError:
            return arm_key
        return f"{arm.name} (loss {plan.loss_spec(arm)})"

    compared = " + ".join(describe(k) for k in pos) or "0"
    if neg:
        compared += " minus " + " + ".join(describe(k) for k in neg)
    where = f"{result.n} items"
    seed_text = ""
    checkpoints = "these two fixed final checkpoints"
    if plan is not None:
        where = f"{result.n} items of {plan.eval.benchmark}"
        seeds = seeds or sorted({a.seed for a in plan.arms})
        seed_text = f" (training seed {', '.join(map(str, seeds))})"
    if seeds and len(seeds) > 1:
        checkpoints = f"these {len(seeds)} fixed pairs of final checkpoints"
        seed_text = f" (training seeds {', '.join(map(str, seeds))}; per item, the mean over them)"
    reason = {
        "validated": f"its lower bound is above the pre-registered margin {result.margin:g}",
        "refuted": f"its upper bound is below the pre-registered margin {result.margin:g}",
        "inconclusive": f"it contains the pre-registered margin {result.margin:g}",
    }[word]
    return (
        f"We compared per-item {result.metric}, {compared}, on {where}. The mean paired "
        f"difference is {result.estimate:+.4f}, with a {level} paired Hoeffding interval "
        f"[{result.ci[0]:+.4f}, {result.ci[1]:+.4f}] (half-width {result.half_width:.4f}); the "
        f"verdict is {word} because {reason}. This interval covers the sampling of test items for "
        f"{checkpoints}{seed_text}; it does not cover variation across "
        f"training seeds or reruns, so it is evidence about these checkpoints, not a general "
        f"ranking of the two losses. Exact McNemar, paired-t and empirical-Bernstein analyses are "
        f"reported alongside and do not change the verdict.{_non_inferiority(result)}"
    )


def comparison_kind(margin: float) -> str:
    """`non-inferiority` for a negative margin (validated = no worse than it), else `superiority`."""
    return "non-inferiority" if margin < 0 else "superiority"


def _non_inferiority(result: CriterionResult) -> str:
    if result.margin >= 0:
        return ""
    return (
        f" The margin is negative, so this is a non-inferiority test: 'validated' means the "
        f"difference is above {result.margin:g} (no worse by more than {-result.margin:g}), not "
        f"that the treatment is better."
    )


def _others(results: Sequence[CriterionResult], word: VerdictWord) -> str:
    if len(results) == 1:
        return ""
    rest = "; ".join(f"{r.id}: {r.verdict}" for r in results[1:])
    return (
        f" The plan has {len(results)} criteria ({results[0].id}: {results[0].verdict}; {rest}); "
        f"the overall verdict is {word} (validated only if all are, refuted if any is)."
    )


def decide(
    decision_rule: DecisionRule,
    outcomes: PairedOutcomes | Mapping[str, Mapping[str, Sequence[float]]],
    *,
    plan: Plan | None = None,
    roles: Mapping[str, str] | None = None,
    seeds: Sequence[int] | None = None,
) -> Verdict:
    """Apply the plan's decision rule to paired per-item outcomes.

    Args:
        decision_rule: the plan's `decision_rule` (method `paired_hoeffding`).
        outcomes: `PairedOutcomes`, or a mapping arm -> metric -> per-item values aligned by item.
            Arms are keyed by the names the weights use, by arm name, or by role.
        plan: the plan, for arm roles and the plain-language statement (optional).
        roles: role -> arm name, when no plan is given and outcomes are keyed by arm name.
        seeds: the training seeds the outcomes come from, when several seeds were averaged per
            item (`losslab.stats.seeds`); default: the plan's arm seed.

    Returns:
        The `Verdict`; `verdict.to_dict()` is the verdict record.
    """
    if decision_rule.method != "paired_hoeffding":
        raise ValueError(f"decision_rule.method {decision_rule.method!r} is not paired_hoeffding")
    if not isinstance(outcomes, PairedOutcomes):
        outcomes = PairedOutcomes.from_arrays(outcomes)
    if outcomes.n < 1:
        raise ValueError("no paired items: a verdict needs at least one item scored by both arms")
    role_map = dict(plan.arm_roles()) if plan is not None else {}
    role_map.update(roles or {})
    results = [
        evaluate_criterion(c, outcomes, decision_rule.alpha, role_map)
        for c in decision_rule.criteria
    ]
    word = _overall([r.verdict for r in results])
    settle = _to_settle(results, decision_rule.alpha) if word == "inconclusive" else None
    return Verdict(
        verdict=word,
        method=decision_rule.method,
        alpha=decision_rule.alpha,
        n=outcomes.n,
        criteria=results,
        statement=_statement(results[0], results[0].verdict, decision_rule.alpha, plan, seeds)
        + _others(results, word)
        + ("" if settle is None else " " + settle.statement),
        estimand=decision_rule.estimand,
        unit=decision_rule.unit,
        seeds=list(decision_rule.seeds),
        to_settle=None if settle is None else settle.to_dict(),
    )


def _to_settle(results: Sequence[CriterionResult], alpha: float) -> ToSettle | None:
    """`to_settle` for the first inconclusive criterion, with the per-item sd of its D (the
    paired-t analysis's; with one item, the largest sd D's range allows at its mean)."""
    result = next((r for r in results if r.verdict == "inconclusive"), None)
    if result is None:
        return None
    low, high = result.d_range
    sd = result.secondary["paired_t"]["details"].get("sd")
    if sd is None:
        sd = math.sqrt(max(0.0, (high - result.estimate) * (result.estimate - low)))
    return to_settle(
        result.id, result.estimate, float(sd), result.n, alpha, (low, high), result.margin
    )


def verdict_line(record: Mapping[str, Any]) -> str:
    """The log's one line about a verdict record: `verdict: refuted (CI [-0.8395, -0.1605])`."""
    ci = record.get("ci")
    ci_text = f" (CI [{ci[0]:+.4f}, {ci[1]:+.4f}])" if ci else ""
    return f"verdict: {record.get('verdict')}{ci_text}"
