"""`losslab compare A B`: the paired verdict from two per-item result files.

A is the treatment (positive weight), B the baseline; items are paired by their id. Each file is
one of two formats, recognised from its rows:

- **losslab** `eval_<arm>.jsonl` (`losslab.engine.evaluate.save_eval`): one object per item with
  `id` and the graded fields (`correct`, `reward`, `format`); an optional `{"meta": ...}` line.
  The criterion's metric is read from the field `EVAL_METRICS` maps it to (accuracy <- correct).
- **lm-evaluation-harness** `--log_samples` output, `samples_<task>_<date>.jsonl`: one object per
  (document, filter) with `doc_id`, `filter`, `metrics` (the names it scored) and each metric's
  value. The item id is `doc_id`; the value is one metric (`exact_match`, `acc`, ...) under one
  filter (`strict-match`, ...). When a file holds several of either, the caller names one: a
  silent pick would change the verdict.

The verdict is `losslab.stats.decision.decide` on the paired values, so it is the same record
`losslab run` writes; two files that do not score the same items are refused, naming the first
item only one of them has. Why paired at all: lm-eval's own model comparison is an unpaired
z-test, which on the same items discards the pairing (lm-evaluation-harness #3831).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from losslab.artifacts import read_rows
from losslab.plan import EVAL_METRICS, Criterion, DecisionRule, Plan
from losslab.stats.decision import PairedOutcomes, decide
from losslab.stats.power import METHODS, criterion_power

ROLES = ("treatment", "baseline")
"""The outcome keys of A and B: the plan's criteria name these roles (or the arms they map to)."""


class ItemMismatch(ValueError):
    """The two files do not score the same items (a paired verdict needs the same items)."""


@dataclass(frozen=True)
class ItemScores:
    """One file's per-item values of the criterion metric, in file order."""

    path: str
    format: str
    """`losslab` or `lm-eval`."""
    field: str
    """The record field the values come from (`correct`, `exact_match`, ...)."""
    filter: str | None
    scores: dict[str, float]

    def describe(self) -> str:
        where = f", filter {self.filter}" if self.filter else ""
        mean = float(np.mean(list(self.scores.values()))) if self.scores else float("nan")
        return (
            f"{self.path}: {self.format} file, field {self.field}{where}, "
            f"{len(self.scores)} items, mean {mean:.4f}"
        )


def _value(path: str, item: str, key: str, value: Any) -> float:
    if isinstance(value, bool | int | float) and np.isfinite(float(value)):
        return float(value)
    raise ValueError(f"{path}: item {item!r}: {key} = {value!r} is not a number or boolean")


def _put(scores: dict[str, float], path: str, item: str, value: float) -> None:
    if item in scores:
        raise ValueError(f"{path}: item {item!r} appears twice (one row per item expected)")
    scores[item] = value


def _losslab_scores(path: str, rows: Sequence[dict[str, Any]], metric: str) -> ItemScores:
    if metric not in EVAL_METRICS:
        raise ValueError(
            f"metric {metric!r} is not a per-item evaluation metric; expected one of "
            f"{sorted(EVAL_METRICS)}"
        )
    key = EVAL_METRICS[metric]
    scores: dict[str, float] = {}
    for k, row in enumerate(rows, 1):
        if "id" not in row:
            raise ValueError(f"{path}: item row {k} has no 'id' field")
        if key not in row:
            raise ValueError(
                f"{path}: item {row['id']!r} has no {key!r} field (the criterion metric "
                f"{metric!r} is read from it)"
            )
        _put(scores, path, str(row["id"]), _value(path, str(row["id"]), key, row[key]))
    return ItemScores(path, "losslab", key, None, scores)


def _only(path: str, kind: str, found: list[str], chosen: str | None, option: str) -> str:
    if chosen is not None:
        if chosen not in found:
            raise ValueError(f"{path}: {option} {chosen!r} is not in the file; it has {found}")
        return chosen
    if len(found) != 1:
        raise ValueError(f"{path}: the file holds {kind}s {found}; name one with {option}")
    return found[0]


def _lm_eval_scores(
    path: str, rows: Sequence[dict[str, Any]], metric: str | None, filter_: str | None
) -> ItemScores:
    filters = list(dict.fromkeys(str(r.get("filter", "none")) for r in rows))
    chosen_filter = _only(path, "filter", filters, filter_, "--filter")
    kept = [r for r in rows if str(r.get("filter", "none")) == chosen_filter]
    metrics = list(dict.fromkeys(m for r in kept for m in r.get("metrics", [])))
    chosen_metric = _only(path, "metric", metrics, metric, "--lm-eval-metric")
    scores: dict[str, float] = {}
    for row in kept:
        item = str(row["doc_id"])
        if chosen_metric not in row:
            raise ValueError(f"{path}: doc_id {item} has no {chosen_metric!r} value")
        _put(scores, path, item, _value(path, item, chosen_metric, row[chosen_metric]))
    return ItemScores(path, "lm-eval", chosen_metric, chosen_filter, scores)


def read_item_scores(
    path: str | Path,
    *,
    metric: str = "accuracy",
    lm_eval_metric: str | None = None,
    lm_eval_filter: str | None = None,
) -> ItemScores:
    """Per-item values of one result file (format recognised from its rows, module docstring).

    `metric` names the criterion metric of a losslab file; `lm_eval_metric` / `lm_eval_filter`
    pick the value of an lm-eval file (needed only when it holds several).
    """
    name = str(path)
    rows = [r for r in read_rows(Path(path)) if "meta" not in r]
    if not rows:
        raise ValueError(f"{name}: no item rows")
    if all("doc_id" in r for r in rows):
        return _lm_eval_scores(name, rows, lm_eval_metric, lm_eval_filter)
    if all("id" in r for r in rows):
        return _losslab_scores(name, rows, metric)
    raise ValueError(
        f"{name}: not a losslab eval file (rows with 'id') nor lm-eval --log_samples output "
        "(rows with 'doc_id')"
    )


def _first_missing(have: dict[str, float], other: dict[str, float]) -> tuple[str, int] | None:
    only = [item for item in have if item not in other]
    return (only[0], len(only)) if only else None


def paired_outcomes(
    a: ItemScores, b: ItemScores, metric: str, keys: tuple[str, str] = ROLES
) -> PairedOutcomes:
    """A and B keyed `keys` (treatment, baseline) on the same items; `ItemMismatch` names the
    first item (in file order) only one file has."""
    for label, this, that in (("A", a, b), ("B", b, a)):
        first = _first_missing(this.scores, that.scores)
        if first is not None:
            item, count = first
            other = "B" if label == "A" else "A"
            raise ItemMismatch(
                f"the files score different items: {label} ({this.path}) has {count} "
                f"item{'s' if count != 1 else ''} that {other} ({that.path}) lacks, the first "
                f"is {item!r}; a paired verdict needs the same items in both"
            )
    ids = sorted(a.scores)  # the order PairedOutcomes.from_records (losslab run) pairs them in
    return PairedOutcomes.from_arrays(
        {
            keys[0]: {metric: [a.scores[i] for i in ids]},
            keys[1]: {metric: [b.scores[i] for i in ids]},
        },
        item_ids=ids,
    )


def command_line_rule(
    *,
    method: str = "paired_hoeffding",
    alpha: float = 0.05,
    margin: float = 0.0,
    metric: str = "accuracy",
    bounds: tuple[float, float] = (0.0, 1.0),
) -> DecisionRule:
    """One criterion, treatment minus baseline of `metric`, as a plan's decision rule."""
    if method not in METHODS:
        raise ValueError(f"--method {method!r}: expected one of {list(METHODS)}")
    if not 0 < alpha < 1:
        raise ValueError(f"--alpha {alpha}: expected a value in (0, 1)")
    if not bounds[0] < bounds[1]:
        raise ValueError(f"bounds {list(bounds)}: expected [low, high] with low < high")
    criterion = Criterion(
        id="primary",
        metric=metric,
        weights={"treatment": 1.0, "baseline": -1.0},
        margin=margin,
        bounds=list(bounds),
    )
    return DecisionRule(alpha=alpha, method=method, criteria=[criterion])  # type: ignore[arg-type]


def compare_files(
    a: str | Path,
    b: str | Path,
    rule: DecisionRule,
    *,
    plan: Plan | None = None,
    lm_eval_metric: str | None = None,
    lm_eval_filter: str | None = None,
) -> dict[str, Any]:
    """The verdict record of `rule` on A (treatment) minus B (baseline), with `inputs` (what was
    read from each file) and `power` (the rule's MDE at the discordance measured here) added."""
    metrics = list(dict.fromkeys(c.metric for c in rule.criteria))
    if len(metrics) != 1:
        raise ValueError(
            f"the rule's criteria use metrics {metrics}; two result files hold one value per item"
        )
    metric = metrics[0]
    scores = [
        read_item_scores(
            p, metric=metric, lm_eval_metric=lm_eval_metric, lm_eval_filter=lm_eval_filter
        )
        for p in (a, b)
    ]
    # with a plan, A and B are keyed by its treatment and baseline arm names, as `losslab run`
    # keys its eval files, so the record (statement included) is the one the run writes
    roles = plan.arm_roles() if plan is not None else {}
    keys = (roles.get(ROLES[0], ROLES[0]), roles.get(ROLES[1], ROLES[1]))
    outcomes = paired_outcomes(scores[0], scores[1], metric, keys)
    record = decide(rule, outcomes, plan=plan).to_dict()
    record["inputs"] = {
        role: {
            "path": s.path,
            "format": s.format,
            "field": s.field,
            "filter": s.filter,
            "items": len(s.scores),
            "mean": float(np.mean(list(s.scores.values()))),
        }
        for role, s in zip(ROLES, scores, strict=True)
    }
    record["power"] = _measured_power(rule, record)
    return record


def _measured_power(rule: DecisionRule, record: dict[str, Any]) -> dict[str, Any] | None:
    """MDE of the primary criterion at this comparison's n and measured discordance (b + c) / n,
    when McNemar applies (two binary arms)."""
    mcnemar = record["secondary"].get("mcnemar_exact", {})
    if "discordant" not in mcnemar or mcnemar["discordant"] == 0:
        return None
    n = int(record["n"])
    result = criterion_power(
        rule.criteria[0], n, rule.alpha, method=rule.method, discordance=mcnemar["discordant"] / n
    )
    return {**result.to_dict(), "lines": result.lines()}


def summary_lines(record: dict[str, Any]) -> list[str]:
    """What `losslab compare` prints: inputs, the verdict and its interval, McNemar, statement."""
    lines = [
        f"{role:<9} {i['path']}: {i['format']} file, field {i['field']}"
        + (f", filter {i['filter']}" if i["filter"] else "")
        + f", {i['items']} items, mean {i['mean']:.4f}"
        for role, i in record["inputs"].items()
    ]
    low, high = record["ci"]
    lines.append(
        f"verdict: {record['verdict']}  estimate {record['estimate']:+.4f}, "
        f"{record['confidence']:.0%} CI [{low:+.4f}, {high:+.4f}] ({record['method']}, "
        f"n = {record['n']}, margin {record['criterion']['margin']:g})"
    )
    mcnemar = record["secondary"].get("mcnemar_exact", {})
    if "p_value" in mcnemar:
        lines.append(
            f"exact McNemar (reported, never deciding): b = {mcnemar['b']}, c = {mcnemar['c']}, "
            f"p = {mcnemar['p_value']:.4g}"
        )
    lines.append(record["statement"])
    if record.get("power"):
        lines += record["power"]["lines"]
    return lines
