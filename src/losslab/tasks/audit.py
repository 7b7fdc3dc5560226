"""The generation audit of `losslab run`: is the evaluation what the verdict assumes it is?

Two checks, run on every run after the evaluation (`runner/phases/audit.py`):

- **train/test overlap**: test items whose normalised question is also a training question
  (`overlap_audit`), held to the plan's `generation_audit.max_eval_overlaps`; a plan without the
  bound records the count (passed, "no bound set").
- **one score per item**: every evaluation file (the base model's and each trained arm's) holds
  exactly one row per test item, no duplicate, missing or foreign id. The paired rule pairs rows
  by id, so a duplicate would count one item twice and a missing one would shrink n silently.

With `generation_audit.required` false (or absent) a failed check is recorded and shown in the
report but does not stop the run (`PhaseResult.required`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from losslab.checks import Check, PhaseResult
from losslab.tasks.base import Problem, overlap_audit

SHOWN_IDS = 10  # ids listed per finding; the counts are always complete


def overlap_check(
    train: Sequence[Problem], test: Sequence[Problem], max_overlaps: int | None
) -> tuple[Check, dict[str, Any]]:
    """The overlap row and the full overlap record."""
    report = overlap_audit(train, test).as_dict()
    n = report["n_overlap"]
    if max_overlaps is None:
        check = Check(
            "train/test overlap", n, "no bound (generation_audit.max_eval_overlaps unset)", True,
            note="recorded, not checked",
        )  # fmt: skip
    else:
        ids = ", ".join(report["overlap_ids"][:SHOWN_IDS])
        check = Check(
            "train/test overlap",
            n,
            f"<= {max_overlaps} (generation_audit.max_eval_overlaps)",
            n <= max_overlaps,
            note=f"test items also in training: {ids}" if n else "no test question is trained on",
        )
    return check, report


def one_score_per_item(
    name: str, rows: Sequence[Mapping[str, Any]], test_ids: Sequence[str]
) -> tuple[Check, dict[str, Any]]:
    """Whether `rows` (one evaluation file) score each test item exactly once."""
    counts = Counter(str(r.get("id")) for r in rows)
    expected = set(test_ids)
    duplicates = sorted(i for i, k in counts.items() if k > 1)
    missing = [i for i in test_ids if i not in counts]
    foreign = sorted(i for i in counts if i not in expected)
    found = {"rows": len(rows), "duplicates": duplicates, "missing": missing, "foreign": foreign}
    problems = [
        f"{len(v)} {what} (first: {', '.join(v[:SHOWN_IDS])})"
        for what, v in (("duplicated", duplicates), ("missing", missing), ("foreign", foreign))
        if v
    ]
    check = Check(
        f"one score per item: {name}",
        {"rows": len(rows), "items": len(counts), **{k: len(v) for k, v in found.items() if k != "rows"}},
        f"exactly one row for each of the {len(expected)} test items",
        not problems,
        note="; ".join(problems) or "one row per test item",
    )  # fmt: skip
    return check, found


def generation_audit(
    train: Sequence[Problem],
    test: Sequence[Problem],
    evals: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    max_eval_overlaps: int | None,
    required: bool,
) -> PhaseResult:
    """The audit's checks: the overlap, then one score per item for each of `evals` (name ->
    rows, the base model first); the artifact keeps every id the checks found."""
    check, overlap = overlap_check(train, test, max_eval_overlaps)
    checks, files = [check], {}
    test_ids = [p.id for p in test]
    for name, rows in evals.items():
        row_check, found = one_score_per_item(name, rows, test_ids)
        checks.append(row_check)
        files[name] = found
    artifact = {
        "overlap": overlap,
        "max_eval_overlaps": max_eval_overlaps,
        "evaluations": files,
        "required": required,
        "not_checked": [
            "label errors (generation_audit.max_label_errors, min_sample_size): no labelled "
            "audit sample is drawn; the second grader's disagreements are in the report"
        ],
    }
    return PhaseResult(artifact, checks=checks, required=required)
