"""Answer extraction, the cookbook's sympy grader and the procedural tasks' numeric match.

Expected grades are what tinker-cookbook 0.6.1's `grade_answer` returns on the same pair (run
with the `cookbook` extra; tests/cookbook/test_parity_grading.py re-checks each one against it).
"""

from __future__ import annotations

import pytest

from losslab.tasks import (
    extract_boxed,
    extract_gsm8k_answer,
    extract_last_number,
    grade_answer,
    grade_answer_with_timeout,
    normalize_numeric,
    numeric_equal,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{18}", "18"),
        ("\\boxed{3} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # last box, nested braces
        ("\\boxed 7.", "7"),
        ("no box here", None),
        ("\\boxed{12} and \\boxed{unclosed", "12"),
        ("\\boxed{\\boxed{3}}", "\\boxed{3}"),  # the box that closes last is the outer one
        ("a stray } then \\boxed{18}", None),  # the cookbook raises "Unmatched }"
        ("\\boxed{1} \\boxed 2", "1"),  # a bare box only counts when no braced box exists
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


def test_gsm8k_answer_after_last_hashes_commas_removed():
    assert extract_gsm8k_answer("a\n#### 1,234") == "1234"
    assert extract_gsm8k_answer("inline #### 1,234") == "1,234"  # cookbook fallback keeps commas
    assert extract_gsm8k_answer("#### 5\nmore\n####: 7") == "7"
    with pytest.raises(ValueError, match="no '####' line"):
        extract_gsm8k_answer("just text")


@pytest.mark.parametrize(
    ("given", "truth", "expected"),
    [
        ("18", "18", True),
        ("18.00", "18", True),  # a whole float is written as an int before comparing
        ("\\$18", "18", True),
        ("1,000", "1000", True),
        ("18 hours", "18", True),  # "hour" is one of the listed units
        ("18 dollars", "18", False),  # "dollars" is not
        ("1/2", "0.5", True),  # both become \\frac{1}{2} in the Hendrycks normaliser
        ("0.5", "1/2", True),
        ("\\(5\\)", "5", True),  # pylatexenc drops the inline-math delimiters
        ("- 3", "-3", True),
        ("\\frac{36}{2}", "18", False),  # an integer answer needs an integer
        ("36/2", "18", False),
        ("2\\sqrt{2}", "\\sqrt{8}", True),  # sympy simplifies the difference to 0
        ("(1,2)", "[1,2]", False),  # brackets must match
        ("", "18", False),
        (None, "18", False),
    ],
)
def test_grade_answer(given, truth, expected):
    assert grade_answer(given, truth) is expected
    assert grade_answer_with_timeout(given, truth) is expected


def test_grade_answer_with_timeout_counts_an_overrun_as_wrong(monkeypatch):
    import threading

    import losslab.tasks.grading as grading

    release = threading.Event()
    monkeypatch.setattr(grading, "grade_answer", lambda given, truth: release.wait(30) or True)
    try:
        assert grading.grade_answer_with_timeout("18", "18", timeout_s=0.01) is False
    finally:
        release.set()


@pytest.mark.parametrize(
    ("given", "target"),
    [
        ("18.00", "18"),
        ("$18", "18"),
        ("\\$18", "18"),
        ("1,000", "1000"),
        ("18 hours", "18"),
        ("x = 18", "18"),
        ("\\text{18}", "18"),
        ("{18}", "18"),
        ("18.", "18"),
        ("50\\%", "50"),
        ("-3", "-3"),
        ("0.5", ".5"),
    ],
)
def test_numeric_equal_accepts(given, target):
    assert numeric_equal(given, target)


@pytest.mark.parametrize(
    ("given", "target"),
    [
        ("\\frac{36}{2}", "18"),
        ("36/2", "18"),
        ("18.5", "18"),
        ("", "18"),
        (None, "18"),
        ("2+2", "4"),
        ("1,00", "100"),
    ],
)
def test_numeric_equal_rejects(given, target):
    assert not numeric_equal(given, target)


def test_last_number():
    assert extract_last_number("3 + 4 = 7.") == "7"
    assert extract_last_number("total 1,250 apples") == "1250"
    assert extract_last_number("it is -2") == "-2"
    assert extract_last_number("none") is None
    assert normalize_numeric("abc") is None


# --- GSM8K grader golden cases: `#### N`, `\boxed{}` and long tails --------------------------
# Expected grades are tinker-cookbook 0.6.1's MathEnv.step on the same completions (checked by
# tests/cookbook/test_parity_grading.py::test_reward_matches_math_env_step): only the last
# \boxed{} is the answer, `#### N` (GSM8K's reference format) is not one, and the whole completion
# is read. verl's GSM8K reward, by contrast, reads only the last 300 characters
# (verl/utils/reward_score/gsm8k.py, _SOLUTION_CLIP_CHARS = 300) and only `#### N`.

TAIL_350 = " The total is the sum of the parts, checked twice." * 7  # 350 characters, no digit


def _gsm8k_grade(text: str, truth: str = "72"):
    from losslab.tasks import Problem
    from losslab.tasks.gsm8k import Gsm8kTask

    task = Gsm8kTask.__new__(Gsm8kTask)  # grading needs no data: skip loading the files
    task.format_coef, task.grade_timeout_s = 0.1, 1.0
    return task.grade(Problem("p", "q", truth), text, True)


@pytest.mark.parametrize(
    ("text", "correct", "fmt", "reward"),
    [
        # a correct `#### 72` and then more than 300 characters: no box, so wrong and unformatted
        # (reward 0 + 0.1 * (0 - 1) = -0.1); verl would miss it too (outside its last 300)
        ("Adding up: 72 clips.\n#### 72" + TAIL_350, False, False, -0.1),
        # a correct box and then more than 300 characters: right, nothing is clipped
        ("Adding up: \\boxed{72}" + TAIL_350, True, True, 1.0),
        (TAIL_350 + " \\boxed{72}", True, True, 1.0),
        # `####` vs `\boxed{}`: the box decides, whichever comes last
        ("\\boxed{72}\n#### 71", True, True, 1.0),
        ("#### 72\n\\boxed{71}", False, True, 0.0),
        ("#### 72", False, False, -0.1),
    ],
)
def test_gsm8k_grade_reads_the_box_not_the_hashes_and_never_clips(text, correct, fmt, reward):
    assert len(TAIL_350) == 350
    grade = _gsm8k_grade(text)
    assert (grade.correct, grade.format, grade.reward) == (correct, fmt, pytest.approx(reward))


# --- the second, independent grader: math-verify ----------------------------------------------


def _item(item_id: str, text: str, truth: str = "72") -> dict:
    grade = _gsm8k_grade(text, truth)
    return {
        "id": item_id,
        "answer": truth,
        "prediction": grade.prediction,
        "correct": grade.correct,
        "completion": text,
    }


def test_grader_disagreements_lists_where_math_verify_differs():
    from losslab.tasks import grader_disagreements

    items = [
        _item("hashes-only", "#### 72"),  # math-verify reads the bare 72; the cookbook needs a box
        _item("hashes-long-tail", "Adding up: 72 clips.\n#### 72" + TAIL_350),
        _item("unreduced", "\\boxed{\\frac{144}{2}}"),  # cookbook: an integer answer needs one
        _item("boxed", "so \\boxed{72}"),  # both right
        _item("boxed-decimal", "\\boxed{72.00}"),  # both right
        _item("wrong", "\\boxed{71}"),  # both wrong
        _item("unit-word", "\\boxed{72 dollars}"),  # both wrong ("dollars" is no number)
    ]
    found = grader_disagreements(items)
    assert [d.id for d in found] == ["hashes-only", "hashes-long-tail", "unreduced"]
    assert all(d.math_verify_correct and not d.losslab_correct for d in found)
    assert found[0].to_dict()["math_verify_prediction"] == "72"
    assert found[1].completion_tail == found[1].to_dict()["completion_tail"][-200:]


def test_math_verify_grade_works_off_the_main_thread():
    # math-verify's timeout is a SIGALRM alarm, which only the main thread may set
    import threading

    from losslab.tasks import math_verify_grade

    result = []
    worker = threading.Thread(target=lambda: result.append(math_verify_grade("\\boxed{72}", "72")))
    worker.start()
    worker.join(30)
    assert result == [(True, "72")]


def _gsm8k_test_rows(shared_dir):
    import json

    path = shared_dir / "gsm8k" / "test.jsonl"
    if not path.is_file():
        pytest.skip(f"{path} is absent (the shared GSM8K copy)")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_math_verify_agrees_on_every_boxed_gsm8k_reference_solution(shared_dir):
    # the 1319 reference solutions, calculator notes <<...>> dropped and `#### N` rewritten as
    # "The answer is \boxed{N}.": both graders must call every one right
    import re

    from losslab.tasks import grader_disagreements

    items = []
    for i, row in enumerate(_gsm8k_test_rows(shared_dir)):
        body = re.sub(r"<<[^>]*>>", "", row["answer"])
        text = re.sub(r"####\s*(.+)$", lambda m: f"The answer is \\boxed{{{m.group(1)}}}.", body)
        items.append(_item(f"gsm8k-test-{i}", text, extract_gsm8k_answer(row["answer"])))
    assert len(items) == 1319 and all(item["correct"] for item in items)
    assert grader_disagreements(items) == []


def test_raw_gsm8k_solutions_split_the_two_graders(shared_dir):
    # as written (`#### N`, no box) the cookbook's grader marks all 1319 wrong; math-verify, which
    # reads bare numbers, marks 1315 right (measured with math-verify 0.9.0, the pinned version)
    from losslab.tasks import grader_disagreements

    rows = _gsm8k_test_rows(shared_dir)
    items = [
        _item(f"gsm8k-test-{i}", row["answer"], extract_gsm8k_answer(row["answer"]))
        for i, row in enumerate(rows)
    ]
    assert not any(item["correct"] for item in items)
    assert len(grader_disagreements(items)) == 1315
