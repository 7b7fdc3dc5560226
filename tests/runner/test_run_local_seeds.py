"""A two-seed tiny-model plan end to end on the real local backend: one pair of arms per seed,
each pair sharing its seed's prompts and sampling seeds, the base model evaluated once, and a
report with per-seed verdicts and the pooled interval (tests/runner/_tiny_plan.py: seconds)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from losslab.runner import run_plan

from ._tiny_plan import make_eos_biased_tiny_model, write_tiny_plan

UNITS = ("grpo_seed0", "dppo_seed0", "grpo_seed0.seed1", "dppo_seed0.seed1")


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tiny_seeds")
    model = make_eos_biased_tiny_model(root / "model")
    plan_path = write_tiny_plan(root / "plan.json", model)
    plan = json.loads(plan_path.read_text())
    plan["decision_rule"]["seeds"] = [0, 1]
    plan_path.write_text(json.dumps(plan, indent=1))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_plan(plan_path, out=root / "run", quiet=True)
    finally:
        torch.set_num_threads(threads)
    return root / "run"


def test_each_seed_trains_a_pair_on_its_own_prompts_and_sampling_seeds(run: Path) -> None:
    rows = {u: _jsonl(run / "arms" / u / "metrics.jsonl") for u in UNITS}
    assert all(len(r) == 2 for r in rows.values())  # 2 rollout steps per unit
    for step in range(2):
        data = {
            u: (r[step]["data/problem_ids"], r[step]["data/sampling_seeds"])
            for u, r in rows.items()
        }
        assert data["grpo_seed0"] == data["dppo_seed0"]  # a pair shares its seed's data
        assert data["grpo_seed0.seed1"] == data["dppo_seed0.seed1"]
        # seed 1 draws other sampling seeds (and, from its own training order, other prompts)
        assert data["grpo_seed0"][1] != data["grpo_seed0.seed1"][1]
    assert [rows["grpo_seed0"][s]["data/problem_ids"] for s in range(2)] != [
        rows["grpo_seed0.seed1"][s]["data/problem_ids"] for s in range(2)
    ]


def test_every_unit_and_the_base_model_score_the_same_items(run: Path) -> None:
    ids = [r["id"] for r in _jsonl(run / "eval_base_model.jsonl")]
    assert len(ids) == 4
    for u in UNITS:
        rows = _jsonl(run / f"eval_{u}.jsonl")
        assert [r["id"] for r in rows] == ids
        assert all(r["question"] and "completion" in r and "prediction" in r for r in rows)


def test_report_shows_per_seed_and_pooled_results(run: Path) -> None:
    verdict = json.loads((run / "verdict.json").read_text())
    assert [r["seed"] for r in verdict["per_seed"]] == [0, 1]
    assert verdict["method"] == "paired_hoeffding"  # the plan's rule decides
    assert verdict["estimate"] == pytest.approx(sum(r["estimate"] for r in verdict["per_seed"]) / 2)
    assert verdict["pooled"]["method"] == "two_way_cluster_t"
    assert verdict["pooled"]["deciding"] is False
    assert "2 training seeds (0, 1)" in verdict["statement"]
    html = (run / "report.html").read_text()
    assert 'id="per-seed"' in html and 'id="pooled-text"' in html and 'id="base-row"' in html
    facts = json.loads((run / "report.json").read_text())
    assert set(facts["base_evaluation"]["versus_base"]) == set(UNITS)
