"""Confidence intervals for the mean of paired per-item differences D_i = sum_a w_a x_a,i.

One function per interval, each reading like its formula:

- `hoeffding_ci`: the plan's deciding interval, distribution-free for values in a known range.
- `empirical_bernstein_ci`: also distribution-free, tighter when most D_i are 0 (Maurer & Pontil
  2009, Thm 4).
- `paired_t_ci`: the usual paired-t interval (asymptotic, not guaranteed for binary data).
- `mcnemar_exact`: exact McNemar on the discordant pairs of two binary arms (Clopper-Pearson on
  b / (b + c), binomial p-value).

Every interval is clipped to the range D can take, which never lowers its coverage.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from scipy import stats as sps

from losslab.plan.rule import hoeffding_half_width


@dataclass(frozen=True)
class IntervalEstimate:
    """A two-sided (1 - alpha) interval for the mean of D, and how it was formed."""

    method: str
    estimate: float
    low: float
    high: float
    half_width: float | None
    """Unclipped half-width of a symmetric interval (None for asymmetric ones)."""
    alpha: float
    n: int
    note: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ci(self) -> tuple[float, float]:
        return (self.low, self.high)

    def covers(self, value: float) -> bool:
        return self.low <= value <= self.high

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["ci"] = [self.low, self.high]
        return out


def _as_array(d_N: Any, name: str = "d_N") -> np.ndarray:
    arr = np.asarray(d_N, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D sequence of per-item values, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} is empty; a paired interval needs at least one item")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} holds non-finite values (NaN or inf)")
    return arr


def _check_alpha(alpha: float) -> None:
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")


def _check_in_range(d_N: np.ndarray, d_range: tuple[float, float]) -> None:
    low, high = d_range
    if not low < high:
        raise ValueError(f"d_range must be [low, high] with low < high, got {list(d_range)}")
    tol = 1e-9 * max(1.0, high - low)
    if d_N.min() < low - tol or d_N.max() > high + tol:
        raise ValueError(
            f"values lie in [{d_N.min():g}, {d_N.max():g}], outside the declared range "
            f"[{low:g}, {high:g}]; the interval's guarantee needs every value inside it"
        )


def _clip(x: float, d_range: tuple[float, float]) -> float:
    return float(min(max(x, d_range[0]), d_range[1]))


def hoeffding_ci(d_N: Any, d_range: tuple[float, float], alpha: float) -> IntervalEstimate:
    """Two-sided Hoeffding interval: mean(D) +- (high - low) * sqrt(ln(2/alpha) / (2n)).

    Valid for any distribution of iid D_i in [low, high] (Hoeffding 1963); it ignores the variance,
    so with mostly concordant pairs it is far wider than the other intervals.
    """
    d = _as_array(d_N)
    _check_alpha(alpha)
    _check_in_range(d, d_range)
    n, mean = d.size, float(d.mean())
    half = hoeffding_half_width(d_range[1] - d_range[0], n, alpha)
    return IntervalEstimate(
        "paired_hoeffding",
        mean,
        _clip(mean - half, d_range),
        _clip(mean + half, d_range),
        half,
        alpha,
        n,
    )


def empirical_bernstein_ci(
    d_N: Any, d_range: tuple[float, float], alpha: float
) -> IntervalEstimate:
    """Two-sided empirical-Bernstein interval (Maurer & Pontil 2009, Theorem 4), alpha/2 per side.

    On Z = (D - low) / (high - low) in [0, 1] with sample variance V (ddof 1):
    half_Z = sqrt(2 V ln(4/alpha) / n) + 7 ln(4/alpha) / (3 (n - 1)); D's half-width is
    (high - low) * half_Z. Needs n >= 2; with n = 1 it is the whole range.
    """
    d = _as_array(d_N)
    _check_alpha(alpha)
    _check_in_range(d, d_range)
    n, mean = d.size, float(d.mean())
    span = d_range[1] - d_range[0]
    if n < 2:
        return IntervalEstimate(
            "empirical_bernstein",
            mean,
            d_range[0],
            d_range[1],
            None,
            alpha,
            n,
            note="n < 2: no sample variance, the interval is the whole range",
        )
    z = (d - d_range[0]) / span
    var_z = float(z.var(ddof=1))
    log_term = math.log(4.0 / alpha)
    half = span * (math.sqrt(2.0 * var_z * log_term / n) + 7.0 * log_term / (3.0 * (n - 1)))
    return IntervalEstimate(
        "empirical_bernstein",
        mean,
        _clip(mean - half, d_range),
        _clip(mean + half, d_range),
        half,
        alpha,
        n,
        details={"sample_variance": var_z * span**2},
    )


def paired_t_ci(
    d_N: Any, alpha: float, d_range: tuple[float, float] | None = None
) -> IntervalEstimate:
    """Paired-t interval: mean(D) +- t_{1-alpha/2, n-1} * s_D / sqrt(n).

    Asymptotic: with binary outcomes and few discordant pairs it can cover less than 1 - alpha,
    and when every D_i is equal (s_D = 0) it collapses to a point. Reported, never deciding.
    """
    d = _as_array(d_N)
    _check_alpha(alpha)
    n, mean = d.size, float(d.mean())
    if n < 2:
        low, high = d_range if d_range is not None else (-math.inf, math.inf)
        return IntervalEstimate(
            "paired_t",
            mean,
            low,
            high,
            None,
            alpha,
            n,
            note="n < 2: no sample standard deviation, no t interval",
        )
    sd = float(d.std(ddof=1))
    t_crit = float(sps.t.ppf(1.0 - alpha / 2.0, df=n - 1))
    half = t_crit * sd / math.sqrt(n)
    low, high = mean - half, mean + half
    if d_range is not None:
        low, high = _clip(low, d_range), _clip(high, d_range)
    note = "all differences equal (sd = 0): the t interval is a point" if sd == 0 else ""
    return IntervalEstimate(
        "paired_t",
        mean,
        low,
        high,
        half,
        alpha,
        n,
        note=note,
        details={"sd": sd, "df": n - 1, "t_critical": t_crit},
    )


@dataclass(frozen=True)
class McNemarResult:
    """Exact McNemar on two binary arms: b = #(positive arm right, other wrong), c = the reverse.

    `pi_ci` is the Clopper-Pearson interval for pi = P(positive arm wins | discordant pair), exact at
    level 1 - alpha. `interval` maps it to the difference, scale * (m/n) * (2 pi - 1), conditional
    on the observed number of discordant pairs m = b + c (the textbook form; it treats m/n as known,
    so its coverage of the difference is not guaranteed when discordance is rare).
    `unconditional_ci` also bounds the discordance rate d = P(discordant): Clopper-Pearson at alpha/2
    for d and for pi (Bonferroni), then the range of scale * d * (2 pi - 1) over that box, which
    covers the difference with probability >= 1 - alpha.
    """

    b: int
    c: int
    n: int
    p_value: float
    pi_ci: tuple[float, float]
    interval: IntervalEstimate
    unconditional_ci: tuple[float, float]

    def to_dict(self) -> dict[str, Any]:
        out = self.interval.to_dict()
        out.update(
            b=self.b,
            c=self.c,
            discordant=self.b + self.c,
            p_value=self.p_value,
            pi_ci=list(self.pi_ci),
            unconditional_ci=list(self.unconditional_ci),
        )
        return out


def clopper_pearson(k: int, m: int, alpha: float) -> tuple[float, float]:
    """Exact two-sided (1 - alpha) binomial interval for k successes in m trials (beta quantiles)."""
    if m == 0:
        return (0.0, 1.0)
    low = 0.0 if k == 0 else float(sps.beta.ppf(alpha / 2.0, k, m - k + 1))
    high = 1.0 if k == m else float(sps.beta.ppf(1.0 - alpha / 2.0, k + 1, m - k))
    return (low, high)


def mcnemar_exact(
    positive_N: Any, negative_N: Any, alpha: float, scale: float = 1.0
) -> McNemarResult:
    """Exact McNemar test and interval for binary paired outcomes.

    Args:
        positive_N: 0/1 outcomes of the arm with the positive weight (e.g. treatment).
        negative_N: 0/1 outcomes of the arm with the negative weight (e.g. baseline), same items.
        alpha: two-sided level.
        scale: value of one discordant win in the difference's units (|w| * (high - low)).

    Returns:
        b, c, the exact binomial p-value of b ~ Bin(b + c, 1/2), and the difference's interval
        scale * (m / n) * (2 pi_L - 1, 2 pi_U - 1), with [pi_L, pi_U] Clopper-Pearson for b / m.
    """
    pos, neg = _as_array(positive_N, "positive_N"), _as_array(negative_N, "negative_N")
    _check_alpha(alpha)
    if pos.shape != neg.shape:
        raise ValueError(f"arms are not paired: {pos.size} vs {neg.size} items")
    for name, arr in (("positive_N", pos), ("negative_N", neg)):
        if not np.all((arr == 0) | (arr == 1)):
            raise ValueError(f"{name} must hold 0/1 outcomes for McNemar")
    n = pos.size
    b = int(np.sum((pos == 1) & (neg == 0)))
    c = int(np.sum((pos == 0) & (neg == 1)))
    m = b + c
    estimate = scale * (b - c) / n
    unconditional = _unconditional_difference_ci(b, m, n, alpha, scale)
    if m == 0:
        interval = IntervalEstimate(
            "mcnemar_exact",
            estimate,
            0.0,
            0.0,
            None,
            alpha,
            n,
            note="no discordant pairs: the arms agree on every item",
        )
        return McNemarResult(b, c, n, 1.0, (0.0, 1.0), interval, unconditional)
    pi_low, pi_high = clopper_pearson(b, m, alpha)
    p_value = float(sps.binomtest(b, m, 0.5, alternative="two-sided").pvalue)
    frac = m / n
    interval = IntervalEstimate(
        "mcnemar_exact",
        estimate,
        scale * frac * (2 * pi_low - 1),
        scale * frac * (2 * pi_high - 1),
        None,
        alpha,
        n,
        note="conditional on the observed number of discordant pairs",
    )
    return McNemarResult(b, c, n, p_value, (pi_low, pi_high), interval, unconditional)


def _unconditional_difference_ci(
    b: int, m: int, n: int, alpha: float, scale: float
) -> tuple[float, float]:
    """Range of scale * d * (2 pi - 1) over Clopper-Pearson boxes for d (m of n) and pi (b of m),
    each at alpha/2, so both hold together with probability >= 1 - alpha (Bonferroni)."""
    d_low, d_high = clopper_pearson(m, n, alpha / 2.0)
    pi_low, pi_high = clopper_pearson(b, m, alpha / 2.0)
    lows = [d * (2 * pi_low - 1) for d in (d_low, d_high)]
    highs = [d * (2 * pi_high - 1) for d in (d_low, d_high)]
    return (scale * min(lows), scale * max(highs))
