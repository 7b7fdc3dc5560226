"""The pilot measures what the plan's gate checks, no more: a treatment loss that is not DPPO,
under a gate that does not name DPPO's mask metric, runs through the gate phase (before, the
pilot read every `GATE_METRICS` entry and stopped with a KeyError on `dppo/...` keys that such a
loss never logs, although `plan check` had accepted the plan)."""

from __future__ import annotations

import json
from pathlib import Path

from losslab.plan import GATE_METRICS, load_plan
from losslab.runner import run_plan

from ._tiny_plan import make_eos_biased_tiny_model, write_tiny_plan

ENGINE_ONLY_CHECKS = ("policy_drift_abs_p_q90", "executed_updates_per_batch", "executed_base_model")


def _cispo_plan(tmp_path: Path) -> Path:
    model = make_eos_biased_tiny_model(tmp_path / "model")
    path = write_tiny_plan(tmp_path / "plan.json", model)
    plan = json.loads(path.read_text())
    plan["arms"][1]["loss"] = "cispo(clip_low_threshold=0.0, clip_high_threshold=4.0)"
    plan["activation_gate"]["checks"] = [
        c for c in plan["activation_gate"]["checks"] if c["metric"] in ENGINE_ONLY_CHECKS
    ]
    plan["correctness_preflight"] = None  # no pinned reference for this pair of arms
    path.write_text(json.dumps(plan, indent=1))
    return path


def test_gate_metrics_are_the_checked_ones_in_check_order(tmp_path: Path) -> None:
    plan = load_plan(_cispo_plan(tmp_path))
    assert (
        list(plan.gate_metrics())
        == [c.metric for c in plan.activation_gate.checks]
        == list(ENGINE_ONLY_CHECKS)
    )
    assert all(plan.gate_metrics()[m] is GATE_METRICS[m] for m in ENGINE_ONLY_CHECKS)


def test_a_cispo_treatment_under_an_engine_only_gate_runs_past_the_gate(tmp_path: Path) -> None:
    result = run_plan(_cispo_plan(tmp_path), out=tmp_path / "run", quiet=True)
    gate = json.loads((result.run_dir / "pilot" / "gate.json").read_text())
    assert gate["passed"] is True
    assert [c["check"] for c in gate["checks"]] == list(ENGINE_ONLY_CHECKS)
    treatment_rows = (result.run_dir / "arms" / "dppo_seed0" / "metrics.jsonl").read_text()
    # no side loss was attached: the gate reads none
    assert "baseline/" not in treatment_rows
    assert result.verdict is not None
