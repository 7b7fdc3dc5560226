"""The generation audit phase, "What was not done" and the stop reason of an incomplete run,
driven by the fake components (tests/runner/_fake_components.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from losslab.report import build_report
from losslab.runner import RunInterrupted, run_plan

from ._fake_components import N_EVAL, factory, write_fake_plan


def _facts(run: Path) -> dict:
    return json.loads((run / "report.json").read_text())


def test_audit_runs_in_the_run_and_reaches_the_report(tmp_path: Path) -> None:
    plan = write_fake_plan(tmp_path / "plan.json")
    run_plan(plan, out=tmp_path / "run", quiet=True, components_factory=factory())
    run = tmp_path / "run"
    audit = json.loads((run / "generation_audit.json").read_text())
    # the fake's training questions repeat test item 0 (upper case: the same after
    # normalisation), against a bound of 1; three evaluation files of N_EVAL rows each
    assert audit["overlap"]["n_overlap"] == 1 and audit["overlap"]["overlap_ids"] == ["item0"]
    assert [c["check"] for c in audit["checks"]] == [
        "train/test overlap",
        "one score per item: base_model",
        "one score per item: base",
        "one score per item: treat",
    ]
    assert audit["passed"] and all(c["passed"] for c in audit["checks"])
    assert audit["checks"][1]["measured"]["items"] == N_EVAL
    facts = _facts(run)
    assert facts["generation_audit"]["overlap"]["n_overlap"] == 1
    html = (run / "report.html").read_text()
    assert 'id="generation-audit"' in html and "item0" in html
    # a complete run still lists what the audit does not check
    assert [e["what"] for e in facts["not_done"]] == ["skipped audit"]
    assert "label errors" in facts["not_done"][0]["detail"]
    assert 'id="not-done"' in html and "What was not done" in html
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["phase_order"][-2:] == ["audit", "decision"] and "stop" not in manifest


def test_interrupted_run_records_why_and_where(tmp_path: Path) -> None:
    plan = write_fake_plan(tmp_path / "plan.json")
    run = tmp_path / "run"
    # the 4th training step call is base step 1, inside the "arms" phase (pilot = calls 1-2)
    with pytest.raises(RunInterrupted):
        run_plan(plan, out=run, quiet=True, components_factory=factory(interrupt_at=4))
    stop = json.loads((run / "manifest.json").read_text())["stop"]
    assert stop["kind"] == "interrupted" and stop["phase"] == "arms"
    assert "--resume" in stop["reason"]
    # an interrupt writes the manifest only (a SIGTERM's grace is short); `losslab report`
    # builds the report that names the stop
    assert not (run / "report.json").exists()
    build_report(run)
    facts = _facts(run)
    assert facts["status"]["stop"] == stop
    what = {e["what"]: e["detail"] for e in facts["not_done"]}
    assert what["incomplete run"].startswith("interrupted: ")
    assert what["phases not run"] == "arms, evaluation, audit, decision"
    html = (run / "report.html").read_text()
    assert "Run incomplete: interrupted during arms." in html
    # the resumed run finishes; the old reason moves to the history
    run_plan(plan, resume=run, quiet=True, components_factory=factory())
    manifest = json.loads((run / "manifest.json").read_text())
    assert "stop" not in manifest and manifest["previous_stops"] == [stop]
    assert "incomplete run" not in {e["what"] for e in _facts(run)["not_done"]}


def test_forced_check_is_listed_as_not_done(tmp_path: Path) -> None:
    plan = write_fake_plan(tmp_path / "plan.json", gate_min=0.5)
    run_plan(plan, out=tmp_path / "run", quiet=True, force=True, components_factory=factory())
    entries = _facts(tmp_path / "run")["not_done"]
    forced = [e["detail"] for e in entries if e["what"] == "overridden check"]
    assert forced and forced[0].startswith("gate: ")


def _eval_files(run: Path) -> dict[str, str]:
    return {f.name: f.read_text() for f in sorted(run.glob("eval_*.jsonl"))}


def test_efficiency_endpoint_every_k_steps_changes_nothing_else(tmp_path: Path) -> None:
    plain = write_fake_plan(tmp_path / "plain.json")
    run_plan(plain, out=tmp_path / "plain", quiet=True, components_factory=factory())
    plan = write_fake_plan(tmp_path / "plan.json", eval_every=2)
    run = tmp_path / "run"
    run_plan(plan, out=run, quiet=True, components_factory=factory())
    # the fake's subset evaluation draws from the global RNG; the runner restores it, so the
    # final checkpoints (and so their evaluations) equal those of the run without the endpoint
    assert _eval_files(run) == _eval_files(tmp_path / "plain")
    rows = [
        json.loads(x) for x in (run / "arms" / "base" / "metrics.jsonl").read_text().splitlines()
    ]
    # 4 steps, k = 2: after steps 2 and 4 (rows 1 and 3), 8 items each
    assert [("efficiency/accuracy" in r) for r in rows] == [False, True, False, True]
    assert rows[1]["efficiency/items"] == 8
    eff = _facts(run)["efficiency"]
    assert eff["deciding"] is False and "first 8 test items" in eff["note"]
    curve = eff["units"]["base"]
    # x: 100 tokens a step, cumulated; the start is the base model on the same 8 items
    base = [json.loads(x) for x in (run / "eval_base_model.jsonl").read_text().splitlines()][:8]
    y0 = sum(r["correct"] for r in base) / 8
    y1, y2 = rows[1]["efficiency/accuracy"], rows[3]["efficiency/accuracy"]
    assert curve["points"] == [[0.0, y0], [200.0, y1], [400.0, y2]]
    area = 200 * (y0 + y1) / 2 + 200 * (y1 + y2) / 2
    assert curve["area"] == pytest.approx(area)
    assert curve["mean_accuracy"] == pytest.approx(area / 400)
    html = (run / "report.html").read_text()
    assert 'id="efficiency"' in html and 'id="plot-efficiency"' in html


def test_efficiency_rows_survive_a_resume(tmp_path: Path) -> None:
    plan = write_fake_plan(tmp_path / "plan.json", eval_every=1)
    run_plan(plan, out=tmp_path / "ref", quiet=True, components_factory=factory())
    with pytest.raises(RunInterrupted):
        run_plan(plan, out=tmp_path / "run", quiet=True, components_factory=factory(interrupt_at=4))
    run_plan(plan, resume=tmp_path / "run", quiet=True, components_factory=factory())

    def accuracies(run: Path) -> list:
        text = (run / "arms" / "base" / "metrics.jsonl").read_text()
        return [json.loads(x)["efficiency/accuracy"] for x in text.splitlines()]

    assert accuracies(tmp_path / "run") == accuracies(tmp_path / "ref")
    assert len(accuracies(tmp_path / "ref")) == 4
