"""Power of the plan's paired decision rule: the smallest effect it detects, and the number of test
items that would settle an effect of an observed size.

**The rule as a threshold test.** Per item, D_i = sum_a w_a x_a,i lies in [low, high] (span
R = high - low), iid over items with mean delta and standard deviation sigma. The deciding interval
(paired Hoeffding, `losslab.stats.decision`) is mean(D) +- h with

    h = R * sqrt(ln(2 / alpha) / (2 n)),

which depends on n and alpha only, never on the data. So the rule is a fixed threshold on the
estimate: validated <=> mean(D) > t with t = margin + h (refuted <=> mean(D) < margin - h, the
mirror image; everything below is stated for `validated` and holds mirrored for `refuted`).

**Normal approximation.** mean(D) ~ N(delta, sigma^2 / n), so

    power(delta) = P(mean(D) > t) ~= Phi((delta - t) * sqrt(n) / sigma(delta)),                (1)

and the minimum detectable effect (MDE) at power 1 - beta is the delta that solves
delta = t + z * sigma(delta) / sqrt(n), z = Phi^-1(1 - beta) (0.8416 at 80%). Both variance models
below have sigma(delta)^2 = A + B delta - delta^2, so with k = z^2 / n squaring gives

    (1 + k) delta^2 - (2 t + k B) delta + (t^2 - k A) = 0,                                     (2)

whose larger root is the MDE (the smaller solves delta = t - z sigma / sqrt(n): power beta).
With S seeds (below), k = z^2 / (n S).

- **Discordance model** (two arms with weights +w and -w, binary outcomes at the bounds, e.g.
  treatment minus baseline accuracy): an item is discordant with probability d (the arms disagree).
  A discordant item is a treatment win (D = +s) or loss (D = -s), s = R / 2; so with b wins and c
  losses, (b, c, n - b - c) ~ Multinomial(n; (d + delta/s) / 2, (d - delta/s) / 2, 1 - d),
  b + c ~ Binomial(n, d) and the estimate is s (b - c) / n. E[D^2] = s^2 d, so
  sigma^2 = s^2 d - delta^2 (A = s^2 d, B = 0); an effect needs |delta| <= s d.
- **Any distribution** (no assumption on D but its range): Var(D) <= (high - delta)(delta - low)
  (Bhatia & Davis 2000), A = -low * high, B = low + high. This is the largest MDE any data of
  that range can have (for the two-arm binary case it is the discordance model at d = 1).

**Exact power under the discordance model.** Conditioning on the m = b + c discordant items,
b | m ~ Binomial(m, pi) with pi = (d + delta/s) / (2 d), and validated <=> 2 b - m > n t / s:

    power(delta) = sum_m Binomial(m; n, d) * P(b > (m + n t / s) / 2 | m).                     (3)

It increases with delta (b | m grows stochastically with pi), so the exact MDE is found by
bisection. `plan show` prints (3)'s MDE; (2) gives the worst case and the n that settles an effect.

**Seeds.** With S training seeds the rule averages each item over the seed pairs
(`losslab.stats.seeds`), so h, and hence t, is unchanged: the half-width counts items, not seeds.
Seeds only shrink sigma: to sigma / sqrt(S) if the seed pairs' outcomes on an item were independent
(then (3) holds with n S trials and the same t), less when hard items stay hard for every seed. So
the MDE with S seeds lies between the S = 1 value and the independent-seeds value, and is above t
for every S: no number of seeds makes the rule validate a true effect below margin + h with 80%
power. An inconclusive verdict has |estimate - margin| <= h, so only more items can settle an
effect of its size. Solving (1) for n at a fixed delta and sigma (h depends on n):

    sqrt(n) |delta - margin| = R sqrt(ln(2 / alpha) / 2) + z sigma
    n = ceil(((R sqrt(ln(2 / alpha) / 2) + z sigma) / |delta - margin|)^2).                   (4)

**Exact McNemar** (reported beside the verdict, never deciding): with u = delta / s, b - c has
mean n u and variance n (d - u^2), and the test rejects when b - c > z_{1 - alpha/2} sqrt(b + c),
sqrt(b + c) ~ sqrt(n d); the usual normal approximation (Connor 1987) gives

    power ~= Phi((u sqrt(n) - z_{1 - alpha/2} sqrt(d)) / sqrt(d - u^2)),   u = delta / s.      (5)

Its MDE is printed for comparison: it shows how much of the rule's MDE is the price of Hoeffding's
distribution-free guarantee rather than of n.

All of this is checked against seeded Monte Carlo runs of the real decision functions
(tests/stats/test_power.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any

import numpy as np
from scipy import stats as sps

from losslab.plan import Criterion, DecisionRule, hoeffding_half_width, weighted_range

DEFAULT_POWER = 0.8

DEFAULT_DISCORDANCE = 0.15
"""Assumed share of test items on which the two arms' final checkpoints disagree, when nothing was
measured. Why 0.15: tinker-cookbook #600 reports GSM8K finals of 93.3-93.7% for different losses on
the same recipe; two checkpoints at p = 0.935 whose errors were independent would disagree on
2 p (1 - p) = 0.12 of the items, and checkpoints trained from the same base share most of their
errors, so they disagree on fewer. 0.15 sits above that on purpose (the MDE grows with d), leaving
room for a weaker model than the cookbook's. `plan show` prints the any-distribution MDE beside it,
so the assumption cannot hide a larger one, and a measured discordance replaces it when given."""

METHODS = ("paired_hoeffding",)
"""Decision methods the plan schema allows (`DecisionRule.method`); each has a power model here."""


def _z(p: float) -> float:
    return NormalDist().inv_cdf(p)


def _check_unit(name: str, value: float, *, closed_high: bool = False) -> None:
    ok = 0 < value <= 1 if closed_high else 0 < value < 1
    if not ok:
        interval = "(0, 1]" if closed_high else "(0, 1)"
        raise ValueError(f"{name} must lie in {interval}, got {value}")


def decision_threshold(n: int, alpha: float, d_range: tuple[float, float], margin: float) -> float:
    """t = margin + h: the estimate must exceed it for `validated` (module docstring)."""
    return margin + hoeffding_half_width(d_range[1] - d_range[0], n, alpha)


def _larger_root(t: float, a: float, b: float, k: float) -> float | None:
    """Larger root of (1 + k) x^2 - (2 t + k b) x + (t^2 - k a) = 0 (equation (2)), or None."""
    qa, qb, qc = 1.0 + k, -(2.0 * t + k * b), t * t - k * a
    disc = qb * qb - 4.0 * qa * qc
    if disc < 0:
        return None
    return (-qb + math.sqrt(disc)) / (2.0 * qa)


def mde_normal(
    n: int,
    alpha: float,
    d_range: tuple[float, float],
    margin: float,
    *,
    discordance: float | None = None,
    seeds: int = 1,
    power: float = DEFAULT_POWER,
) -> float | None:
    """MDE of the paired-Hoeffding rule by the normal approximation (1)-(2).

    With `discordance` d: the two-arm binary model, sigma^2 = s^2 d - delta^2; None when even
    delta = s d (every discordant item a win) misses the power. Without it: the any-distribution
    bound (Bhatia-Davis). `seeds` S divides sigma^2 by S (independent seed pairs: a lower bound).
    """
    _check_unit("power", power)
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    low, high = d_range
    t = decision_threshold(n, alpha, d_range, margin)
    k = _z(power) ** 2 / (n * seeds)
    if discordance is None:
        root = _larger_root(t, -low * high, low + high, k)
        return None if root is None or root > high else root
    _check_unit("discordance", discordance, closed_high=True)
    s = (high - low) / 2.0
    root = _larger_root(t, s * s * discordance, 0.0, k)
    return None if root is None or root > s * discordance else root


def exact_power(
    effect: float,
    discordance: float,
    n: int,
    alpha: float,
    d_range: tuple[float, float],
    margin: float,
    *,
    seeds: int = 1,
) -> float:
    """P(validated) for a true effect under the discordance model, equation (3); with `seeds` S,
    n S independent trials against the same threshold (module docstring)."""
    _check_unit("discordance", discordance, closed_high=True)
    s = (d_range[1] - d_range[0]) / 2.0
    if abs(effect) > s * discordance + 1e-12:
        raise ValueError(
            f"effect {effect:g} is impossible at discordance {discordance:g}: |effect| <= "
            f"{s * discordance:g} (every discordant item a win)"
        )
    t = decision_threshold(n, alpha, d_range, margin)
    trials = n * seeds
    m = np.arange(trials + 1)
    p_win = min(max((discordance + effect / s) / (2.0 * discordance), 0.0), 1.0)
    # validated <=> s (2b - m) / trials > t <=> b > (m + trials t / s) / 2 <=> b >= floor(.) + 1
    cut = np.floor((m + trials * t / s) / 2.0)
    p_m = sps.binom.pmf(m, trials, discordance)
    return float(np.sum(p_m * sps.binom.sf(cut, m, p_win)))


def _bisect_increasing(f: Callable[[float], float], lo: float, hi: float, target: float) -> float:
    """x in [lo, hi] with f(x) = target for an increasing f (60 halvings: below 1e-15 of span)."""
    for _ in range(60):
        mid = (lo + hi) / 2.0
        if f(mid) < target:
            lo = mid
        else:
            hi = mid
    return hi


def mde_exact(
    n: int,
    alpha: float,
    d_range: tuple[float, float],
    margin: float,
    discordance: float,
    *,
    seeds: int = 1,
    power: float = DEFAULT_POWER,
) -> float | None:
    """Smallest effect whose exact power (3) reaches `power`; None when no effect possible at this
    discordance does (the discordance is too low for the rule to validate reliably)."""
    _check_unit("power", power)
    s = (d_range[1] - d_range[0]) / 2.0
    top = s * discordance

    def f(e: float) -> float:
        return exact_power(e, discordance, n, alpha, d_range, margin, seeds=seeds)

    if f(top) < power:
        return None
    return _bisect_increasing(f, -top, top, power)


def mcnemar_power(effect: float, discordance: float, n: int, alpha: float, scale: float) -> float:
    """Power of the two-sided exact McNemar test to find a positive effect, approximation (5)."""
    u = effect / scale
    spread = discordance - u * u
    if spread <= 0:
        return 1.0
    return NormalDist().cdf(
        (u * math.sqrt(n) - _z(1 - alpha / 2) * math.sqrt(discordance)) / math.sqrt(spread)
    )


def mde_mcnemar(
    n: int, alpha: float, discordance: float, scale: float, *, power: float = DEFAULT_POWER
) -> float | None:
    """MDE of exact McNemar (reported, never deciding) by (5); None if unreachable at d."""
    _check_unit("discordance", discordance, closed_high=True)
    top = scale * discordance

    def f(e: float) -> float:
        return mcnemar_power(e, discordance, n, alpha, scale)

    if f(top * (1 - 1e-12)) < power:
        return None
    return _bisect_increasing(f, 0.0, top, power)


def items_to_settle(
    effect: float,
    sd: float,
    alpha: float,
    d_range: tuple[float, float],
    margin: float,
    *,
    power: float = DEFAULT_POWER,
) -> int | None:
    """Test items the rule needs to settle a true effect of this size (per-item sd `sd`) with
    probability `power`, equation (4); None when the effect equals the margin (no n settles it)."""
    _check_unit("power", power)
    gap = abs(effect - margin)
    if gap == 0:
        return None
    span = d_range[1] - d_range[0]
    root_n = (span * math.sqrt(math.log(2.0 / alpha) / 2.0) + _z(power) * sd) / gap
    return max(1, math.ceil(root_n**2))


@dataclass(frozen=True)
class CriterionPower:
    """What one criterion of the rule can detect at the plan's n and seeds."""

    criterion: str
    method: str
    n: int
    seeds: int
    alpha: float
    power: float
    margin: float
    half_width: float
    threshold: float
    """margin + half-width: a true effect there is validated about half the time."""
    discordance: float | None
    discordance_source: str
    mde: float | None
    """Exact (3) at `discordance` for a two-arm binary criterion, else the any-distribution MDE."""
    mde_any_distribution: float | None
    mde_mcnemar: float | None
    note: str
    max_effect: float | None = None
    """The largest effect possible at `discordance` (every discordant item a treatment win)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        """The `plan show` / report lines."""
        pct = f"{self.power:.0%}"
        seeds = "" if self.seeds == 1 else f", {self.seeds} seeds"
        out = []
        if self.mde is None:
            out.append(
                f"power ({pct}, n = {self.n}{seeds}): no effect reaches {pct} power at "
                f"discordance {self.discordance:g} ({self.discordance_source}): even the largest "
                f"possible effect, {self.max_effect:.4f} (every discordant item a treatment win), "
                f"is validated less often (threshold {self.threshold:.4f})"
            )
        elif self.discordance is None:
            out.append(
                f"power ({pct}, n = {self.n}{seeds}): minimum detectable effect {self.mde:.4f} "
                "(any distribution of the per-item difference)"
            )
        else:
            out.append(
                f"power ({pct}, n = {self.n}{seeds}): minimum detectable effect {self.mde:.4f} at "
                f"discordance {self.discordance:g} ({self.discordance_source}); "
                f"{_fmt(self.mde_any_distribution)} at any discordance"
            )
        out.append(
            f"  a true effect of {self.threshold:.4f} (margin + half-width) is validated only about "
            "half the time"
        )
        if self.mde_mcnemar is not None:
            out.append(
                f"  for comparison, exact McNemar (reported, never deciding) detects "
                f"{self.mde_mcnemar:.4f} at {pct} power"
            )
        if self.note:
            out.append(f"  {self.note}")
        return out


def _fmt(x: float | None) -> str:
    return "none" if x is None else f"{x:.4f}"


def _two_arm_binary(criterion: Criterion) -> bool:
    ws = list(criterion.weights.values())
    return len(ws) == 2 and ws[0] == -ws[1] and ws[0] != 0


def criterion_power(
    criterion: Criterion,
    n: int,
    alpha: float,
    *,
    method: str = "paired_hoeffding",
    seeds: int = 1,
    discordance: float | None = None,
    power: float = DEFAULT_POWER,
) -> CriterionPower:
    """MDE of one criterion: exact (3) at `discordance` (default `DEFAULT_DISCORDANCE`, marked as
    assumed) for two arms with opposite weights, the any-distribution bound otherwise."""
    if method not in METHODS:
        raise ValueError(
            f"decision method {method!r} has no power model; expected one of {METHODS}"
        )
    d_range = weighted_range(criterion.weights, criterion.bounds)
    half = hoeffding_half_width(d_range[1] - d_range[0], n, alpha)
    any_dist = mde_normal(n, alpha, d_range, criterion.margin, seeds=seeds, power=power)
    note = ""
    if seeds > 1:
        note = (
            f"with {seeds} seeds sigma is taken as shrinking by sqrt({seeds}) (independent seed "
            "pairs; the half-width counts items, not seeds, so seeds never take the MDE below "
            f"{criterion.margin + half:.4f})"
        )
    common: dict[str, Any] = {
        "criterion": criterion.id,
        "method": method,
        "n": n,
        "seeds": seeds,
        "alpha": alpha,
        "power": power,
        "margin": criterion.margin,
        "half_width": half,
        "threshold": criterion.margin + half,
        "mde_any_distribution": any_dist,
        "note": note,
    }
    if not _two_arm_binary(criterion):
        return CriterionPower(
            **common,
            discordance=None,
            discordance_source="not applicable: not two arms with opposite weights",
            mde=any_dist,
            mde_mcnemar=None,
        )
    d = DEFAULT_DISCORDANCE if discordance is None else discordance
    scale = (d_range[1] - d_range[0]) / 2.0
    return CriterionPower(
        **common,
        discordance=d,
        discordance_source="measured" if discordance is not None else "assumed default",
        mde=mde_exact(n, alpha, d_range, criterion.margin, d, seeds=seeds, power=power),
        mde_mcnemar=mde_mcnemar(n, alpha, d, scale, power=power) if criterion.margin == 0 else None,
        max_effect=scale * d,
    )


def rule_power(
    rule: DecisionRule,
    n: int,
    *,
    discordance: float | None = None,
    power: float = DEFAULT_POWER,
) -> list[CriterionPower]:
    """`criterion_power` of every criterion of the plan's rule at the eval's n and the rule's
    seeds (at least 1)."""
    seeds = max(1, len(dict.fromkeys(rule.seeds)))
    return [
        criterion_power(
            c, n, rule.alpha, method=rule.method, seeds=seeds, discordance=discordance, power=power
        )
        for c in rule.criteria
    ]


@dataclass(frozen=True)
class ToSettle:
    """What would settle an inconclusive criterion: the test items (4) for an effect of the
    observed size; seeds cannot (module docstring)."""

    criterion: str
    estimate: float
    sd: float
    margin: float
    n: int
    power: float
    n_items: int | None
    seeds: None
    statement: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def to_settle(
    criterion: str,
    estimate: float,
    sd: float,
    n: int,
    alpha: float,
    d_range: tuple[float, float],
    margin: float,
    *,
    power: float = DEFAULT_POWER,
) -> ToSettle:
    """The n, and the statement, that would settle a true effect equal to `estimate`."""
    need = items_to_settle(estimate, sd, alpha, d_range, margin, power=power)
    pct = f"{power:.0%}"
    if need is None:
        head = (
            f"The estimate equals the margin {margin:g}: no number of items settles a true effect "
            "of exactly the margin."
        )
    else:
        word = "validate" if estimate > margin else "refute"
        head = (
            f"If the true difference were the observed {estimate:+.4f}, the rule would {word} it "
            f"with {pct} probability at n >= {need} test items (this evaluation had {n}; per-item "
            f"sd {sd:.4f})."
        )
    tail = (
        " More training seeds would not settle it: the deciding half-width "
        f"{d_range[1] - d_range[0]:g} * sqrt(ln(2/{alpha:g}) / (2n)) counts items, not seeds."
    )
    return ToSettle(criterion, estimate, sd, margin, n, power, need, None, head + tail)


def power_lines(plan: Any) -> list[str]:
    """`plan show`'s power lines: every criterion's minimum detectable effect at 80% power at
    the plan's n (`rule_power`), and the discordance assumed. `plan` is a `losslab.plan.Plan`."""
    out = []
    for result in rule_power(plan.decision_rule, plan.eval.n_examples):
        head, *rest = result.lines()
        out.append(f"{result.criterion}: {head}")
        out += list(rest)
    out.append(
        f"(assumed discordance {DEFAULT_DISCORDANCE:g} = share of items the two final "
        "checkpoints disagree on; why: losslab.stats.power.DEFAULT_DISCORDANCE)"
    )
    return out
