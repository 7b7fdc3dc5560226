"""`losslab run --source`: the checkout reaches the correctness preflight, and a pinned source
that was not executed is said on the console (and in the report: tests/report/test_not_done.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from typer.testing import CliRunner

from losslab.cli import app
from losslab.conformance import preflight as conformance_preflight
from losslab.plan import load_plan
from losslab.runner.phases import preflight as preflight_phase_module

SEED_PLAN = Path(__file__).resolve().parents[2] / "examples" / "gsm8k_dppo_vs_grpo.json"

REDERIVED_REPORT = {
    "paths": [
        {
            "id": "grpo_dppo_custom_loss",
            "baseline_revision": "modal-projects/spindle@e58ebef:f.py::_loss",
            "reference_revision": "sail-sg/Stable-RL@c6af1d1:core_algos.py::f",
            "reference_sources": {
                "baseline": {"kind": "pinned_source", "commit": "e58ebef", "file_sha256": "ab"},
                "reference": {"kind": "rederivation", "fallback_reason": "offline, not cached"},
            },
        }
    ]
}


def test_cli_passes_each_source_to_the_run(tmp_path: Path, monkeypatch) -> None:
    seen: dict[str, Any] = {}

    def fake_run_plan(plan: Path, **kwargs: Any) -> None:
        seen.update(kwargs)

    monkeypatch.setattr("losslab.runner.run_plan", fake_run_plan)
    checkout = tmp_path / "Stable-RL"
    checkout.mkdir()
    args = ["run", str(SEED_PLAN), "--source", f"sail-sg/Stable-RL={checkout}"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert seen["sources"] == {"sail-sg/Stable-RL": checkout}


def test_cli_refuses_a_malformed_source(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["run", str(SEED_PLAN), "--source", "Stable-RL"])
    assert result.exit_code == 2
    assert "--source 'Stable-RL': expected owner/repo=PATH" in result.output
    missing = tmp_path / "absent"
    result = CliRunner().invoke(app, ["run", str(SEED_PLAN), "--source", f"a/b={missing}"])
    assert result.exit_code == 2 and f"{missing} does not exist" in result.output


def test_phase_executes_from_the_checkout_and_says_what_was_not_executed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: dict[str, Any] = {}

    def fake_run_preflight(plan: Any, **kwargs: Any) -> dict:
        calls.update(kwargs)
        return REDERIVED_REPORT

    monkeypatch.setattr(conformance_preflight, "run_preflight", fake_run_preflight)
    monkeypatch.setattr(conformance_preflight, "preflight_checks", lambda report: [])
    logged: list[str] = []
    comp = SimpleNamespace(plan=load_plan(SEED_PLAN), losses={}, sources={"a/b": tmp_path})
    ctx = SimpleNamespace(comp=comp, log=logged.append)
    result = preflight_phase_module.run(ctx)
    assert calls["sources"] == {"a/b": tmp_path} and result.passed
    # the baseline side ran its pinned source: only the re-derived reference side is logged
    assert len(logged) == 1
    assert logged[0].startswith(
        "WARNING pinned source NOT executed: grpo_dppo_custom_loss reference "
        "(sail-sg/Stable-RL@c6af1d1:core_algos.py::f): re-derivation by losslab"
    )
    assert "offline, not cached" in logged[0] and "--source sail-sg/Stable-RL=PATH" in logged[0]
