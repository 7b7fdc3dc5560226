"""`losslab run --rehearse`: the plan's every phase at toy scale, marked REHEARSAL everywhere."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest

from losslab.runner import ResumeRefused, run_plan
from losslab.runner.rehearsal import RehearsalComponents, RehearsalScale
from losslab.runner.rundir import RunDir

REPO = Path(__file__).resolve().parents[2]
GSM8K_PLAN = REPO / "examples" / "gsm8k_dppo_vs_grpo.json"
ARITHMETIC_PLAN = REPO / "examples" / "arithmetic_dppo_vs_grpo_local.json"
TINY_SCALE = RehearsalScale(
    rollout_steps=1,
    pilot_steps=1,
    groups_per_batch=1,
    group_size=2,
    max_tokens=3,
    eval_max_tokens=3,
    eval_items=2,
)


def test_gsm8k_plan_rehearses_a_shrunk_qwen3_5(tmp_path, shared_dir):
    """Offline, the plan's Qwen/Qwen3.5-2B becomes transformers' Qwen3_5TextConfig defaults,
    shrunk to one period of its layer pattern: 3 Gated-DeltaNet layers, then full attention."""
    comp = RehearsalComponents(GSM8K_PLAN, "local", data=shared_dir / "gsm8k", model_cache=tmp_path)
    m = comp.model
    assert m["model_type"] == "qwen3_5_text" and "Qwen3_5TextConfig defaults" in m["architecture"]
    assert m["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    assert m["hidden_size"] == 32 and "byte-level ChatML" in m["tokenizer"]
    plan = comp.plan  # the toy schedule; everything else is the plan's
    assert (plan.rollout_steps, plan.steps, plan.eval.n_examples) == (2, 4, 8)
    assert plan.engine.local_base_model == m["path"] and plan.lora_rank == 32
    assert [a.loss for a in plan.arms] == [a.loss for a in comp.full_plan.arms]
    assert comp.schedule.steps == 2 and comp.schedule.pilot_steps == 1
    cost = comp.rehearsal["cost_projection"]  # the real plan's cost, prompts measured on GSM8K
    assert cost["available"] and cost["prompt"]["items"] == 256
    assert cost["budget_gpu_hours"] == 2.0 and cost["budget_wall_minutes"] == 120


def test_rehearsal_runs_every_phase_and_is_marked(tmp_path):
    import torch

    factory = partial(RehearsalComponents, scale=TINY_SCALE, model_cache=tmp_path / "models")
    out = tmp_path / "run"
    threads = torch.get_num_threads()
    result = run_plan(
        ARITHMETIC_PLAN, out=out, quiet=True, components_factory=factory, rehearse=True
    )
    assert torch.get_num_threads() == threads  # the caller's thread count is restored
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["environment"]["torch_threads"] == 1  # what the rehearsal ran on
    phases = {k: v["status"] for k, v in manifest["phases"].items()}
    expected = {"preflight", "restoration", "dispatch", "pilot", "feasibility", "gate", "arms"}
    assert expected | {"evaluation", "decision", "report"} <= set(phases)
    assert set(phases.values()) <= {"done", "forced"}  # a failed check is recorded, not a stop
    assert manifest["rehearsal"]["model"]["model_type"] == "llama"  # SmolLM2's architecture
    assert "REHEARSAL" in (out / "REHEARSAL.txt").read_text()
    for name in ("preflight.json", "restoration.json", "feasibility.json", "verdict.json"):
        assert "NOT evidence" in json.loads((out / name).read_text())["REHEARSAL"]
    assert "NOT evidence" in json.loads((out / "pilot" / "gate.json").read_text())["REHEARSAL"]
    assert result.verdict["evidence"] is False
    rows = [json.loads(line) for line in (out / "eval_grpo_seed0.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["rehearsal"] is True for r in rows)
    metrics = (out / "arms" / "dppo_seed0" / "metrics.jsonl").read_text().splitlines()
    assert metrics and all(json.loads(line)["REHEARSAL"] is True for line in metrics)
    executed = json.loads((out / "executed_config.json").read_text())
    assert all(cfg["REHEARSAL"]["match"] for cfg in executed.values())
    html = (out / "report.html").read_text()
    assert "<h1>REHEARSAL (not evidence):" in html and 'id="rehearsal"' in html
    assert "Cost projection of the real plan" in html
    assert "(REHEARSAL: toy model, not evidence)" in (out / "run.log").read_text()
    # a rehearsal directory can never become a real run
    with pytest.raises(ResumeRefused, match="REHEARSAL"):
        run_plan(ARITHMETIC_PLAN, resume=out, quiet=True)


def test_a_real_run_directory_cannot_be_resumed_as_a_rehearsal(tmp_path):
    # the creator holds the run-dir lock until it releases it, as a finished run does
    RunDir.create(tmp_path / "real", ARITHMETIC_PLAN, backend="local", force=False).release()
    factory = partial(RehearsalComponents, scale=TINY_SCALE, model_cache=tmp_path / "models")
    with pytest.raises(ResumeRefused, match="holds a real run"):
        run_plan(
            ARITHMETIC_PLAN,
            resume=tmp_path / "real",
            quiet=True,
            components_factory=factory,
            rehearse=True,
        )


def test_real_run_feasibility_carries_the_plan_only_projection(tmp_path):
    """A real run's feasibility.json holds the plan-only cost projection beside the pilot's."""
    from losslab.backends.local.tiny import make_tiny_model_dir
    from losslab.runner.components import DefaultComponents
    from losslab.runner.phases import feasibility

    from ._tiny_plan import write_tiny_plan

    model = make_tiny_model_dir(tmp_path / "m", arch="qwen3_5")
    plan = write_tiny_plan(tmp_path / "plan.json", model)
    comp = DefaultComponents(plan, "local")

    class PilotDone:  # what the feasibility phase reads of a run after its pilot
        def __init__(self) -> None:
            self.comp = comp

        def record(self, phase: str) -> dict:
            assert phase == "pilot"
            return {"seconds": 4.0, "eval_s_per_item": 0.1}

        def pilot_rows(self) -> list[dict]:
            return [{"time/sample_s": 3.0, "time/forward_backward_s": 1.0, "time/optim_s": 0.5}]

    art = feasibility.run(PilotDone()).record()
    cost = art["cost_projection"]
    assert cost["available"] and cost["model"]["exact"]  # counted from the local config
    assert cost["model"]["params"] == pytest.approx(51136)
    vs = cost["vs_pilot"]
    assert vs["pilot_wall_minutes"] == pytest.approx(art["wall_seconds"] / 60)
    assert vs["pilot_over_projected_wall"] == pytest.approx(
        art["wall_seconds"] / cost["wall_seconds"]
    )


def test_missing_data_stops_the_rehearsal_before_any_write(tmp_path):
    from losslab.runner import RunError

    out = tmp_path / "run"
    with pytest.raises(RunError, match="--data .*missing: no such file or folder"):
        run_plan(GSM8K_PLAN, out=out, quiet=True, data=tmp_path / "missing", rehearse=True)
    assert not out.exists()


def test_rehearsal_model_uses_the_base_models_own_config_when_present(tmp_path):
    from losslab.backends.local.tiny import make_tiny_model_dir
    from losslab.runner.rehearsal import build_rehearsal_model

    base = make_tiny_model_dir(tmp_path / "gemma", arch="gemma3")  # a local "hub" model
    m = build_rehearsal_model(str(base), tmp_path / "cache")
    assert "own config" in m["architecture"] and "own tokenizer" in m["tokenizer"]
    assert m["model_type"] == "gemma3_text"
    assert m["layer_types"] == ["sliding_attention", "full_attention"]


def test_unknown_architecture_offline_says_what_to_fetch(tmp_path):
    from losslab.runner import RunError
    from losslab.runner.rehearsal import build_rehearsal_model

    with pytest.raises(RunError, match="hf download some-org/unknown config.json"):
        build_rehearsal_model("some-org/unknown", tmp_path)
