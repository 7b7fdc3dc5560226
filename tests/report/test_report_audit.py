"""The report's power and second-grader sections on a hand-made run directory (no runner).

The run directory holds what `losslab run` leaves for the report: manifest.json, plan.json,
eval_<arm>.jsonl (save_eval) and verdict.json (stats.decision on those eval files).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from losslab.engine.evaluate import EvalItem, save_eval
from losslab.plan import load_plan
from losslab.report import build_report
from losslab.stats.decision import PairedOutcomes, decide
from losslab.stats.power import rule_power

SEED_PLAN = Path(__file__).resolve().parents[2] / "examples" / "gsm8k_dppo_vs_grpo.json"


def _item(i: int, text: str, correct: bool) -> EvalItem:
    prediction = text.split("{")[-1].rstrip("}") if "\\boxed{" in text else None
    return EvalItem(
        f"gsm8k-test-{i}", "72", prediction, correct, prediction is not None, 0.0, text, 9
    )


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("audit") / "run"
    root.mkdir()
    plan_data = json.loads(SEED_PLAN.read_text())
    (root / "plan.json").write_text(json.dumps(plan_data))
    manifest = {
        "phases": {"decision": {"status": "done", "seconds": 1.0}},
        "schedule": {"arms": ["grpo_seed0", "dppo_seed0"], "treatment": "dppo_seed0"},
    }
    (root / "manifest.json").write_text(json.dumps(manifest))
    # treatment: right on items 0-5 (boxes), "#### 72" on item 6 (graded wrong: no box), wrong on 7
    treatment = [_item(i, "so \\boxed{72}", True) for i in range(6)]
    treatment += [_item(6, "#### 72", False), _item(7, "\\boxed{71}", False)]
    # baseline: right on 0-1, wrong on 2-7
    baseline = [_item(i, "so \\boxed{72}", True) for i in range(2)]
    baseline += [_item(i, "\\boxed{70}", False) for i in range(2, 8)]
    save_eval(root / "eval_dppo_seed0.jsonl", treatment)
    save_eval(root / "eval_grpo_seed0.jsonl", baseline)
    rows = {
        arm: [json.loads(x) for x in (root / f"eval_{arm}.jsonl").read_text().splitlines()]
        for arm in ("dppo_seed0", "grpo_seed0")
    }
    plan = load_plan(SEED_PLAN)
    verdict = decide(plan.decision_rule, PairedOutcomes.from_records(rows), plan=plan).to_dict()
    (root / "verdict.json").write_text(json.dumps(verdict))
    build_report(root)
    return root


def test_power_section_at_assumed_and_measured_discordance(run_dir: Path) -> None:
    facts = json.loads((run_dir / "report.json").read_text())
    plan = load_plan(SEED_PLAN)
    (assumed,) = rule_power(plan.decision_rule, 1319)
    assert facts["power"]["assumed"][0]["mde"] == pytest.approx(assumed.mde)
    # discordant items: 2-5 (treatment right, baseline wrong): 4 of 8
    (measured,) = facts["power"]["measured"]
    assert measured["discordance"] == 4 / 8 and measured["n"] == 8
    html = (run_dir / "report.html").read_text()
    assert '<section id="power">' in html and f"{assumed.mde:.4f}" in html


def test_grader_audit_section_lists_math_verify_disagreements(run_dir: Path) -> None:
    facts = json.loads((run_dir / "report.json").read_text())
    audit = facts["grader_audit"]
    assert audit["available"] and audit["grader"] == "math-verify 0.9.0"
    # only item 6: the cookbook grader needs a box, math-verify reads the bare "#### 72"
    found = audit["units"]["dppo_seed0"]["disagreements"]
    assert [d["id"] for d in found] == ["gsm8k-test-6"]
    assert audit["units"]["grpo_seed0"] == {"items": 8, "disagreements": []}
    html = (run_dir / "report.html").read_text()
    assert "dppo_seed0: 1 of 8 items disagree" in html and "gsm8k-test-6" in html
