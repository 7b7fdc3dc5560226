"""`losslab.checks`: the one check-row shape and phase result every phase returns."""

from __future__ import annotations

import pytest

from losslab.checks import Check, PhaseResult, checks_summary
from losslab.runner.protocols import Phase, check_table

OK = Check("loss.max_abs_error", 0.0, "<= 1e-05", passed=True)
BAD = Check("projected wall minutes", 20.0, "<= 15", passed=False, note="over budget")


def test_row_round_trip_keeps_the_artifact_key_check() -> None:
    row = BAD.to_dict()
    assert row == {
        "check": "projected wall minutes",
        "measured": 20.0,
        "bound": "<= 15",
        "passed": False,
        "note": "over budget",
        "overridden": False,
    }
    assert Check.from_dict(row) == BAD
    # a row written before `note` and `overridden` existed reads as empty / not overridden
    old = {"check": "x", "measured": 1, "bound": "<= 2", "passed": True}
    assert Check.from_dict(old) == Check("x", 1, "<= 2", True)


def test_passed_failures_and_the_record() -> None:
    result = PhaseResult({"wall_seconds": 1200.0}, checks=[OK, BAD])
    assert not result.passed and result.failures == (BAD,) and result.first_failure == BAD
    assert result.summary == "1/2 checks passed; failed: projected wall minutes"
    record = result.record()
    assert record["wall_seconds"] == 1200.0 and record["passed"] is False
    assert record["applicable"] is True
    assert record["checks"] == [OK.to_dict(), BAD.to_dict()]
    assert record["failures"] == [BAD.to_dict()]


def test_a_phase_not_required_records_failures_without_failing() -> None:
    result = PhaseResult({}, checks=[BAD], required=False)
    assert result.passed and result.first_failure is None
    assert result.record()["failures"] == [BAD.to_dict()]


def test_overridden_marks_only_the_failed_rows() -> None:
    forced = PhaseResult({}, checks=[OK, BAD]).overridden()
    assert [c.overridden for c in forced.checks] == [False, True]
    assert not forced.passed  # --force continues past a failure; it does not make it pass
    assert forced.record()["failures"][0]["overridden"] is True


def test_not_applicable_and_a_phase_that_checks_nothing() -> None:
    skipped = PhaseResult.not_applicable("the plan has no correctness_preflight paths")
    assert skipped.passed and not skipped.applicable and skipped.checks == ()
    assert skipped.record() == {
        "note": "the plan has no correctness_preflight paths",
        "passed": True,
        "applicable": False,
        "checks": [],
        "failures": [],
    }
    verdict = PhaseResult({"verdict": "refuted"}, summary="verdict: refuted")
    assert verdict.passed and verdict.record() == {"verdict": "refuted"}  # written as it is
    assert verdict.with_facts(evidence=False).record() == {"verdict": "refuted", "evidence": False}


def test_checks_summary_counts() -> None:
    assert checks_summary([OK, OK]) == "2/2 checks passed"
    assert checks_summary([]) == "0/0 checks passed"


def test_the_phase_table_refuses_a_need_that_does_not_stand_before() -> None:
    def run(ctx):
        return PhaseResult({})

    a, b = Phase("pilot", run), Phase("gate", run, needs=("pilot",))
    assert check_table([a, b]) == (a, b)
    with pytest.raises(ValueError, match=r"'gate' needs \['pilot'\], which must stand before it"):
        check_table([b, a])
    with pytest.raises(ValueError, match="'pilot' appears twice"):
        check_table([a, a])
