"""A `--backend tinker` run's feasibility carries the Tinker token card; a bad price table is
refused before any run directory exists."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from losslab.runner.components import DefaultComponents
from losslab.runner.errors import UnsupportedPlan

SEED_PLAN = Path(__file__).resolve().parents[2] / "examples" / "gsm8k_dppo_vs_grpo.json"
GSM8K = Path(__file__).resolve().parents[3] / "shared" / "gsm8k"


@pytest.mark.skipif(not (GSM8K / "train.jsonl").is_file(), reason=f"no GSM8K data at {GSM8K}")
def test_tinker_backend_projection_has_the_token_card() -> None:
    comp = DefaultComponents(SEED_PLAN, "tinker", data=GSM8K)
    cost = comp.cost_projection
    lp = cost["prompt"]["mean_tokens"]  # measured on the training prompts
    # 2 arms x 50 steps x 256 sequences x (prompt + 512 completion tokens), trained once
    assert cost["tinker"]["tokens"]["train"] == pytest.approx(2 * 50 * 256 * (lp + 512))
    assert any(line.startswith("Tinker cost (--backend tinker") for line in cost["lines"])
    assert "tinker" not in DefaultComponents(SEED_PLAN, "local", data=GSM8K).cost_projection


def test_bad_price_table_is_refused_at_start(tmp_path: Path) -> None:
    plan = json.loads(SEED_PLAN.read_text())
    plan.setdefault("engine", {})["price_table"] = "absent.json"
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan), encoding="utf-8")
    with pytest.raises(UnsupportedPlan, match="plan engine.price_table: price table .*absent.json"):
        DefaultComponents(plan_file, "tinker")
    assert UnsupportedPlan.exit_code == 2
