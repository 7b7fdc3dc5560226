"""`losslab plan check` / `plan show` on the seed plan."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from losslab.cli import app
from losslab.plan import load_plan, plan_summary

from ._plans import SEED_PLAN


def test_cli_check_passes_on_seed_plan() -> None:
    result = CliRunner().invoke(app, ["plan", "check", str(SEED_PLAN)])
    assert result.exit_code == 0, result.output
    assert "ok (0 warnings)" in result.output


def test_summary_states_switch_sources_and_half_width() -> None:
    text = plan_summary(load_plan(SEED_PLAN))
    assert "Arms (switch: loss)" in text
    assert 'dppo_binary_tv(low=0.15, high=0.15, anchor="sampler", clip_ratio_c=10)' in text
    assert "[correctness_preflight reference_revision]" in text
    # half-width = range * sqrt(ln(2/alpha) / (2n)) = 2 * sqrt(ln(40) / 2638) = 0.07479
    assert "Hoeffding half-width 0.07479 at n = 1319" in text
    assert "group_size         8                            default" in text
    assert "eps                1e-08                        restoration_preflight" in text
    assert "dppo_masked_token_fraction     [0.001, 0.3]" in text
    assert "executed_base_model            one of ['Qwen/Qwen3.5-2B']" in text
    assert "gpu_hours 2.0, max_wall_minutes 120.0" in text


def test_cli_show_marks_plan_values(tmp_path: Path, seed_plan: dict[str, Any]) -> None:
    seed_plan["engine"] = {"temperature": 0.7}
    seed_plan["method"] = seed_plan["method"].replace("temperature 1.0", "temperature 0.7")
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(seed_plan), encoding="utf-8")
    result = CliRunner().invoke(app, ["plan", "show", str(plan_file)])
    assert result.exit_code == 0, result.output
    assert "temperature        0.7                          plan" in result.output


def test_cli_show_refuses_a_bad_plan(tmp_path: Path, seed_plan: dict[str, Any]) -> None:
    seed_plan["decision_rule"]["alpha"] = 2
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(seed_plan), encoding="utf-8")
    result = CliRunner().invoke(app, ["plan", "show", str(plan_file)])
    assert result.exit_code == 1
    assert "error: decision_rule.alpha: 2 is outside (0, 1)" in result.output
    assert "Traceback" not in result.output
