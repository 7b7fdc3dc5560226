"""`losslab plan check` is a JSON check: it never imports torch (nor the SDK or the hub client).

Each check runs in a fresh interpreter, so the imports of other tests in this session cannot
hide or fake an import; the command is the console script's own entry point (`losslab.cli:app`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED = REPO_ROOT.parent / "shared"  # as tests/conftest.py resolves it
USER_PLAN = SHARED / "seeds" / "experiment_plan.json"
EXAMPLES = sorted((REPO_ROOT / "examples").glob("*.json"))
HEAVY = ("torch", "tinker", "datasets", "transformers")

_PROBE = """
import json, sys
from losslab.cli import app
try:
    app(["plan", "check", sys.argv[1]])
except SystemExit as exit:
    code = exit.code
print(json.dumps({"exit": code, "imported": [m for m in sys.argv[2:] if m in sys.modules]}))
"""


def _plan_check_imports(plan: Path) -> dict[str, object]:
    """`{"exit": code, "imported": [heavy modules loaded], "errors": [error lines]}`."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, str(plan), *HEAVY],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {**result, "errors": [x for x in done.stderr.splitlines() if x.startswith("error:")]}


@pytest.mark.parametrize("plan", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_plan_check_of_the_examples_imports_no_torch(plan: Path) -> None:
    assert _plan_check_imports(plan) == {"exit": 0, "imported": [], "errors": []}


def test_plan_check_of_the_users_plan_imports_no_torch() -> None:
    if not USER_PLAN.is_file():
        pytest.skip(f"the user's plan is absent ({USER_PLAN}): it is only in the team checkout")
    assert _plan_check_imports(USER_PLAN) == {"exit": 0, "imported": [], "errors": []}


def test_a_refused_loss_is_refused_without_torch(tmp_path: Path) -> None:
    """The loss-parameter and gate-source checks run on the declarations, not on torch."""
    data = json.loads(EXAMPLES[0].read_text(encoding="utf-8"))
    data["arms"][0]["loss"] = "ppo(clip_low_threshold=-1)"
    data["arms"][1]["loss"] = "cispo"
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(data), encoding="utf-8")
    result = _plan_check_imports(plan)
    assert (result["exit"], result["imported"]) == (1, [])
    assert [line.split(":")[1].strip() for line in result["errors"]] == [
        "activation_gate.checks[0].metric",
        "arms[0].loss",
    ]
    assert "from the treatment arm's loss, cispo" in result["errors"][0]
    assert "ppo: clip_low_threshold=-1: expected a value >= 0" in result["errors"][1]


def test_the_backend_and_name_checks_run_without_torch(tmp_path: Path) -> None:
    """`engine.backend` is checked against `backends.registry` (stdlib only) and the arm name
    against the safe-name rule, still without loading a backend, torch or the SDK."""
    data = json.loads(EXAMPLES[0].read_text(encoding="utf-8"))
    data["engine"]["backend"] = "nosuch"
    data["arms"][0]["name"] = "../../../victim_data/train"
    data["decision_rule"]["alpha"] = 5e-324
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(data), encoding="utf-8")
    result = _plan_check_imports(plan)
    assert (result["exit"], result["imported"]) == (1, [])
    paths = [line.split(":")[1].strip() for line in result["errors"]]
    assert {"arms[0].name", "engine.backend", "decision_rule.alpha"} <= set(paths), paths
