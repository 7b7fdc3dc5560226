"""The errands of docs/contributing.md done for real: a phase, a task and a backend, each one
module (tests/runner/_errand_*.py) plus one line in its table, and `losslab run` runs them.

The one line is added with monkeypatch, so the tables are restored after each test; the line
is exactly what the errand adds to `losslab.runner.phases.PHASES`, `losslab.tasks.registry.TASKS`
and `losslab.backends.BACKENDS`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from losslab.backends import BACKENDS
from losslab.cli import app
from losslab.runner import CheckFailed, run_plan
from losslab.runner import phases as phase_table
from losslab.runner.protocols import Phase, check_table
from losslab.tasks.registry import TASKS, TaskDeclaration

from . import _errand_backend, _errand_phase
from ._fake_components import factory, write_fake_plan
from ._tiny_plan import make_eos_biased_tiny_model, write_tiny_plan


@pytest.fixture
def errand_phase(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = list(phase_table.PHASES)
    after_pilot = [p.name for p in rows].index("pilot") + 1
    line = Phase("errand", _errand_phase.run, needs=("pilot",), artifact="errand.json")
    rows.insert(after_pilot, line)  # the errand's one line in the table
    monkeypatch.setattr(phase_table, "PHASES", check_table(rows))


def _log(run: Path) -> list[str]:
    return [line.split(" ", 1)[1] for line in (run / "run.log").read_text().splitlines()]


def test_an_added_phase_runs_in_its_place_and_resumes(errand_phase: None, tmp_path: Path) -> None:
    plan = write_fake_plan(tmp_path / "plan.json")
    run = tmp_path / "run"
    run_plan(plan, out=run, quiet=True, components_factory=factory())
    record = json.loads((run / "errand.json").read_text())
    assert record["passed"] is True and record["steps"] == 2  # the fake plan's pilot_steps
    (row,) = record["checks"]
    assert row["check"] == "pilot |reward/mean| max" and row["measured"] == max(
        abs(x) for x in record["rewards"]
    )
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["phases"]["errand"]["status"] == "done"
    assert manifest["phases"]["errand"]["artifact"] == "errand.json"
    log = _log(run)
    order = [log.index(f"[{name}] start") for name in ("pilot", "errand", "feasibility")]
    assert order == sorted(order)  # it ran where its line stands
    run_plan(plan, resume=run, quiet=True, components_factory=factory())
    assert "[errand] already done (resume)" in _log(run)


def test_an_added_phase_stops_the_run_on_its_failed_check(
    errand_phase: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_errand_phase, "MAX_ABS_REWARD", 0.0)  # every |reward| exceeds it
    plan = write_fake_plan(tmp_path / "plan.json")
    with pytest.raises(CheckFailed, match=r"errand failed: check 'pilot \|reward/mean\| max'"):
        run_plan(plan, out=tmp_path / "run", quiet=True, components_factory=factory())
    assert not (tmp_path / "run" / "arms" / "base").exists()  # the arms never started
    assert "errand.json" in (tmp_path / "run" / "manifest.json").read_text()
    forced = tmp_path / "forced"
    run_plan(plan, out=forced, quiet=True, force=True, components_factory=factory())
    (row,) = json.loads((forced / "errand.json").read_text())["failures"]
    assert row["overridden"] is True and row["passed"] is False
    facts = json.loads((forced / "report.json").read_text())
    assert facts["status"]["forced"][0]["phase"] == "errand"


def test_an_added_task_and_backend_run_end_to_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the errands' one line each:
    monkeypatch.setitem(TASKS, "parity", TaskDeclaration("runner._errand_task:ParityTask"))
    monkeypatch.setitem(BACKENDS, "errand", ("runner._errand_backend", "a test backend"))
    monkeypatch.setattr(_errand_backend.BACKEND, "service_clients", 0)
    model = make_eos_biased_tiny_model(tmp_path / "model")
    plan_file = write_tiny_plan(tmp_path / "plan.json", model)
    plan = json.loads(plan_file.read_text())
    plan["dataset"] = {"name": "parity"}
    plan["engine"]["task"] = "parity"
    plan_file.write_text(json.dumps(plan, indent=1))
    out = tmp_path / "run"
    result = CliRunner().invoke(
        app, ["run", str(plan_file), "--backend", "errand", "--out", str(out), "--quiet"]
    )
    assert result.exit_code == 0, result.output[-3000:]
    verdict = json.loads((out / "verdict.json").read_text())
    assert f"verdict: {verdict['verdict']}" in result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["backend"] == "errand" and manifest["environment"]["task"] == "parity"
    assert _errand_backend.BACKEND.service_clients == 1  # the run's one service, from this module
    for arm in ("grpo_seed0", "dppo_seed0", "base_model"):
        rows = [json.loads(x) for x in (out / f"eval_{arm}.jsonl").read_text().splitlines()]
        assert [r["id"] for r in rows] == [f"parity-test-{i}" for i in range(4)]
