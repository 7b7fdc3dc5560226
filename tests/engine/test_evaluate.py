"""Greedy evaluation on a small GSM8K-format file: hand-counted accuracy and per-item results."""

from __future__ import annotations

import json

import pytest

from losslab.engine import accuracy, evaluate, load_eval, save_eval
from losslab.tasks import ChatRenderer, Gsm8kTask

from ._fakes import FakeSamplingClient, FakeTrainingClient

ROWS = [
    {"question": "Ann has 3 apples and buys 15 more. How many?", "answer": "3+15=18\n#### 18"},
    {"question": "A car costs 1,000 dollars. Price?", "answer": "#### 1,000"},
    {"question": "Tom reads 4 pages a day for 5 days. Pages?", "answer": "4*5=20\n#### 20"},
    {"question": "Half of 9?", "answer": "#### 4.5"},
    {"question": "Sum of 2 and 2?", "answer": "#### 4"},
]
# Scripted greedy answers; hand grading (last \boxed{}, numeric exact match):
ANSWERS = {
    "Ann has": "3 + 15 = 18, so \\boxed{18.00}",  # correct (18.00 == 18)
    "A car costs": "It costs \\boxed{\\$1,000}.",  # correct ($, grouping comma)
    "Tom reads": "4*5 = \\boxed{21}",  # wrong number
    "Half of 9": "The answer is 4.5",  # no box: incorrect, format 0
    "Sum of 2": "\\boxed{5} then \\boxed{4}",  # last box counts: correct
}
HAND_ACCURACY = 3 / 5


@pytest.fixture
def gsm8k_dir(tmp_path):
    for split, rows in (("train", ROWS[:2]), ("test", ROWS)):
        with open(tmp_path / f"{split}.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return tmp_path


def test_evaluate_small_gsm8k_file(gsm8k_dir, tmp_path):
    task = Gsm8kTask(seed=0, data=gsm8k_dir)
    tokenizer = FakeTrainingClient().tokenizer
    calls = []
    sampler = FakeSamplingClient(tokenizer, [], calls, answers=ANSWERS)
    items = evaluate(sampler, task, task.test, ChatRenderer(tokenizer), max_tokens=16, batch=2)
    assert [i.id for i in items] == [f"gsm8k-test-{k}" for k in range(5)]  # file order
    assert [i.correct for i in items] == [True, True, False, False, True]
    assert [i.format for i in items] == [True, True, True, False, True]
    assert items[3].reward == pytest.approx(-0.1) and items[0].reward == 1.0
    assert accuracy(items) == pytest.approx(HAND_ACCURACY)
    assert all(c["params"].temperature == 0.0 and c["params"].max_tokens == 16 for c in calls)
    assert all(c["num_samples"] == 1 for c in calls)
    save_eval(tmp_path / "out" / "eval_a.jsonl", items, meta={"arm": "a"})
    assert load_eval(tmp_path / "out" / "eval_a.jsonl") == items


def test_accuracy_of_nothing_is_an_error():
    with pytest.raises(ValueError, match="empty"):
        accuracy([])
