"""A plan whose loss needs recomputed old log-probs is refused at `plan check`, with its path."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from losslab.cli import app
from losslab.plan.validate import check_plan_data

PLAN = Path(__file__).resolve().parents[2] / "examples" / "gsm8k_dppo_vs_grpo.json"


def _recompute_plan() -> dict:
    data = json.loads(PLAN.read_text())
    path = data["correctness_preflight"]["paths"][0]
    path["reference_revision"] = path["reference_revision"].replace(
        "'dppo_binary_tv'", "'dppo_binary_tv_recompute'"
    )
    return data


def test_recompute_reference_is_refused_with_its_json_path() -> None:
    check = check_plan_data(_recompute_plan())
    assert not check.ok
    paths = [p.path for p in check.errors]
    assert "correctness_preflight.paths[0].reference_revision" in paths


def test_plan_check_cli_names_the_field(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(_recompute_plan()))
    res = CliRunner().invoke(app, ["plan", "check", str(plan)])
    assert res.exit_code == 1
    assert "correctness_preflight.paths[0].reference_revision" in res.output
    assert "never computes old" in res.output


def test_the_users_plan_is_not_refused() -> None:
    assert check_plan_data(json.loads(PLAN.read_text())).ok
