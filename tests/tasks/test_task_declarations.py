"""The task table declares what the plan layer checks without importing a task: its hub
dataset and its fixed test size. Adding a task is one module plus one `TASKS` line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from losslab.plan import check_plan_data
from losslab.tasks import TASKS, TaskDeclaration, make_task, task_declaration
from losslab.tasks.gsm8k import GSM8K_HUB_PATH

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED_GSM8K = REPO_ROOT.parent / "shared" / "gsm8k"  # as tests/conftest.py resolves ../shared
ARITHMETIC_PLAN = REPO_ROOT / "examples" / "arithmetic_dppo_vs_grpo_local.json"


def test_gsm8k_declares_what_its_module_loads() -> None:
    declared = task_declaration(" GSM8K ")
    assert declared is TASKS["openai/gsm8k"]
    assert declared.hub_path == GSM8K_HUB_PATH and declared.needs_hub and declared.reads_data
    assert task_declaration("arithmetic").needs_hub is False
    assert task_declaration("rg:chain_sum") is None  # prefixed tasks are generated offline


def test_gsm8k_test_size_is_the_real_split() -> None:
    test_file = SHARED_GSM8K / "test.jsonl"
    if not test_file.is_file():
        pytest.skip(f"the GSM8K copy is absent ({test_file}): only in the team checkout")
    lines = [line for line in test_file.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert task_declaration("gsm8k").test_size == len(lines)


MODULE = "losslab_throwaway_task"
TASK_MODULE = '''"""count: "how many letters in <word>?" problems, generated from a fixed word list."""

from dataclasses import dataclass, field

from losslab.tasks import Grade, Problem, extract_last_number, numeric_equal

WORDS = ["a", "to", "cat", "tree", "house", "planet"]


@dataclass
class CountTask:
    seed: int = 0
    n_test: int = 3
    name: str = "count"
    train: list = field(default_factory=list)
    test: list = field(default_factory=list)

    def __post_init__(self):
        items = [Problem(f"c{i}", f"How many letters in {w}?", str(len(w))) for i, w in enumerate(WORDS)]
        self.test, self.train = items[: self.n_test], items[self.n_test :]

    def messages(self, problem):
        return [{"role": "user", "content": problem.question}]

    def grade(self, problem, text, stopped):
        pred = extract_last_number(text)
        correct = numeric_equal(pred, problem.answer)
        return Grade(float(correct), correct, pred is not None, pred)

    def describe(self):
        return {"name": self.name, "n_test": len(self.test)}
'''


def test_adding_a_task_is_one_module_and_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / f"{MODULE}.py").write_text(TASK_MODULE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    # the one line (a hub path here only so the plan's dataset.hf_path is checked against it)
    monkeypatch.setitem(
        TASKS, "count", TaskDeclaration(f"{MODULE}:CountTask", hub_path="me/count", test_size=6)
    )
    data = json.loads(ARITHMETIC_PLAN.read_text(encoding="utf-8"))
    data["engine"]["task"] = "count"
    data["eval"]["n_examples"] = 7
    data["dataset"]["hf_path"] = "me/other"
    result = check_plan_data(data)
    assert [(p.path, p.message) for p in result.errors] == [
        (
            "eval.n_examples",
            "7 items, but the count test split has 6; the verdict would rest on fewer items "
            "than planned",
        )
    ]
    assert "dataset.hf_path: 'me/other' is not read; the task 'count' loads me/count" in [
        str(w) for w in result.warnings
    ]
    assert MODULE not in sys.modules  # plan check read the line, not the module
    task = make_task("count", seed=0, n_test=2)
    assert [p.answer for p in task.test] == ["1", "2"] and len(task.train) == 4
    assert task.grade(task.test[1], "It has 2 letters", stopped=True).correct
    sys.modules.pop(MODULE, None)
