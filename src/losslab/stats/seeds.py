"""Several training seeds: per-seed verdicts, the plan's rule on seed-averaged items, and a pooled
interval that accounts for seed-to-seed variation.

With seeds s = 1..S and the same N test items for every seed, the per-item paired differences form
an S x N table D_SN (D[s, i] = sum_a w_a x_a,s,i, e.g. treatment minus baseline accuracy of seed s's
checkpoints on item i). Three analyses come out of it:

- **per seed**: the plan's decision rule on row s alone, one verdict per seed pair (reported).
- **deciding**: the plan's rule, unchanged (paired Hoeffding, its alpha, bounds and margin), on
  the per-item means over seeds, Dbar_i = mean_s D[s, i]. Dbar_i lies in D's range, so Hoeffding's
  guarantee holds for the mean over *these S checkpoint pairs*; it still does not cover seeds
  that were not trained.
- **pooled (reported, not deciding)**: a two-way cluster-robust interval for the mean over new
  seeds *and* new items. Seeds and items are crossed (every seed is scored on every item), so the
  grand mean's variance has a seed part, an item part and their overlap; Cameron, Gelbach & Miller
  (2011, "Robust inference with multiway clustering") estimate it as

      V = var(seed means) / S + var(item means) / N - var(all D) / (S N)      (ddof 1 each)

  and, with few clusters, refer the t statistic to t with S - 1 degrees of freedom (the smaller
  cluster count). Why not the plain paired interval over all S*N values: it treats a seed's N
  items as independent and so ignores that a good seed lifts all of them together; with real
  seed variation it covers far less than 1 - alpha (tests/stats/test_seed_coverage.py simulates
  both). With S = 2 the t quantile is 12.7, so the pooled interval is wide: two seeds say little
  about a third, and the interval says so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy import stats as sps

from losslab.checks import PhaseResult
from losslab.plan import DecisionRule, Plan, weighted_range
from losslab.stats.decision import PairedOutcomes, Verdict, decide, verdict_line
from losslab.stats.paired import IntervalEstimate, _as_array, _check_alpha, _clip

POOLED_METHOD = "two_way_cluster_t"


def two_way_cluster_ci(d_SN: Any, alpha: float, d_range: tuple[float, float]) -> IntervalEstimate:
    """Interval for the mean of D over seeds and items, clustered two ways (seed, item).

    mean(D) +- t_{1 - alpha/2, S - 1} * sqrt(V), V as in the module docstring; a negative V (it can
    happen when the overlap term dominates) falls back to the larger one-way variance, as CGM
    advise. Needs S >= 2 seeds.
    """
    d = np.asarray(d_SN, dtype=np.float64)
    if d.ndim != 2:
        raise ValueError(f"d_SN must be a seeds x items table, got shape {d.shape}")
    _as_array(d.ravel())  # finite, non-empty
    _check_alpha(alpha)
    n_seeds, n_items = d.shape
    if n_seeds < 2:
        raise ValueError(f"a pooled interval over seeds needs >= 2 seeds, got {n_seeds}")
    mean = float(d.mean())
    v_seed = float(d.mean(axis=1).var(ddof=1)) / n_seeds
    v_item = float(d.mean(axis=0).var(ddof=1)) / n_items if n_items > 1 else 0.0
    v_both = float(d.var(ddof=1)) / d.size
    variance = v_seed + v_item - v_both
    note = ""
    if variance < 0:
        variance = max(v_seed, v_item)
        note = "two-way variance was negative; used the larger one-way variance"
    if variance == 0:
        note = "every seed x item difference is equal: no variation, the interval is a point"
    df = n_seeds - 1
    t_crit = float(sps.t.ppf(1.0 - alpha / 2.0, df=df))
    half = t_crit * math.sqrt(variance)
    return IntervalEstimate(
        POOLED_METHOD,
        mean,
        _clip(mean - half, d_range),
        _clip(mean + half, d_range),
        half,
        alpha,
        int(d.size),
        note=note,
        details={
            "seeds": n_seeds,
            "items": n_items,
            "df": df,
            "t_critical": t_crit,
            "se": math.sqrt(variance),
            "variance_seed": v_seed,
            "variance_item": v_item,
            "variance_overlap": v_both,
            "seed_means": [float(x) for x in d.mean(axis=1)],
        },
    )


def mean_over_seeds(per_seed: Sequence[PairedOutcomes]) -> PairedOutcomes:
    """Per item and arm, the mean of each metric over the seeds (the same items in every seed)."""
    if not per_seed:
        raise ValueError("no seeds given")
    ids = per_seed[0].item_ids
    for k, o in enumerate(per_seed[1:], start=1):
        if o.item_ids != ids:
            raise ValueError(
                f"seed {k} scored other items than seed 0; pooling needs the same test items"
            )
    arms = list(per_seed[0].values)
    values = {
        arm: {
            m: np.mean([o.values[arm][m] for o in per_seed], axis=0)
            for m in per_seed[0].values[arm]
            if all(m in o.values.get(arm, {}) for o in per_seed)
        }
        for arm in arms
    }
    return PairedOutcomes(ids, values)


def _difference_table(
    rule: DecisionRule, per_seed: Sequence[PairedOutcomes], roles: Mapping[str, str]
) -> tuple[np.ndarray, tuple[float, float]]:
    """D_SN of the primary criterion: D[s, i] = sum_a w_a * x_a,s,i."""
    crit = rule.criteria[0]
    rows = []
    for o in per_seed:
        d_N = np.zeros(o.n)
        for key, w in crit.weights.items():
            arm = key if key in o.values else roles.get(key, key)
            d_N = d_N + w * o.values[arm][crit.metric]
        rows.append(d_N)
    return np.vstack(rows), weighted_range(crit.weights, crit.bounds)


def decide_over_seeds(
    rule: DecisionRule,
    per_seed: Mapping[int, PairedOutcomes],
    *,
    plan: Plan | None = None,
    roles: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The verdict record for several seeds: the deciding verdict (the plan's rule on per-item means
    over seeds) with `per_seed` verdicts and the `pooled` two-way interval beside it."""
    seeds = list(per_seed)
    role_map = dict(plan.arm_roles()) if plan is not None else {}
    role_map.update(roles or {})
    outcomes = [per_seed[s] for s in seeds]
    deciding: Verdict = decide(
        rule, mean_over_seeds(outcomes), plan=plan, roles=role_map, seeds=seeds
    )
    record = deciding.to_dict()
    record["per_seed"] = []
    for s in seeds:
        v = decide(rule, per_seed[s], plan=plan, roles=role_map, seeds=[s]).to_dict()
        record["per_seed"].append(
            {
                "seed": s,
                "verdict": v["verdict"],
                "estimate": v["estimate"],
                "ci": v["ci"],
                "n": v["n"],
                "arm_means": v["arm_means"],
                "mcnemar": v["secondary"].get("mcnemar_exact"),
            }
        )
    d_SN, d_range = _difference_table(rule, outcomes, role_map)
    pooled = two_way_cluster_ci(d_SN, rule.alpha, d_range)
    record["pooled"] = {
        **pooled.to_dict(),
        "deciding": False,
        "why": "seeds and items are crossed: the two-way cluster-robust variance (Cameron, "
        "Gelbach & Miller 2011) counts seed-to-seed variation, which a paired interval over all "
        "seed x item values ignores; t with seeds - 1 degrees of freedom because there are few "
        "seeds. It covers the mean over new seeds and new items; reported, never deciding.",
    }
    record["seeds"] = seeds
    n_seeds = len(seeds)
    record["statement"] = (
        f"{n_seeds} training seeds ({', '.join(map(str, seeds))}), each a pair of arms from the same "
        f"initial weights with the same prompts and sampling seeds. The plan's rule decides on "
        f"each item's difference averaged over the {n_seeds} seed pairs; per-seed verdicts and a "
        f"pooled two-way interval over seeds and items are reported beside it. "
        + record["statement"]
    )
    return record


def decision_phase(
    rule: DecisionRule,
    evals: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    units: Mapping[str, tuple[str, int]] | None = None,
    plan: Plan | None = None,
    roles: Mapping[str, str] | None = None,
) -> PhaseResult:
    """The run's decision: each trained unit's evaluation rows -> the verdict record (the
    artifact, verdict.json), summarised by `verdict_line`; it checks nothing itself.

    Args:
        evals: evaluation rows by trained unit (eval_<unit>.jsonl).
        units: unit -> (plan arm, seed) when several seeds were trained (`decision_rule.seeds`):
            the rule then decides over seeds (`decide_over_seeds`). None: the units are the plan
            arms of one seed.
        plan, roles: as for `decide`.
    """
    if not units:
        outcomes = PairedOutcomes.from_records(evals)
        record = decide(rule, outcomes, plan=plan, roles=roles).to_dict()
    else:
        per_seed: dict[int, dict[str, Sequence[Mapping[str, Any]]]] = {}
        for unit, rows in evals.items():
            arm, seed = units[unit]
            per_seed.setdefault(seed, {})[arm] = rows
        by_seed = {s: PairedOutcomes.from_records(e) for s, e in per_seed.items()}
        record = decide_over_seeds(rule, by_seed, plan=plan, roles=roles)
    return PhaseResult(record, summary=verdict_line(record))
