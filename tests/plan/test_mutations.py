"""Malformed plans: each mutation of the seed plan is rejected on the right JSON path, in one line,
with no traceback, by `check_plan_data`, `load_plan` and `losslab plan check`."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from losslab.cli import app
from losslab.plan import PlanError, check_plan_data, load_plan

from ._plans import delete_at, fresh_seed, set_at

Mutation = Callable[[dict[str, Any]], None]


def setv(path: str, value: Any) -> Mutation:
    return lambda d: set_at(d, path, value)


def delv(path: str) -> Mutation:
    return lambda d: delete_at(d, path)


def both(*mutations: Mutation) -> Mutation:
    def run(d: dict[str, Any]) -> None:
        for m in mutations:
            m(d)

    return run


def _third_arm(d: dict[str, Any]) -> None:
    d["arms"].append(dict(d["arms"][1], name="dppo_seed0_copy"))


def _edit_revision(key: str, old: str, new: str) -> Mutation:
    def run(d: dict[str, Any]) -> None:
        path = d["correctness_preflight"]["paths"][0]
        assert old in path[key]
        path[key] = path[key].replace(old, new)

    return run


TOL = "correctness_preflight.paths[0].tolerances"
GATE = "activation_gate.checks"
REST = "restoration_preflight.groups[0].arms"
CRIT = "decision_rule.criteria[0]"

# (id, mutation, expected JSON path, expected words in that path's message)
MUTATIONS: list[tuple[str, Mutation, str, str]] = [
    # --- required fields and types (pass 1, pydantic) ---
    ("missing-title", delv("title"), "title", "required field is missing"),
    ("missing-base-model", delv("base_model"), "base_model", "required field is missing"),
    ("missing-eval", delv("eval"), "eval", "required field is missing"),
    ("missing-decision-rule", delv("decision_rule"), "decision_rule", "required"),
    ("missing-arms", delv("arms"), "arms", "required"),
    ("missing-budget", delv("budget"), "budget", "required"),
    ("hypothesis-number", setv("hypothesis", 123), "hypothesis", "valid string"),
    ("lora-rank-string", setv("lora_rank", "32"), "lora_rank", "valid integer"),
    ("lora-rank-zero", setv("lora_rank", 0), "lora_rank", "greater than 0"),
    ("training-type-sft", setv("training_type", "sft"), "training_type", "'rl'"),
    ("dataset-name-missing", delv("dataset.name"), "dataset.name", "required"),
    ("dataset-n-negative", setv("dataset.n_examples", -5), "dataset.n_examples", "greater than 0"),
    ("optimizer-sgd", setv("optimizer.name", "sgd"), "optimizer.name", "'adam'"),
    ("optimizer-lr-negative", setv("optimizer.lr", -1.0), "optimizer.lr", "greater than 0"),
    ("steps-string", setv("steps", "100"), "steps", "valid integer, got '100' (str)"),
    ("steps-float", setv("steps", 100.5), "steps", "valid integer"),
    ("eval-n-zero", setv("eval.n_examples", 0), "eval.n_examples", "greater than 0"),
    (
        "feature-string",
        setv("experiment_features.custom_loss", "yes"),
        "experiment_features.custom_loss",
        "valid boolean",
    ),
    (
        "tolerances-missing",
        delv("correctness_preflight.paths[0].tolerances"),
        "correctness_preflight.paths[0].tolerances",
        "required",
    ),
    ("gate-check-not-object", setv(f"{GATE}[0]", "x"), f"{GATE}[0]", "valid dictionary"),
    ("gate-max-string", setv(f"{GATE}[0].max", "0.3"), f"{GATE}[0].max", "valid number"),
    (
        "method-bootstrap",
        setv("decision_rule.method", "bootstrap"),
        "decision_rule.method",
        "'paired_hoeffding'",
    ),
    ("criteria-empty", setv("decision_rule.criteria", []), "decision_rule.criteria", "at least 1"),
    ("bounds-string", setv(f"{CRIT}.bounds", "0,1"), f"{CRIT}.bounds", "valid list"),
    ("arms-not-list", setv("arms", "x"), "arms", "valid list"),
    (
        "arm-updates-zero",
        setv("arms[0].updates_per_batch", 0),
        "arms[0].updates_per_batch",
        "greater than or equal to 1",
    ),
    ("arm-seed-bool", setv("arms[0].seed", True), "arms[0].seed", "valid integer"),
    (
        "budget-minutes-string",
        setv("budget.max_wall_minutes", "2h"),
        "budget.max_wall_minutes",
        "valid number",
    ),
    (
        "engine-temperature-string",
        setv("engine", {"temperature": "hot"}),
        "engine.temperature",
        "valid number",
    ),
    # engine.backend is checked against losslab.backends.BACKENDS when a run starts (plan does
    # not import the backends): tests/runner/test_cli_run.py::test_plan_backend_hint_is_checked
    (
        "audit-negative",
        setv("generation_audit.min_sample_size", -1),
        "generation_audit.min_sample_size",
        "greater than or equal to 0",
    ),
    (
        "feasibility-wall-string",
        setv("feasibility_check.wall_seconds", "x"),
        "feasibility_check.wall_seconds",
        "valid number",
    ),
    # --- experiment features losslab does not implement ---
    *[
        (
            f"feature-{name}",
            setv(f"experiment_features.{name}", True),
            f"experiment_features.{name}",
            "not implemented",
        )
        for name in (
            "custom_optimizer",
            "learned_generator",
            "warmup_adaptation",
            "generated_training_data",
            "adaptive_selection",
            "heldout_loss",
            "checkpoint_restore",
        )
    ],
    (
        "feature-unknown-true",
        setv("experiment_features.teleport", True),
        "experiment_features.teleport",
        "unknown experiment feature",
    ),
    # --- schedule relations ---
    (
        "steps-not-divisible",
        setv("steps", 101),
        "steps",
        "not divisible by arms[0].updates_per_batch 2",
    ),
    (
        "batch-size-mismatch",
        setv("batch_size", 128),
        "batch_size",
        "128 != engine.groups_per_batch 32 (default) x engine.group_size 8 (default) = 256",
    ),
    (
        "group-size-mismatch",
        setv("engine", {"group_size": 16}),
        "batch_size",
        "engine.group_size 16 (plan)",
    ),
    (
        "groups-not-divisible",
        both(setv("engine", {"groups_per_batch": 31}), setv("batch_size", 248)),
        "engine.groups_per_batch",
        "31 (plan) is not divisible",
    ),
    ("max-tokens-too-long", setv("max_seq_len", 512), "engine.max_tokens", "no room"),
    ("dataset-too-small", setv("dataset.n_examples", 1000), "dataset.n_examples", "need 1600"),
    # --- losses ---
    ("loss-unknown", setv("arms[1].loss", "foo"), "arms[1].loss", "not a known loss"),
    (
        "loss-unknown-registry",
        setv("arms[1].loss", "not_a_loss(tau=1)"),
        "arms[1].loss",
        "not a known loss",
    ),
    ("loss-positional-spec", setv("arms[1].loss", "cispo(0.2)"), "arms[1].loss", "keyword=value"),
    (
        "dppo-cap-unpinned",
        _edit_revision("reference_revision", ", clip_ratio_c=10", ""),
        "arms[1].loss",
        "does not pin clip_ratio_c",
    ),
    (
        "dppo-topk",
        _edit_revision("reference_revision", "dppo_binary_tv", "dppo_topk_tv"),
        "arms[1].loss",
        "loss_mode='dppo_topk_tv'",
    ),
    ("dppo-no-reference", delv("correctness_preflight"), "arms[1].loss", "has none"),
    (
        "grpo-clip-disagrees",
        _edit_revision("baseline_revision", "clip 0.8/1.2", "clip 0.7/1.3"),
        "arms[0].loss",
        "pins clip 0.7/1.3",
    ),
    # --- conformance tolerances ---
    ("atol-negative", setv(f"{TOL}.baseline_loss.atol", -1.0), f"{TOL}.baseline_loss.atol", ">= 0"),
    (
        "cosine-above-one",
        setv(f"{TOL}.baseline_gradient.min_cosine", 1.5),
        f"{TOL}.baseline_gradient.min_cosine",
        "outside [-1, 1]",
    ),
    # --- activation gate ---
    ("gate-min-above-max", setv(f"{GATE}[0].min", 0.5), f"{GATE}[0].min", "0.5 > max 0.3"),
    (
        "gate-unknown-metric",
        setv(f"{GATE}[1].metric", "policy_drift"),
        f"{GATE}[1].metric",
        "not a gate metric",
    ),
    ("gate-no-bound", delv(f"{GATE}[2].min"), f"{GATE}[2]", "no bound"),
    ("gate-fraction-above-one", setv(f"{GATE}[0].max", 1.5), f"{GATE}[0].max", "outside [0, 1]"),
    (
        "gate-updates-excluded",
        both(setv(f"{GATE}[3].min", 1), setv(f"{GATE}[3].max", 1)),
        f"{GATE}[3]",
        "excludes arms[0].updates_per_batch 2",
    ),
    (
        "gate-model-excluded",
        setv(f"{GATE}[4].one_of", ["Qwen/Other"]),
        f"{GATE}[4].one_of",
        "does not include base_model",
    ),
    ("gate-one-of-and-min", setv(f"{GATE}[4].min", 1), f"{GATE}[4].one_of", "not both"),
    ("gate-one-of-empty", setv(f"{GATE}[4].one_of", []), f"{GATE}[4].one_of", "is empty"),
    ("gate-drift-negative", setv(f"{GATE}[1].min", -0.1), f"{GATE}[1].min", "below 0"),
    # --- restoration preflight ---
    (
        "restore-unknown-arm",
        setv(f"{REST}[1].name", "dppo_seed1"),
        f"{REST}[1].name",
        "is not an arm",
    ),
    (
        "restore-beta2-differs",
        setv(f"{REST}[1].optimizer_config.beta2", 0.99),
        f"{REST}[1].optimizer_config.beta2",
        "arms may differ only in 'loss'",
    ),
    (
        "restore-optimizer-differs",
        setv(f"{REST}[0].optimizer", "sgd"),
        f"{REST}[0].optimizer",
        "differs from optimizer.name 'adam'",
    ),
    (
        "restore-lr-differs",
        setv(f"{REST}[0].optimizer_config.learning_rate", 1e-4),
        f"{REST}[0].optimizer_config.learning_rate",
        "differs from arms[0].lr 2e-05",
    ),
    (
        "restore-eps-vs-optimizer",
        setv("optimizer.eps", 1e-12),
        f"{REST}[0].optimizer_config.eps",
        "differs from optimizer.eps 1e-12",
    ),
    # --- decision rule ---
    (
        "alpha-above-one",
        setv("decision_rule.alpha", 1.5),
        "decision_rule.alpha",
        "1.5 is outside (0, 1)",
    ),
    ("alpha-zero", setv("decision_rule.alpha", 0), "decision_rule.alpha", "outside (0, 1)"),
    ("alpha-negative", setv("decision_rule.alpha", -0.1), "decision_rule.alpha", "outside (0, 1)"),
    ("alpha-one", setv("decision_rule.alpha", 1), "decision_rule.alpha", "outside (0, 1)"),
    ("version-2", setv("decision_rule.version", 2), "decision_rule.version", "not supported"),
    ("bounds-reversed", setv(f"{CRIT}.bounds", [1, 0]), f"{CRIT}.bounds", "[low, high]"),
    ("bounds-three", setv(f"{CRIT}.bounds", [0, 1, 2]), f"{CRIT}.bounds", "[low, high]"),
    ("bounds-one", setv(f"{CRIT}.bounds", [0]), f"{CRIT}.bounds", "[low, high]"),
    ("bounds-equal", setv(f"{CRIT}.bounds", [1, 1]), f"{CRIT}.bounds", "low < high"),
    (
        "weights-unknown-arm",
        setv(f"{CRIT}.weights", {"treatment": 1, "control": -1}),
        f"{CRIT}.weights.control",
        "neither an arm role",
    ),
    (
        "weights-same-arm",
        setv(f"{CRIT}.weights", {"treatment": 1, "dppo_seed0": -1}),
        f"{CRIT}.weights.dppo_seed0",
        "same arm as weights.treatment",
    ),
    ("weights-zero", setv(f"{CRIT}.weights.baseline", 0), f"{CRIT}.weights.baseline", "nonzero"),
    (
        "criterion-metric",
        setv(f"{CRIT}.metric", "f1"),
        f"{CRIT}.metric",
        "not a per-item evaluation metric",
    ),
    ("margin-out-of-range", setv(f"{CRIT}.margin", 1.5), f"{CRIT}.margin", "not inside (-1, 1)"),
    (
        "seeds-exclude-arms",
        setv("decision_rule.seeds", [1]),
        "arms[0].seed",
        "not in decision_rule.seeds [1]",
    ),
    (
        "criterion-id-repeats",
        lambda d: d["decision_rule"]["criteria"].append(dict(d["decision_rule"]["criteria"][0])),
        "decision_rule.criteria[1].id",
        "repeats criteria[0].id",
    ),
    # --- arms: exactly one switch ---
    (
        "arm-lr-differs",
        setv("arms[1].lr", 3e-05),
        "arms[1].lr",
        "3e-05 differs from arms[0].lr 2e-05; arms may differ only in 'loss'",
    ),
    (
        "arm-seed-differs",
        both(setv("arms[1].seed", 1), setv("decision_rule.seeds", [0, 1])),
        "arms[1].seed",
        "differs from arms[0].seed 0",
    ),
    (
        "arm-updates-differs",
        setv("arms[1].updates_per_batch", 4),
        "arms[1].updates_per_batch",
        "arms may differ only in 'loss'",
    ),
    (
        "arm-updates-default-differs",
        delv("arms[1].updates_per_batch"),
        "arms[1].updates_per_batch",
        "1 differs from arms[0].updates_per_batch 2",
    ),
    (
        "arm-extra-differs",
        setv("arms[1].warmup", 3),
        "arms[1].warmup",
        "3 differs from arms[0].warmup (absent)",
    ),
    (
        "arm-base-model",
        setv("arms[0].base_model", "Qwen/Other"),
        "arms[0].base_model",
        "differs from base_model",
    ),
    (
        "arms-same-loss",
        setv("arms[1].loss", "grpo_clip_eps0.2"),
        "arms[1].loss",
        "must differ in their switch 'loss'",
    ),
    ("arms-three", _third_arm, "arms", "exactly 2 arms"),
    (
        "arm-name-repeats",
        both(setv("arms[1].name", "grpo_seed0"), setv(f"{REST}[1].name", "grpo_seed0")),
        "arms[1].name",
        "repeats arms[0].name",
    ),
    (
        "arm-role-repeats",
        both(setv("arms[0].role", "treatment"), setv("arms[1].role", "treatment")),
        "arms[1].role",
        "repeats arms[0].role",
    ),
    ("switch-unknown", setv("switch", "optimizer"), "switch", "not an arm field"),
    (
        "switch-lr-but-loss-differs",
        setv("switch", "lr"),
        "arms[1].loss",
        "arms may differ only in 'lr'",
    ),
    # --- budget ---
    ("budget-negative", setv("budget.gpu_hours", -1.0), "budget.gpu_hours", "positive"),
    ("budget-empty", setv("budget", {}), "budget", "give gpu_hours or max_wall_minutes"),
    # --- issue 25: names that reach the file system (the safe-name rule, plan/names.py) ---
    (
        "arm-name-traversal",
        setv("arms[0].name", "../../../victim_data/train"),
        "arms[0].name",
        "'/', a path separator",
    ),
    ("arm-name-absolute", setv("arms[1].name", "/tmp/victim"), "arms[1].name", "an absolute path"),
    ("arm-name-backslash", setv("arms[0].name", "..\\victim"), "arms[0].name", "a path separator"),
    ("arm-name-dotdot", setv("arms[0].name", ".."), "arms[0].name", "a dot name"),
    ("arm-name-dot", setv("arms[1].name", "."), "arms[1].name", "a dot name"),
    ("arm-name-hidden", setv("arms[0].name", ".grpo"), "arms[0].name", "a dot name"),
    ("arm-name-empty", setv("arms[0].name", ""), "arms[0].name", "is empty"),
    ("arm-name-long", setv("arms[0].name", "a" * 65), "arms[0].name", "at most 64"),
    ("arm-name-option", setv("arms[0].name", "-rf"), "arms[0].name", "not a letter or digit"),
    ("arm-name-space", setv("arms[0].name", "grpo seed0"), "arms[0].name", "contains ' '"),
    ("arm-name-unicode", setv("arms[0].name", "grpo\u2215seed0"), "arms[0].name", "contains"),
    (
        "arm-names-differ-in-case",
        setv("arms[1].name", "GRPO_seed0"),
        "arms[1].name",
        "only in case",
    ),
    ("task-unknown", setv("dataset.name", "nosuch_task"), "dataset.name", "is not a task"),
    (
        "task-rg-traversal",
        setv("engine", {"task": "rg:../../etc"}),
        "engine.task",
        "a path separator",
    ),
    # --- issue 25: plans wrongly accepted before ---
    (
        "backend-unknown",
        setv("engine", {"backend": "nosuch"}),
        "engine.backend",
        "is not a backend",
    ),
    (
        "loss-cross-entropy",
        setv("arms[0].loss", "cross_entropy"),
        "arms[0].loss",
        "cannot train an RL arm",
    ),
    ("title-empty", setv("title", ""), "title", "is empty"),
    ("title-blank", setv("title", "  \t"), "title", "is empty"),
    ("title-nul", setv("title", "a\x00b"), "title", "a NUL byte"),
    ("title-escape-sequence", setv("title", "\x1b[2Jx"), "title", "a control character"),
    ("title-lone-surrogate", setv("title", "DPPO \ud800"), "title", "lone UTF-16 surrogate"),
    (
        "key-lone-surrogate",
        setv("engine", {"\udfff": 1}),
        "'engine.\\udfff'",
        "lone UTF-16 surrogate",
    ),
    (
        "revision-nul",
        _edit_revision("reference_revision", "clip_ratio=0.15", "clip_ratio=0.15\x00"),
        "correctness_preflight.paths[0].reference_revision",
        "a NUL byte",
    ),
    (
        "revision-path-traversal",
        _edit_revision("reference_revision", ":verl/", ":../../verl/"),
        "correctness_preflight.paths[0].reference_revision",
        "'..' part",
    ),
    (
        "revision-path-absolute",
        _edit_revision("reference_revision", ":verl/", ":/verl/"),
        "correctness_preflight.paths[0].reference_revision",
        "is absolute",
    ),
    (
        "baseline-clip-nan",
        _edit_revision("baseline_revision", "clip 0.8/1.2", "clip nan/nan"),
        "correctness_preflight.paths[0].baseline_revision",
        "two finite numbers",
    ),
    (
        "baseline-clip-words",
        _edit_revision("baseline_revision", "clip 0.8/1.2", "clip low/high"),
        "correctness_preflight.paths[0].baseline_revision",
        "two finite numbers",
    ),
    (
        "baseline-clip-ratio-nan",
        _edit_revision("baseline_revision", "clip 0.8/1.2", "clip_ratio=nan"),
        "correctness_preflight.paths[0].baseline_revision",
        "clip_ratio=nan is not a finite number",
    ),
    (
        "baseline-clip-string",
        _edit_revision("baseline_revision", "clip 0.8/1.2", "clip_ratio='0.2'"),
        "correctness_preflight.paths[0].baseline_revision",
        "is not a finite number",
    ),
    (
        "baseline-clip-one-threshold",
        _edit_revision("baseline_revision", "clip 0.8/1.2", "clip_low_threshold=0.8"),
        "correctness_preflight.paths[0].baseline_revision",
        "but not clip_high_threshold",
    ),
    (
        "baseline-clip-inverted",
        _edit_revision("baseline_revision", "clip 0.8/1.2", "clip 1.2/0.8"),
        "correctness_preflight.paths[0].baseline_revision",
        "not low < 1 < high",
    ),
    (
        "weights-huge",
        both(setv(f"{CRIT}.weights.treatment", 1e308), setv(f"{CRIT}.weights.baseline", -1e308)),
        f"{CRIT}.weights",
        "overflows to inf",
    ),
    (
        "weights-subnormal",
        setv(f"{CRIT}.weights.treatment", 5e-324),
        f"{CRIT}.weights.treatment",
        "normal floating-point range",
    ),
    (
        "bounds-huge",
        setv(f"{CRIT}.bounds", [-1e308, 1e308]),
        f"{CRIT}.bounds",
        "overflows to inf",
    ),
    ("alpha-subnormal", setv("decision_rule.alpha", 5e-324), "decision_rule.alpha", "rounds to 1"),
    ("alpha-1e-17", setv("decision_rule.alpha", 1e-17), "decision_rule.alpha", "rounds to 1"),
]


def _errors(data: Any) -> dict[str, list[str]]:
    result = check_plan_data(data)
    assert result.plan is None, "a mutated plan must not load"
    out: dict[str, list[str]] = {}
    for p in result.errors:
        out.setdefault(p.path, []).append(p.message)
    return out


def test_at_least_fifty_mutations() -> None:
    assert len(MUTATIONS) >= 50
    assert len({m[0] for m in MUTATIONS}) == len(MUTATIONS)


@pytest.mark.parametrize(
    ("mutate", "path", "words"), [m[1:] for m in MUTATIONS], ids=[m[0] for m in MUTATIONS]
)
def test_mutation_rejected_on_its_path(mutate: Mutation, path: str, words: str) -> None:
    data = fresh_seed()
    mutate(data)
    errors = _errors(data)
    assert path in errors, f"expected an error at {path}, got {errors}"
    assert any(words in msg for msg in errors[path]), errors[path]
    for messages in errors.values():
        assert all("\n" not in m and "Traceback" not in m for m in messages)


@pytest.mark.parametrize(
    ("mutate", "path"), [m[1:3] for m in MUTATIONS], ids=[m[0] for m in MUTATIONS]
)
def test_cli_check_rejects_without_traceback(tmp_path: Path, mutate: Mutation, path: str) -> None:
    data = fresh_seed()
    mutate(data)
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(data), encoding="utf-8")
    result = CliRunner().invoke(app, ["plan", "check", str(plan_file)])
    assert result.exit_code == 1
    assert isinstance(result.exception, SystemExit)  # typer.Exit, not a crash
    assert "Traceback" not in result.output
    assert f"error: {path}: " in result.output


def test_every_problem_reported_at_once() -> None:
    data = fresh_seed()
    set_at(data, "arms[1].lr", 3e-05)
    set_at(data, "decision_rule.alpha", 1.5)
    set_at(data, f"{GATE}[0].min", 0.5)
    set_at(data, "steps", "100")  # a type error does not hide the relation errors
    set_at(data, "experiment_features.heldout_loss", True)
    errors = _errors(data)
    for path in (
        "arms[1].lr",
        "decision_rule.alpha",
        f"{GATE}[0].min",
        "steps",
        "experiment_features.heldout_loss",
    ):
        assert path in errors, errors


def test_load_plan_raises_plan_error_with_all_lines(tmp_path: Path) -> None:
    data = fresh_seed()
    set_at(data, "arms[1].lr", 3e-05)
    set_at(data, "decision_rule.alpha", 0)
    plan_file = tmp_path / "bad.json"
    plan_file.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(PlanError) as info:
        load_plan(plan_file)
    paths = [p.path for p in info.value.problems]
    # the arm's lr also disagrees with the restoration preflight's optimizer_config for that arm
    assert paths == [
        "arms[1].lr",
        "restoration_preflight.groups[0].arms[1].optimizer_config.learning_rate",
        "decision_rule.alpha",
    ]
    text = str(info.value)
    assert text.splitlines()[0] == f"{plan_file}: plan has 3 problems"
    assert (
        "  arms[1].lr: 3e-05 differs from arms[0].lr 2e-05; arms may differ only in 'loss'" in text
    )


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("{ not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object, got list"),
        ("", "not valid JSON"),
    ],
)
def test_unparseable_files(tmp_path: Path, content: str, words: str) -> None:
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(content, encoding="utf-8")
    result = CliRunner().invoke(app, ["plan", "check", str(plan_file)])
    assert result.exit_code == 1
    assert f"error: $: {words}" in result.output


def test_missing_file(tmp_path: Path) -> None:
    """A plan file that is not there is a usage error (exit 2), not a plan with problems."""
    result = CliRunner().invoke(app, ["plan", "check", str(tmp_path / "absent.json")])
    assert result.exit_code == 2
    assert "does not exist" in result.output


@pytest.mark.parametrize(
    ("mutate", "path"),
    [
        (delv("arms[0].seed"), "arms[0].seed"),
        (setv("arms[1].lr", "3e-5"), "arms[1].lr"),
    ],
    ids=["missing-seed", "lr-string"],
)
def test_one_problem_gives_one_line(mutate: Mutation, path: str) -> None:
    """A missing or mistyped arm field is reported once, not again as an arm difference."""
    data = fresh_seed()
    mutate(data)
    result = check_plan_data(data)
    assert [p.path for p in result.errors] == [path]
