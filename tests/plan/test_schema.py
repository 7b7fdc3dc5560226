"""The seed plan loads unchanged; unknown fields are kept and warned about; defaults are marked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from losslab.plan import GATE_METRICS, EngineSettings, check_plan_data, load_plan, parse_plan

from ._plans import SEED_PLAN, set_at


def test_seed_plan_loads_without_errors_or_warnings() -> None:
    plan = load_plan(SEED_PLAN)
    assert plan.warnings == []
    assert plan.title.startswith("DPPO divergence-masked loss")
    assert [a.name for a in plan.arms] == ["grpo_seed0", "dppo_seed0"]
    assert plan.decision_rule.alpha == 0.05
    assert plan.decision_rule.criteria[0].weights == {"treatment": 1.0, "baseline": -1.0}
    assert plan.activation_gate is not None and len(plan.activation_gate.checks) == 5
    assert plan.feasibility is None and plan.eval.aggregation is None


def test_seed_plan_round_trips_unchanged(seed_plan: dict[str, Any]) -> None:
    """Every field of the file survives parsing: dumping the fields the file set gives it back."""
    plan = parse_plan(seed_plan)
    dumped = plan.model_dump(mode="json", exclude_unset=True)
    assert json.loads(json.dumps(dumped)) == seed_plan


def test_shared_seed_is_the_example(shared_dir: Path) -> None:
    shared = shared_dir / "seeds" / "experiment_plan.json"
    if not shared.is_file():
        pytest.skip(f"{shared} is absent")
    assert shared.read_bytes() == SEED_PLAN.read_bytes()


def test_unknown_fields_are_kept_and_warned(seed_plan: dict[str, Any]) -> None:
    seed_plan["reviewer_notes"] = "looks fine"
    set_at(seed_plan, "activation_gate.checks[0].unit", "fraction")
    set_at(seed_plan, "experiment_features.multi_turn", False)
    result = check_plan_data(seed_plan)
    assert result.ok
    assert result.plan is not None
    warned = {w.path for w in result.warnings}
    assert warned == {
        "reviewer_notes",
        "activation_gate.checks[0].unit",
        "experiment_features.multi_turn",
    }
    assert result.plan.model_extra == {"reviewer_notes": "looks fine"}
    dumped = result.plan.model_dump(mode="json", exclude_unset=True)
    assert dumped["activation_gate"]["checks"][0]["unit"] == "fraction"
    assert result.plan.warnings == [str(w) for w in result.warnings]


def test_engine_defaults_are_the_seed_prose_values(seed_plan: dict[str, Any]) -> None:
    # the seed's method text: "groups_per_batch=32 ... group_size=8 rollouts at temperature 1.0 and
    # max_tokens=512"; "A 5-step pilot" in the activation gate's reason
    plan = parse_plan(seed_plan)
    sources = plan.engine_sources()
    expected = {
        "group_size": 8,
        "groups_per_batch": 32,
        "temperature": 1.0,
        "max_tokens": 512,
        "pilot_steps": 5,
    }
    for key, value in expected.items():
        assert sources[key] == (value, "default")
    # steps counts optim steps: 100 = 50 rollout steps x 2 updates per batch
    assert plan.updates_per_batch == 2 and plan.rollout_steps == 50
    assert plan.batch_size == plan.engine.groups_per_batch * plan.engine.group_size


def test_engine_block_overrides_are_marked_plan(seed_plan: dict[str, Any]) -> None:
    # a small local plan: 4 prompts x 2 samples, 8 = batch_size; 2 rollout steps x 2 updates
    seed_plan["engine"] = {
        "group_size": 2,
        "groups_per_batch": 4,
        "max_tokens": 64,
        "backend": "local",
        "local_base_model": "smollm2-135m",
    }
    seed_plan.update(batch_size=8, steps=4, max_seq_len=256)
    plan = parse_plan(seed_plan)
    sources = plan.engine_sources()
    assert sources["group_size"] == (2, "plan")
    assert sources["temperature"] == (1.0, "default")
    assert plan.engine.backend == "local"


def test_prose_disagreeing_with_engine_is_a_warning(seed_plan: dict[str, Any]) -> None:
    seed_plan["method"] = seed_plan["method"].replace("group_size=8", "group_size=16")
    result = check_plan_data(seed_plan)
    assert result.ok
    assert [w.path for w in result.warnings] == ["engine.group_size"]
    assert "'group_size=16'" in result.warnings[0].message


def test_roles_default_by_position_and_can_be_explicit(seed_plan: dict[str, Any]) -> None:
    assert parse_plan(seed_plan).arm_roles() == {
        "baseline": "grpo_seed0",
        "treatment": "dppo_seed0",
    }
    seed_plan["arms"][0]["role"] = "treatment"
    seed_plan["arms"][1]["role"] = "baseline"
    # the gate's DPPO mask fraction now reads the treatment role's loss, ppo, which cannot feed it
    errors = check_plan_data(seed_plan).errors
    assert [
        (e.path, "from the treatment arm's loss, ppo (arms[0].loss" in e.message) for e in errors
    ] == [("activation_gate.checks[0].metric", True)]
    del seed_plan["activation_gate"]["checks"][0]
    plan = parse_plan(seed_plan)
    assert plan.arm_roles() == {"treatment": "grpo_seed0", "baseline": "dppo_seed0"}
    assert plan.arm("baseline").name == "dppo_seed0"


def test_adam_config_sources(seed_plan: dict[str, Any]) -> None:
    plan = parse_plan(seed_plan)
    sources = plan.adam_config_sources("treatment")
    assert sources["learning_rate"] == (2e-05, "plan")
    assert sources["eps"] == (1e-08, "restoration_preflight")
    assert sources["weight_decay"] == (0.0, "default")


def test_gate_metric_vocabulary_covers_the_seed_checks() -> None:
    plan = load_plan(SEED_PLAN)
    assert plan.activation_gate is not None
    assert {c.metric for c in plan.activation_gate.checks} == set(GATE_METRICS)


def test_engine_settings_fields_are_documented() -> None:
    import inspect

    source = inspect.getsource(EngineSettings)
    for name in EngineSettings.model_fields:
        assert f"    {name}:" in source
        after = source.split(f"    {name}:", 1)[1].splitlines()[1].strip()
        assert after.startswith('"""'), f"EngineSettings.{name} has no docstring"


def test_local_gate_accepts_the_local_model(seed_plan: dict[str, Any]) -> None:
    seed_plan["engine"] = {"local_base_model": "HuggingFaceTB/SmolLM2-135M-Instruct"}
    plan = parse_plan(seed_plan)
    # a run that executes the served base model keeps the gate as written
    assert plan.gate_for("Qwen/Qwen3.5-2B") is plan.activation_gate
    local = plan.gate_for("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert local is not None
    assert local.checks[4].one_of == ["Qwen/Qwen3.5-2B", "HuggingFaceTB/SmolLM2-135M-Instruct"]
    assert plan.activation_gate is not None
    assert plan.activation_gate.checks[4].one_of == ["Qwen/Qwen3.5-2B"]  # the plan is unchanged


def test_adam_defaults_mirror_tinker() -> None:
    """`plan` may not import tinker; its defaults must still be tinker.AdamParams()'s, which
    `losslab.engine.ArmConfig` uses directly (one Adam default)."""
    import tinker

    from losslab.engine import ArmConfig
    from losslab.plan import ADAM_DEFAULTS

    sdk = tinker.AdamParams()
    assert ADAM_DEFAULTS == {k: getattr(sdk, k) for k in ADAM_DEFAULTS}
    arm = ArmConfig(name="a", loss_fn=lambda d, lp: (None, {}), loss_name="x")
    assert {k: getattr(arm, k) for k in ADAM_DEFAULTS} == ADAM_DEFAULTS
