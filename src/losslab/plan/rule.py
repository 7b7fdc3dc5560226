"""What a decision rule implies before any data: the range of the weighted per-item difference and
the paired-Hoeffding half-width at the eval's n.

These live in `plan` (not `stats`) so that `plan show` can state the rule's resolution while `plan`
imports nothing of losslab; `losslab.stats` uses the same two functions for the verdict.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


def weighted_range(weights: Mapping[str, float], bounds: Sequence[float]) -> tuple[float, float]:
    """[low, high] of D = sum_a w_a * x_a when every x_a lies in `bounds` = [lo, hi].

    Each term w * x spans |w| * (hi - lo); e.g. weights (+1, -1) and bounds [0, 1] give [-1, 1].
    """
    lo, hi = float(bounds[0]), float(bounds[1])
    low = sum(w * (lo if w > 0 else hi) for w in weights.values())
    high = sum(w * (hi if w > 0 else lo) for w in weights.values())
    return low, high


def hoeffding_half_width(range_: float, n: int, alpha: float) -> float:
    """Two-sided (1 - alpha) Hoeffding half-width for the mean of n iid values in a span `range_`.

    Hoeffding (1963): P(|mean - mu| >= t) <= 2 exp(-2 n t^2 / range^2), so
    t = range * sqrt(ln(2 / alpha) / (2 n)).
    """
    if n < 1:
        raise ValueError(f"n must be >= 1 to form a Hoeffding interval, got {n}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    return range_ * math.sqrt(math.log(2.0 / alpha) / (2.0 * n))
