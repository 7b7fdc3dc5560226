"""Tinker token counts and dollars: every number re-derived by hand from the plan's values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from losslab.cli import app
from losslab.plan import load_plan
from losslab.stats.tinker_cost import load_price_table, tinker_cost

SEED_PLAN = Path(__file__).resolve().parents[2] / "examples" / "gsm8k_dppo_vs_grpo.json"
USER_PLAN = Path(__file__).resolve().parents[3] / "shared" / "seeds" / "experiment_plan.json"


def _table(tmp_path: Path, models: dict, **extra) -> Path:
    path = tmp_path / "prices.json"
    body = {"date": "2026-01-01", "source": "test table", "models": models, **extra}
    path.write_text(json.dumps(body), encoding="utf-8")
    return path


def test_tokens_and_dollars_by_hand(tmp_path: Path) -> None:
    # 32 groups x 8, max_tokens 512, 50 rollout steps, 2 arms, 1319 eval items x 512, prompt 100
    plan = load_plan(SEED_PLAN)
    table = load_price_table(
        _table(tmp_path, {"Qwen/Qwen3.5-2B": {"prefill": 1.0, "sample": 2.0, "train": 3.0}})
    )
    card = tinker_cost(plan, 100.0, table)
    # sampling: 2 x 50 x 32 x 100 prompt tokens (once per group), 2 x 50 x 256 x 512 sampled
    assert card.parts["sampling (2 x 50 steps)"] == {
        "prefill": 320_000,
        "sample": 13_107_200,
        "train": 0,
    }
    # every sequence trained once (2 x 50 x 256 x 612) and read once more by the custom loss's
    # forward pass; three evaluations (the base model and both arms): 3 x 1319 x 100 / x 512
    assert card.parts["training (forward_backward)"]["train"] == 15_667_200
    assert card.parts["custom loss forward pass"]["prefill"] == 15_667_200
    assert card.parts["evaluation (3 x 1319 items)"] == {
        "prefill": 395_700,
        "sample": 2_025_984,
        "train": 0,
    }
    assert card.tokens == {"prefill": 16_382_900, "sample": 15_133_184, "train": 15_667_200}
    # $1 / $2 / $3 per million tokens
    assert card.dollars == pytest.approx(
        {"prefill": 16.3829, "sample": 30.266368, "train": 47.0016}
    )
    assert card.total_dollars == pytest.approx(93.650868)
    assert "2026-01-01" in card.lines()[0] and "$93.65" in "\n".join(card.lines())


def test_two_seeds_double_the_arms_and_add_evaluations() -> None:
    # seeds [0, 1]: 4 trained units, 5 evaluations (base + 4): train 4 x 50 x 256 x 612
    plan = load_plan(SEED_PLAN)
    plan.decision_rule.seeds = [0, 1]
    card = tinker_cost(plan, 100.0)
    assert card.tokens["train"] == 31_334_400
    assert card.parts["evaluation (5 x 1319 items)"]["sample"] == 5 * 1319 * 512


def test_bundled_table_is_dated_and_names_its_stand_in() -> None:
    table = load_price_table()
    assert table.date == "2026-12-02" and "tinker-docs.thinkingmachines.ai" in table.source
    # Qwen3.5-2B is not in the transcribed table: priced as Qwen3.5-4B, said so
    prices, how = table.price("Qwen/Qwen3.5-2B")
    assert prices == table.models["Qwen/Qwen3.5-4B"] and "priced as Qwen/Qwen3.5-4B" in how
    assert table.price("Qwen/Qwen3-8B@abc")[0] == {"prefill": 0.13, "sample": 0.40, "train": 0.40}


def test_unpriced_model_gives_tokens_only(tmp_path: Path) -> None:
    table = load_price_table(_table(tmp_path, {"other": {"prefill": 1, "sample": 1, "train": 1}}))
    card = tinker_cost(load_plan(SEED_PLAN), 100.0, table)
    assert card.dollars is None and card.tokens["train"] == 15_667_200
    assert any("not priced: Qwen/Qwen3.5-2B is not in the price table" in x for x in card.lines())


def test_bad_table_names_the_field(tmp_path: Path) -> None:
    bad = _table(tmp_path, {"m": {"prefill": 1, "sample": "cheap", "train": 1}})
    with pytest.raises(ValueError, match=r"models\.m\.sample = 'cheap'; expected a price >= 0"):
        load_price_table(bad)
    with pytest.raises(ValueError, match="field 'date' must be a non-empty string"):
        load_price_table(_table(tmp_path, {}, date=""))
    result = CliRunner().invoke(app, ["plan", "show", str(SEED_PLAN), "--prices", str(bad)])
    assert result.exit_code == 2 and "error: --prices: price table" in result.output


def test_plan_show_prices_override(tmp_path: Path) -> None:
    prices = _table(tmp_path, {"Qwen/Qwen3.5-2B": {"prefill": 1.0, "sample": 2.0, "train": 3.0}})
    result = CliRunner().invoke(app, ["plan", "show", str(SEED_PLAN), "--prices", str(prices)])
    assert result.exit_code == 0, result.output
    assert "prices of 2026-01-01" in result.output
    assert "Qwen/Qwen3.5-2B's listed price" in result.output


@pytest.mark.skipif(not USER_PLAN.is_file(), reason=f"the user's plan is absent ({USER_PLAN})")
def test_plan_show_on_the_users_plan() -> None:
    """The user's plan: the MDE, the Tinker tokens and dollars, the GPU projection at 6N."""
    result = CliRunner().invoke(app, ["plan", "show", str(USER_PLAN)])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "minimum detectable effect" in out
    assert "Tinker cost (--backend tinker, Qwen/Qwen3.5-2B; prices of 2026-12-02)" in out
    # 2 arms x 50 steps x 256 sequences x (prompt + 512): the counts scale with the prompt
    # length measured here, so only their form is pinned; the train count is 2 x 50 x 256 x 512
    # plus the prompt part, at least 13,107,200
    line = next(x for x in out.splitlines() if x.startswith("  tokens     prefill"))
    train = float(line.rsplit("train ", 1)[1].replace(",", ""))
    assert train >= 13_107_200
    assert "  dollars    $" in out
    assert "(6N, two-phase)" in out and "training path two-phase (6N)" in out


def test_plan_price_table_is_read_from_the_plans_folder(tmp_path: Path) -> None:
    plan = json.loads(SEED_PLAN.read_text())
    plan.setdefault("engine", {})["price_table"] = "prices.json"
    _table(tmp_path, {"Qwen/Qwen3.5-2B": {"prefill": 1.0, "sample": 2.0, "train": 3.0}},
           date="2025-07-01")  # fmt: skip
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan), encoding="utf-8")
    result = CliRunner().invoke(app, ["plan", "show", str(plan_file)])
    assert result.exit_code == 0, result.output
    assert "prices of 2025-07-01" in result.output
