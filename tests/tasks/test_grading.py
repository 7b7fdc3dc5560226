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
