"""The generation audit's checks on hand-made items (losslab.tasks.audit)."""

from __future__ import annotations

from losslab.tasks.audit import generation_audit, one_score_per_item, overlap_check
from losslab.tasks.base import Problem

TEST = [Problem(f"t{i}", f"Question number {i}?", str(i)) for i in range(4)]
TRAIN = [Problem("a", "question NUMBER 1", "1"), Problem("b", "question number 3!", "3")]


def _rows(*ids: str) -> list[dict]:
    return [{"id": i, "correct": True} for i in ids]


def test_overlap_is_held_to_the_plans_bound() -> None:
    # t1 and t3 match training questions after normalisation (case, punctuation)
    check, record = overlap_check(TRAIN, TEST, max_overlaps=0)
    assert (check.measured, check.passed) == (2, False)
    assert record["overlap_ids"] == ["t1", "t3"] and record["overlap_fraction"] == 0.5
    assert "t1, t3" in check.note
    assert overlap_check(TRAIN, TEST, max_overlaps=2)[0].passed
    unbounded, _ = overlap_check(TRAIN, TEST, max_overlaps=None)
    assert unbounded.passed and unbounded.note == "recorded, not checked"


def test_one_score_per_item_names_duplicates_missing_and_foreign() -> None:
    ids = [p.id for p in TEST]
    ok, _ = one_score_per_item("arm", _rows("t0", "t1", "t2", "t3"), ids)
    assert ok.passed and ok.measured == {
        "rows": 4, "items": 4, "duplicates": 0, "missing": 0, "foreign": 0,
    }  # fmt: skip
    bad, found = one_score_per_item("arm", _rows("t0", "t0", "t1", "x9"), ids)
    assert not bad.passed
    assert found == {"rows": 4, "duplicates": ["t0"], "missing": ["t2", "t3"], "foreign": ["x9"]}
    assert bad.note == "1 duplicated (first: t0); 2 missing (first: t2, t3); 1 foreign (first: x9)"


def test_required_decides_whether_a_failure_stops() -> None:
    evals = {"base_model": _rows("t0", "t1", "t2", "t3"), "arm": _rows("t0", "t1", "t2")}
    recorded = generation_audit(TRAIN, TEST, evals, max_eval_overlaps=0, required=False)
    # two failures (overlap 2 > 0, arm misses t3), recorded without stopping
    assert recorded.passed and [c.name for c in recorded.failures] == [
        "train/test overlap",
        "one score per item: arm",
    ]
    enforced = generation_audit(TRAIN, TEST, evals, max_eval_overlaps=0, required=True)
    assert not enforced.passed and enforced.first_failure.name == "train/test overlap"
    assert enforced.record()["evaluations"]["arm"]["missing"] == ["t3"]


def test_a_required_audit_is_accepted_and_its_unchecked_bounds_warned(tmp_path) -> None:
    import json
    from pathlib import Path

    from losslab.plan import check_plan_file

    seed = Path(__file__).resolve().parents[2] / "examples" / "gsm8k_dppo_vs_grpo.json"
    plan = json.loads(seed.read_text())
    plan["generation_audit"] = {"required": True, "max_eval_overlaps": 0, "max_label_errors": 0}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    result = check_plan_file(path)
    assert result.ok, result.errors
    texts = [str(w) for w in result.warnings]
    assert any("generation_audit.max_label_errors" in w and "not checked" in w for w in texts)
