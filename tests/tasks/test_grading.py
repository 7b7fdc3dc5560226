"""Answer extraction and numeric exact match (cookbook math_rl GSM8K conventions)."""

from __future__ import annotations

import pytest

from losslab.tasks import (
    extract_boxed,
    extract_gsm8k_answer,
    extract_last_number,
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
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


def test_gsm8k_answer_after_last_hashes_commas_removed():
    assert extract_gsm8k_answer("a\n#### 1,234") == "1234"
    assert extract_gsm8k_answer("#### 5\nmore\n####: 7") == "7"
    with pytest.raises(ValueError, match="no '####' line"):
        extract_gsm8k_answer("just text")


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
