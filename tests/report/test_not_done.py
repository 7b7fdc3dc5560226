"""The report's "What was not done" entries from hand-made facts (losslab.report.not_done)."""

from __future__ import annotations

from losslab.report.html import _rederived_banner
from losslab.report.not_done import not_done

COMPLETE = {"status": {"complete": True, "phases": {}, "forced": []}}


def test_a_clean_complete_run_has_nothing_to_list() -> None:
    assert not_done(COMPLETE) == []


def test_each_kind_of_omission_is_listed() -> None:
    rederived = {
        "path": "p0",
        "side": "reference",
        "revision": "sail-sg/Stable-RL@c6af1d1:x.py::f",
        "executed": False,
        "summary": "re-derivation by losslab, pinned source NOT executed",
    }
    facts = {
        "rehearsal": {"note": "toy"},
        "status": {
            "complete": False,
            "phases": {"preflight": {"status": "done"}, "pilot": {"status": "running"}},
            "phase_order": ["preflight", "pilot", "decision"],
            "stop": {"kind": "crashed", "reason": "ValueError: boom", "phase": "pilot"},
            "forced": [],
        },
        "preflight_summary": {"provenance": [rederived, {**rederived, "executed": True}]},
        "restoration": {"applicable": False, "note": "one arm only", "checks": []},
        "gate": {
            "passed": True,
            "applicable": True,
            "checks": [
                {
                    "check": "m",
                    "passed": False,
                    "overridden": True,
                    "measured": 0.1,
                    "bound": ">= 0.5",
                }
            ],
            "failures": [],
        },  # fmt: skip
        "grader_audit": {"available": False, "reason": "math-verify is not installed"},
    }
    entries = not_done(facts)
    assert [e["what"] for e in entries] == [
        "rehearsal",
        "incomplete run",
        "phases not run",
        "re-derived reference",
        "overridden check",
        "skipped check",
        "skipped audit",
    ]
    detail = {e["what"]: e["detail"] for e in entries}
    assert detail["incomplete run"] == "crashed: ValueError: boom"
    assert detail["phases not run"] == "pilot, decision"
    assert "p0 reference (sail-sg/Stable-RL@c6af1d1:x.py::f)" in detail["re-derived reference"]
    assert "--source OWNER/NAME=PATH" in detail["re-derived reference"]
    assert detail["overridden check"] == "activation gate: m measured 0.1 vs >= 0.5 (--force)"
    assert detail["skipped check"] == "restoration preflight: one arm only"
    banner = _rederived_banner(facts["preflight_summary"])
    assert "Pinned source NOT executed" in banner and banner.count("<li>") == 1
    assert _rederived_banner({"provenance": [{**rederived, "executed": True}]}) == ""
