"""Answer extraction and numeric exact-match grading.

GSM8K follows tinker-cookbook's math_rl env (`recipes/math_rl/math_env.py`, `math_grading.py`):
the ground truth is the text after the last `####` line with commas removed, and a completion is
graded on the contents of its last `\\boxed{...}`. The cookbook's `grade_answer` is, for GSM8K's
integer answers, a normalised string match; here it is a normalised *numeric* match, written out
so that every accepted form is listed in one place (`normalize_numeric`).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

__all__ = [
    "extract_boxed",
    "extract_gsm8k_answer",
    "extract_last_number",
    "normalize_numeric",
    "numeric_equal",
]

_NUMBER = r"-?\d+(?:\.\d+)?|-?\.\d+"
_NUMBER_RE = re.compile(_NUMBER)
# A digit-grouping comma: "1,000" or "12,345,678" (three digits after each comma).
_GROUPING_COMMA_RE = re.compile(r"(?<=\d),(?=\d{3}(?:\D|$))")
_TEXT_WRAP_RE = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")
# One trailing unit word ("18 hours", "5 apples"), as the cookbook's normaliser drops units.
_TRAILING_WORDS_RE = re.compile(r"^(" + _NUMBER + r")\s*[a-zA-Z][a-zA-Z\s.]*$")


def extract_boxed(text: str) -> str | None:
    """Contents of the last `\\boxed{...}` (brace-matched), or of a bare `\\boxed 2`; None if absent."""
    start = text.rfind("\\boxed")
    while start != -1:
        rest = text[start + len("\\boxed") :]
        if rest.startswith("{"):
            depth = 0
            for i, ch in enumerate(rest):
                if ch == "{":
                    depth += 1
                elif ch == "}":
                    depth -= 1
                    if depth == 0:
                        return rest[1:i]
            # Unbalanced braces: look for an earlier, complete box.
        elif rest.startswith(" "):
            token = rest.strip().split(maxsplit=1)
            if token:
                return token[0].rstrip(".$")
        start = text.rfind("\\boxed", 0, start)
    return None


def extract_gsm8k_answer(answer: str) -> str:
    """GSM8K ground truth: the text after the last line starting with `####`, commas removed.

    Raises ValueError naming the text when there is no `####` line (cookbook:
    `extract_gsm8k_final_answer`).
    """
    for line in reversed(answer.splitlines()):
        stripped = line.strip()
        if stripped.startswith("####"):
            value = stripped[4:].strip()
            if value.startswith(":"):
                value = value[1:].strip()
            return value.replace(",", "")
    raise ValueError(f"GSM8K answer has no '####' line: {answer[-120:]!r}")


def extract_last_number(text: str) -> str | None:
    """The last number in `text` after removing digit-grouping commas, or None."""
    matches = _NUMBER_RE.findall(_GROUPING_COMMA_RE.sub("", text))
    return matches[-1] if matches else None


def normalize_numeric(answer: str) -> Decimal | None:
    """Parse an answer string into an exact number, or None when it is not a plain number.

    Accepted (each equal to the bare number): surrounding whitespace and `$`/`\\$` signs,
    a trailing `%`/`\\%` or full stop, digit-grouping commas (`1,000`), LaTeX spacing `\\,` `\\!`,
    `\\text{..}`/`\\mathrm{..}` wrappers, outer braces, a leading `x =` style assignment, trailing
    zeros (`18.00`), and one trailing unit word (`18 hours`). Not accepted: fractions
    (`\\frac{36}{2}`, `36/2`) and expressions, matching the cookbook's strict integer rule.
    """
    s = answer.strip()
    for _ in range(3):  # nested wrappers such as \text{\$18}
        s = _TEXT_WRAP_RE.sub(r"\1", s)
    s = s.replace("\\!", "").replace("\\,", "").replace("\\ ", " ").replace("\\$", "$")
    s = s.replace("\\%", "%").strip()
    while s.startswith("{") and s.endswith("}"):
        s = s[1:-1].strip()
    s = re.sub(r"^[a-zA-Z]\s*=\s*", "", s)
    s = s.replace("$", "").strip().rstrip(".").rstrip("%").strip()
    s = _GROUPING_COMMA_RE.sub("", s)
    match = _TRAILING_WORDS_RE.match(s)
    if match:
        s = match.group(1)
    if not re.fullmatch(_NUMBER, s):
        return None
    try:
        return Decimal(s)
    except InvalidOperation:
        return None


def numeric_equal(prediction: str | None, target: str) -> bool:
    """Exact numeric equality of two answer strings after `normalize_numeric` (18.00 == 18)."""
    if prediction is None:
        return False
    got, want = normalize_numeric(prediction), normalize_numeric(target)
    return got is not None and want is not None and got == want
