"""`losslab preflight` and `losslab golden check|make` exit codes and output."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from losslab.cli import app

from .conftest import SPINDLE_PATH, RefRepo

PLAN = Path(__file__).resolve().parents[2] / "examples" / "gsm8k_dppo_vs_grpo.json"
runner = CliRunner()


def test_preflight_passes_and_writes_report(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    res = runner.invoke(app, ["preflight", str(PLAN), "--out", str(out)])
    assert res.exit_code == 2 and "--allow-rederivation" in res.output  # offline, no cache
    res = runner.invoke(app, ["preflight", str(PLAN), "--allow-rederivation", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "reference_gradient" in res.output and "preflight passed" in res.output
    assert "reference: losslab re-derivation, pinned source NOT executed" in res.output
    assert json.loads(out.read_text())["passed"] is True


def test_preflight_exits_1_on_a_failed_check(ref_repo: RefRepo, tmp_path: Path) -> None:
    plan = json.loads(PLAN.read_text())
    plan["correctness_preflight"]["paths"][0]["baseline_revision"] = (
        f"modal-projects/spindle@{ref_repo.broken}:{SPINDLE_PATH}::_loss(loss_name='ppo', clip 0.8/1.2)"
    )
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    res = runner.invoke(
        app,
        [
            "preflight",
            str(path),
            "--source",
            f"modal-projects/spindle={ref_repo.path}",
            "--allow-rederivation",
        ],
    )
    assert res.exit_code == 1, res.output
    assert "FAIL" in res.output and "pinned source executed" in res.output


def test_preflight_bad_inputs_exit_2(tmp_path: Path) -> None:
    res = runner.invoke(app, ["preflight", str(PLAN), "--source", "not-a-repo"])
    assert res.exit_code == 2 and "expected owner/repo=PATH" in res.output
    res = runner.invoke(app, ["preflight", str(tmp_path / "missing.json")])
    assert res.exit_code == 2


def test_golden_check_cli(golden_tinker_ppo_dppo: Path, tmp_path: Path) -> None:
    res = runner.invoke(app, ["golden", "check", str(golden_tinker_ppo_dppo)])
    assert res.exit_code == 0, res.output
    assert "stable_rl_dppo_binary_tv" in res.output and "golden check passed" in res.output
    data = json.loads(golden_tinker_ppo_dppo.read_text())
    data["outputs"]["mystery"] = data["outputs"]["spindle_ppo"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    res = runner.invoke(app, ["golden", "check", str(bad)])
    assert res.exit_code == 1 and "mystery" in res.output


def test_golden_make_cli(ref_repo: RefRepo, tmp_path: Path) -> None:
    out = tmp_path / "g.json"
    rev = f"modal-projects/spindle@{ref_repo.good}:{SPINDLE_PATH}::_loss(loss_name='ppo')"
    res = runner.invoke(
        app,
        [
            "golden",
            "make",
            "-r",
            rev,
            "--source",
            f"modal-projects/spindle={ref_repo.path}",
            "-o",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "pinned_source" in res.output
    assert runner.invoke(app, ["golden", "check", str(out)]).exit_code == 0
