"""Semantic plan checks (losslab.plan.semantics): the cases an adversarial pass found accepted,
each refused at its JSON path; warnings for a non-inferiority margin and unread fields; depth,
size and secrets bounded; every command refuses a deep plan without a traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from losslab.cli import app
from losslab.plan import check_plan_data, check_plan_file, parse_plan
from losslab.plan.semantics import MAX_PLAN_BYTES
from losslab.stats import decide

from ._plans import fresh_seed, set_at

CRIT = "decision_rule.criteria[0]"
INF, NAN = float("inf"), float("nan")

REFUSED: list[tuple[str, Any, str]] = [
    # (path, value, words of the message at that path)
    (f"{CRIT}.margin", -1, "not inside (-1, 1)"),  # a 30-points-worse arm would be `validated`
    (f"{CRIT}.margin", 1, "not inside (-1, 1)"),
    ("activation_gate.checks[2].min", NAN, "not a finite number"),
    ("correctness_preflight.paths[0].tolerances.baseline_loss.atol", INF, "not a finite number"),
    ("correctness_preflight.paths[0].tolerances.reference_gradient.rtol", -1e-6, "must be >= 0"),
    ("arms[0].loss", "ppo(foo=1)", "unknown parameter 'foo' for loss 'ppo'"),
    (
        "arms[0].loss",
        "ppo(clip_low_threshold=1.5, clip_high_threshold=0.5)",
        "clip_low_threshold=1.5 must be <= clip_high_threshold=0.5",
    ),
    ("arms[1].loss", "dppo_binary_tv(low=inf)", "low=inf: expected a finite number"),
    ("optimizer.lr", INF, "not a finite number"),
    ("optimizer.lr", 1e300, "learning rate 1e+300 is outside (0, 1]"),
    ("lora_rank", 10**30, "is above 1024"),
    ("eval.n_examples", 10**9, "is above 1000000"),
    ("eval.n_examples", 1320, "the gsm8k test split has 1319"),
    ("optimizer.beta1", 1.0, "outside [0, 1)"),
    ("optimizer.beta2", -0.5, "outside [0, 1)"),
    ("optimizer.eps", 0.0, "must be > 0"),
    ("decision_rule.seeds[0]", -1, "outside [0, 2**63)"),
    ("decision_rule.seeds[0]", 2**64, "outside [0, 2**63)"),
    ("correctness_preflight.paths", [], "required but lists no paths"),
]


@pytest.mark.parametrize(
    ("path", "value", "words"), REFUSED, ids=[f"{p}={v!r}" for p, v, _ in REFUSED]
)
def test_a_bad_number_is_refused_at_its_path(path: str, value: Any, words: str) -> None:
    data = fresh_seed()
    set_at(data, path, value)
    errors = {p.path: p.message for p in check_plan_data(data).errors}
    assert path in errors, errors
    assert words in errors[path]


def test_betas_out_of_range_are_refused_when_equal_in_both_arms() -> None:
    data = fresh_seed()
    data["optimizer"]["beta2"] = 1.5
    for group in data["restoration_preflight"]["groups"]:
        for arm in group["arms"]:
            arm["optimizer_config"]["beta2"] = 1.5
    errors = {p.path for p in check_plan_data(data).errors}
    assert "optimizer.beta2" in errors
    assert "restoration_preflight.groups[0].arms[0].optimizer_config.beta2" in errors


def test_an_arm_lr_out_of_range_is_refused_when_equal_in_both_arms() -> None:
    data = fresh_seed()
    for arm in data["arms"]:
        arm["lr"] = 1e300
    errors = {p.path: p.message for p in check_plan_data(data).errors}
    assert "learning rate 1e+300 is outside (0, 1]" in errors["arms[0].lr"]
    assert "learning rate 1e+300 is outside (0, 1]" in errors["arms[1].lr"]


def test_every_problem_is_reported_at_once() -> None:
    data = fresh_seed()
    for path, value, _ in REFUSED[:12]:
        if path.startswith("arms["):
            continue  # two loss edits on one arm overwrite each other
        set_at(data, path, value)
    paths = {p.path for p in check_plan_data(data).errors}
    assert {f"{CRIT}.margin", "lora_rank", "optimizer.lr", "activation_gate.checks[2].min"} <= paths


def _warnings(data: dict[str, Any]) -> dict[str, str]:
    result = check_plan_data(data)
    assert result.ok, result.errors
    return {w.path: w.message for w in result.warnings}


def test_a_negative_margin_is_reported_as_a_non_inferiority_test() -> None:
    data = fresh_seed()
    set_at(data, f"{CRIT}.margin", -0.05)
    assert "non-inferiority test" in _warnings(data)[f"{CRIT}.margin"]
    # and the verdict says so; a treatment 30 points worse on 1319 items is still refuted
    plan = parse_plan(data)
    n = plan.eval.n_examples
    rng = np.random.default_rng(0)
    base = (rng.random(n) < 0.6).astype(float)
    treat = base.copy()
    treat[np.flatnonzero(base)[: int(0.3 * n)]] = 0.0  # 30 points worse
    verdict = decide(
        plan.decision_rule,
        {"treatment": {"accuracy": treat}, "baseline": {"accuracy": base}},
        plan=plan,
    ).to_dict()
    assert verdict["verdict"] == "refuted"
    assert verdict["criterion"]["test"] == "non-inferiority"
    assert "this is a non-inferiority test" in verdict["statement"]


def test_a_rule_that_can_never_decide_at_the_eval_n_is_reported() -> None:
    data = fresh_seed()
    set_at(data, "eval.n_examples", 4)  # Hoeffding half-width 2*sqrt(ln(40)/8) = 1.36 > 1
    assert "can only be 'inconclusive'" in _warnings(data)[f"{CRIT}.margin"]


def test_fields_that_are_never_read_are_warned() -> None:
    data = fresh_seed()
    data.setdefault("engine", {})["eval_temperature"] = 0.7
    data["eval"]["aggregation"] = "mean"
    data["dataset"]["hf_path"] = "someone/else"
    warnings = _warnings(data)
    assert "is not read: evaluation always decodes greedily" in warnings["engine.eval_temperature"]
    assert "not read" in warnings["eval.aggregation"]
    assert (
        "'someone/else' is not read; the task 'gsm8k' loads openai/gsm8k"
        in warnings["dataset.hf_path"]
    )
    assert _warnings(fresh_seed()) == {}  # the seed plan itself reads every field it sets


def test_an_oversized_plan_file_is_refused(tmp_path: Path) -> None:
    data = fresh_seed()
    data["method"] = "x" * MAX_PLAN_BYTES
    path = tmp_path / "big.json"
    path.write_text(json.dumps(data))
    (problem,) = check_plan_file(path).errors
    assert problem.path == "$" and "at most 1048576 are read" in problem.message


def test_a_plan_with_the_api_key_is_refused_without_showing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "tml-0123456789abcdef"
    monkeypatch.setenv("TINKER_API_KEY", secret)
    data = fresh_seed()
    data["method"] += f" (key {secret})"
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    (problem,) = check_plan_file(path).errors
    assert "contains the value of TINKER_API_KEY" in problem.message
    assert secret not in problem.message


@pytest.mark.parametrize("command", [["plan", "check"], ["plan", "show"], ["preflight"], ["run"]])
def test_every_command_refuses_1200_nested_arrays_without_a_traceback(
    tmp_path: Path, command: list[str]
) -> None:
    text = json.dumps(fresh_seed())[:-1] + ', "feasibility": ' + "[" * 1200 + "]" * 1200 + "}"
    path = tmp_path / "deep.json"
    path.write_text(text)
    args = [*command, str(path)] + (["--out", str(tmp_path / "run")] if command == ["run"] else [])
    result = CliRunner().invoke(app, args)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code in (1, 2), result.output
    assert "nesting is 1201 levels deep" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "run").exists()
