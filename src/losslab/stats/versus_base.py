"""Did RL help at all: each trained arm against the initial policy on the same items (reported).

Both arms start from identical weights, so one evaluation of the initial policy (the "base" row)
serves every arm. Per arm, D_i = accuracy of the arm on item i minus the base's, with the same
paired Hoeffding interval the decision rule uses (valid for any dependence between the two
columns) and the exact McNemar counts beside it. None of this decides anything: the plan's rule
compares the arms with each other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from losslab.stats.decision import PairedOutcomes
from losslab.stats.paired import hoeffding_ci, mcnemar_exact

METRIC = "accuracy"


def versus_base(
    evals: Mapping[str, Sequence[Mapping[str, Any]]],
    base: Sequence[Mapping[str, Any]],
    alpha: float,
) -> dict[str, dict[str, Any]]:
    """arm -> {estimate, ci, method, b, c, n, ...} for arm accuracy minus base accuracy per item.

    Args:
        evals: arm -> per-item evaluation records (`eval_<arm>.jsonl` rows, paired by `id`).
        base: the initial policy's records on the same items.
        alpha: two-sided level (the plan's decision_rule.alpha).
    """
    out: dict[str, dict[str, Any]] = {}
    for arm, rows in evals.items():
        outcomes = PairedOutcomes.from_records({arm: rows, "base": base})
        arm_N, base_N = outcomes.values[arm][METRIC], outcomes.values["base"][METRIC]
        interval = hoeffding_ci(arm_N - base_N, (-1.0, 1.0), alpha)
        mc = mcnemar_exact(arm_N, base_N, alpha)
        out[arm] = {
            "metric": METRIC,
            "estimate": interval.estimate,
            "ci": [interval.low, interval.high],
            "method": interval.method,
            "confidence": 1.0 - alpha,
            "n": outcomes.n,
            "arm_accuracy": float(arm_N.mean()),
            "base_accuracy": float(base_N.mean()),
            "b": mc.b,
            "c": mc.c,
            "mcnemar_p_value": mc.p_value,
            "deciding": False,
            "b_means": f"{arm} right, base wrong",
        }
    return out
