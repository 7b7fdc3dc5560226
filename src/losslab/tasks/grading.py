"""Answer extraction and grading.

Two graders live here, one per kind of task:

- `grade_answer` (GSM8K, math): tinker-cookbook math_rl's default `sympy` grader
  (`recipes/math_rl/math_grading.py`), which is the Hendrycks-MATH string normaliser, then the
  PRM800K normaliser, then a sympy equality check; run by `grade_answer_with_timeout` in a
  thread with the cookbook's 1 s limit (`MathEnv.timeout`). Written here, checked against the
  cookbook's own code on the edge cases and on every GSM8K test answer
  (tests/cookbook/test_parity_grading.py). Its quirks are the cookbook's and are kept on purpose:
  a unit word it does not list (`18 dollars`) is wrong while `18 hours` is right, `1/2` equals
  `0.5` (both become `\\frac{1}{2}`), `\\(5\\)` equals 5, `- 3` equals -3, and an integer
  answer needs an integer (`36/2` and `\\frac{36}{2}` are wrong for 18).
- `numeric_equal` (losslab's procedural tasks): exact decimal equality after `normalize_numeric`.

`extract_boxed` is the cookbook's brace scan: the contents of the `\\boxed{...}` that closes last;
a stray `}` anywhere means no answer (the cookbook raises "Unmatched }"); a bare `\\boxed 2` is
read only when there is no braced box. Only the box counts: a `#### N` line (GSM8K's reference
format) is not an answer, and the whole completion is read (no clipping to its last 300
characters, as verl's GSM8K reward does).

`grader_disagreements` is a second opinion: Hugging Face's `math-verify` (its own extraction from
the whole completion and its own equivalence check), listing the items where it and the grade
losslab recorded disagree. It never changes a grade; the report lists what it finds.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

__all__ = [
    "GraderDisagreement",
    "extract_boxed",
    "extract_gsm8k_answer",
    "extract_last_number",
    "grade_answer",
    "grade_answer_with_timeout",
    "grader_disagreements",
    "math_verify_grade",
    "normalize_numeric",
    "numeric_equal",
]

# ----------------------------------------------------------------------------- extraction

_BARE_BOXED_RE = re.compile(r"\\boxed\s+([a-zA-Z0-9]+)")
_INLINE_HASHES_RE = re.compile(r"####\s*(.+)")


def extract_boxed(text: str) -> str | None:
    """Contents of the last-closing `\\boxed{...}`, else of the first bare `\\boxed 2`; None when
    there is none or when the text has a `}` without its `{` (cookbook `extract_boxed`)."""
    open_positions: list[int] = []
    last: str | None = None
    for i, ch in enumerate(text):
        if ch == "{":
            open_positions.append(i)
        elif ch == "}":
            if not open_positions:
                return None  # the cookbook's "Unmatched }": neither format nor answer counts
            start = open_positions.pop()
            if text.endswith("\\boxed", 0, start):
                last = text[start + 1 : i]
    if last is not None:
        return last
    bare = _BARE_BOXED_RE.search(text)
    return bare.group(1) if bare else None


def extract_gsm8k_answer(answer: str) -> str:
    """GSM8K ground truth: the text after the last line starting with `####`, commas removed.

    Without such a line, the text after the last `####` anywhere (commas kept, as the cookbook's
    `extract_gsm8k_final_answer` does); raises ValueError naming the text when there is none.
    """
    for line in reversed(answer.splitlines()):
        stripped = line.strip()
        if stripped.startswith("####"):
            value = stripped[4:].strip()
            if value.startswith(":"):
                value = value[1:].strip()
            return value.replace(",", "").strip()
    inline = _INLINE_HASHES_RE.findall(answer)  # "... #### 5" inside a line
    if inline:
        return inline[-1].strip()
    raise ValueError(f"GSM8K answer has no '####' line: {answer[-120:]!r}")


# ----------------------------------------------------------------------------- math grading
# Stage 1, the Hendrycks-MATH normaliser: LaTeX spellings of one value become one string.

_TEXT_WRAPPED_RE = re.compile(r"^\\text\{(?P<text>.+?)\}$")


def _unwrap_text(s: str) -> str:
    m = _TEXT_WRAPPED_RE.search(s)
    return m.group("text") if m is not None else s


class _Unnormalisable(Exception):
    """The Hendrycks normaliser gave up: the answer is compared as written."""


def _brace_sqrt_arguments(s: str) -> str:
    head, *pieces = s.split("\\sqrt")
    out = head
    for piece in pieces:
        if piece.startswith("{"):
            out += "\\sqrt" + piece
        else:  # \sqrt3 -> \sqrt{3}; only the first character is the argument
            out += "\\sqrt{" + piece[:1] + "}" + piece[1:]
    return out


def _brace_frac_arguments(s: str) -> str:
    head, *pieces = s.split("\\frac")
    out = head
    for piece in pieces:
        if not piece:
            raise _Unnormalisable("\\frac with nothing after it")
        out += "\\frac"
        if piece[0] == "{":
            out += piece
        elif len(piece) < 2:
            return s  # \frac1: leave the whole string alone
        elif piece[1] == "{":  # \frac1{72} -> \frac{1}{72}
            out += "{" + piece[0] + "}" + piece[1:]
        else:  # \frac12 -> \frac{1}{2}
            out += "{" + piece[0] + "}{" + piece[1] + "}" + piece[2:]
    return out


def _slash_to_frac(s: str) -> str:
    parts = s.split("/")
    if len(parts) != 2:
        return s
    try:
        num, den = int(parts[0]), int(parts[1])
    except ValueError:
        return s
    if s != f"{num}/{den}":  # e.g. 01/2: int() accepted a spelling that is not canonical
        raise _Unnormalisable(s)
    return "\\frac{" + str(num) + "}{" + str(den) + "}"


def _hendrycks_normalize(answer: str) -> str:
    s = _unwrap_text(answer.strip()).strip()
    unwrapped = s
    try:
        s = s.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
        s = s.replace("tfrac", "frac").replace("dfrac", "frac")
        s = s.replace("\\left", "").replace("\\right", "")
        s = s.replace("^{\\circ}", "").replace("^\\circ", "").replace("\\$", "")
        if "\\text{ " in s:  # a unit written as "\text{ cm}" on the right
            before, *after = s.split("\\text{ ")
            if len(after) != 1:
                raise _Unnormalisable("more than one '\\text{ ' unit")
            s = before
        s = s.replace("\\%", "")
        s = s.replace(" .", " 0.").replace("{.", "{0.")
        if not s:
            return s
        if s[0] == ".":
            s = "0" + s
        lhs_rhs = s.split("=")
        if len(lhs_rhs) == 2 and len(lhs_rhs[0]) <= 2:  # "x = 5", "k=5"
            s = lhs_rhs[1]
        s = _brace_sqrt_arguments(s).replace(" ", "")
        s = _brace_frac_arguments(s)
        if s == "0.5":
            s = "\\frac{1}{2}"
        return _slash_to_frac(s)
    except _Unnormalisable:
        return unwrapped


# Stage 2, the PRM800K normaliser: units, words and LaTeX stripped to a sympy-readable string.

_UNITS = (
    "degree", "cm", "centimeter", "meter", "mile", "second", "minute", "hour", "day", "week",
    "month", "year", "foot", "feet", "inch", "yard",
)  # fmt: skip
_UNIT_RES = [re.compile(rf"{unit}(es)?(s)? *(\^[0-9]+)?") for unit in _UNITS]
_SCALE_WORDS = (("million", "*10^6"), ("billion", "*10^9"), ("trillion", "*10^12"))
_GROUPING_COMMA_3_RE = re.compile(r"(\d)(,)(\d\d\d)($|\D)")
_MIXED_NUMBER_RE = re.compile("([0-9]) +([0-9])")  # 7 3/4 -> 7+3/4


def _drop_grouping_commas(s: str) -> str:
    while True:
        dropped = _GROUPING_COMMA_3_RE.sub(r"\1\3\4", s)
        if dropped == s:
            return s
        s = dropped


def _as_float(s: str) -> float | None:
    try:
        return float(s)
    except (ValueError, OverflowError):
        return None


def _is_whole(x: float) -> bool:
    try:
        return abs(x - int(round(x))) <= 1e-7
    except (ValueError, OverflowError):  # nan, inf
        return False


def _str_is_int(s: str) -> bool:
    x = _as_float(_drop_grouping_commas(s))
    return x is not None and _is_whole(x)


def _latex_to_plain(s: str) -> str:
    from pylatexenc import latex2text

    s = s.replace("\\tfrac", "\\frac").replace("\\dfrac", "\\frac")
    s = s.replace("\\frac", " \\frac")  # keeps a mixed number "3\frac12" as "3 1/2"
    s = latex2text.LatexNodes2Text().latex_to_text(s)
    for symbol, word in (
        ("√", "sqrt"),
        ("π", "pi"),
        ("∞", "inf"),
        ("∪", "U"),
        ("·", "*"),
        ("×", "*"),
    ):
        s = s.replace(symbol, word)
    return s.strip()


def _prm800k_normalize(expr: str) -> str:
    s = _unwrap_text(expr)
    s = s.replace("\\%", "%").replace("\\$", "$").replace("$", "").replace("%", "")
    s = s.replace(" or ", " , ").replace(" and ", " , ")
    for word, power in _SCALE_WORDS:
        s = s.replace(word, power)
    for unit_re in _UNIT_RES:
        s = unit_re.sub("", s)
    s = re.sub(r"\^ *\\circ", "", s)
    if s and s[0] == "{" and s[-1] == "}":
        s = s[1:-1]
    s = re.sub(r",\\! *", "", s)
    x = _as_float(s)
    if x is not None and _is_whole(x):
        s = str(int(round(x)))
    if "\\" in s:
        try:
            s = _latex_to_plain(s)
        except Exception:  # pylatexenc rejects some inputs; keep the text as it was
            pass
    s = re.sub("- *", "-", s)
    s = _MIXED_NUMBER_RE.sub(r"\1+\2", s).replace(" ", "")
    s = s.replace("{", "").replace("}", "").lower()
    if _str_is_int(s):
        s = str(int(float(s.replace(",", ""))))  # truncates, as the cookbook does
    return s


# Stage 3, sympy: equal when the difference simplifies to 0 (guarded against slow inputs).

_SLOW_FOR_SYMPY = ("^{", "^(")
_SLOW_FOR_SYMPY_RES = (re.compile(r"\^[0-9]+\^"), re.compile(r"\^[0-9][0-9]+"))
_BRACKETS = "()[]"
_FRACTION_RE = re.compile(r"^-?[0-9]+.?/0*[1-9][0-9]*.?$")


def _sympy_may_evaluate(expr: str) -> bool:
    letters = {c for c in expr.replace("sqrt", "").replace("frac", "") if c.isalpha()}
    if len(letters) > 2:  # free text, or a function of many variables
        return False
    if any(bad in expr for bad in _SLOW_FOR_SYMPY):
        return False
    return not any(r.search(expr) for r in _SLOW_FOR_SYMPY_RES)


def _sympy_equal(truth: str, given: str) -> bool:
    import sympy
    from sympy.parsing import sympy_parser

    difference = f"({truth})-({given})"
    if not _sympy_may_evaluate(difference):
        return False
    transformations = sympy_parser.standard_transformations + (
        sympy_parser.implicit_multiplication_application,
    )
    try:
        parsed = sympy_parser.parse_expr(
            difference.replace("^", "**"), transformations=transformations
        )
        return bool(sympy.simplify(parsed) == 0)
    except Exception:  # sympy cannot parse or simplify it: not shown equal
        return False


def _tuple_elements(s: str) -> list[str]:
    s = _drop_grouping_commas(s)
    if not s:
        return []
    inner = s[1:-1]
    if (
        len(s) > 2
        and s[0] in _BRACKETS
        and s[-1] in _BRACKETS
        and not any(c in inner for c in _BRACKETS)
    ):
        return [e.strip() for e in inner.split(",")]
    return [s]


def grade_answer(given: str | None, truth: str) -> bool:
    """Whether `given` is the same answer as `truth` under the cookbook's sympy grader.

    Equal after the Hendrycks normaliser, or after the PRM800K normaliser, or element-wise
    (tuples/intervals with matching brackets): fractions `a/b` as strings, an integer truth only
    by string, anything else when sympy simplifies the difference to 0. May be slow on hostile
    inputs; `grade_answer_with_timeout` bounds it.
    """
    if given is None:
        return False
    if _hendrycks_normalize(given) == _hendrycks_normalize(truth):
        return True
    truth_n, given_n = _prm800k_normalize(truth), _prm800k_normalize(given)
    if truth_n == given_n:
        return True
    if not given_n:
        return False
    truth_elems, given_elems = _tuple_elements(truth_n), _tuple_elements(given_n)
    if len(truth_elems) != len(given_elems):
        return False
    if len(truth_elems) > 1 and (truth_n[0] != given_n[0] or truth_n[-1] != given_n[-1]):
        return False  # (a, b) is not [a, b]
    for t, g in zip(truth_elems, given_elems, strict=True):
        if _FRACTION_RE.search(t) and _FRACTION_RE.search(g):
            equal = t == g  # an unreduced fraction is not accepted
        elif _str_is_int(t) != _str_is_int(g):
            equal = False  # an integer answer needs an integer
        else:
            equal = _sympy_equal(t, g)
        if not equal:
            return False
    return True


def grade_answer_with_timeout(given: str | None, truth: str, timeout_s: float = 1.0) -> bool:
    """`grade_answer` in a worker thread; False when it raises or takes longer than `timeout_s`.

    The cookbook (`safe_grade`) waits `ceil(timeout)` seconds, so the limit is rounded up the same
    way. Unlike the cookbook's executor, a grading that overruns is not waited for: its daemon
    thread is left to finish on its own, so one slow answer does not stall the batch.
    """
    import math

    result: list[bool] = []

    def work() -> None:
        try:
            result.append(grade_answer(given, truth))
        except Exception:
            result.append(False)

    worker = threading.Thread(target=work, name="losslab-grade", daemon=True)
    worker.start()
    worker.join(timeout=math.ceil(timeout_s))
    return bool(result and result[0])


# ----------------------------------------------------------------------------- numeric match
_NUMBER = r"-?\d+(?:\.\d+)?|-?\.\d+"
_NUMBER_RE = re.compile(_NUMBER)
# A digit-grouping comma: "1,000" or "12,345,678" (three digits after each comma).
_GROUPING_COMMA_RE = re.compile(r"(?<=\d),(?=\d{3}(?:\D|$))")
_TEXT_WRAP_RE = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")
# One trailing unit word ("18 hours", "5 apples").
_TRAILING_WORDS_RE = re.compile(r"^(" + _NUMBER + r")\s*[a-zA-Z][a-zA-Z\s.]*$")


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


# ----------------------------------------------------------------------------- second opinion
MATH_VERIFY_TIMEOUT_S = 5
"""math-verify's own per-call limit (its default). It is a SIGALRM alarm, which only the main
thread may set: elsewhere math-verify runs without one."""


def math_verify_grade(completion: str, reference: str) -> tuple[bool, str | None]:
    """(correct, extracted answer) by math-verify: `parse` reads the completion with its default
    extraction (a `\\boxed{}` first, else the LaTeX or plain expressions it finds), `verify`
    compares it with the parsed reference. Unparseable input is (False, None), never an error."""
    from math_verify import parse, verify

    main = threading.current_thread() is threading.main_thread()
    timeout = MATH_VERIFY_TIMEOUT_S if main else None
    gold = parse(reference, parsing_timeout=timeout)  # type: ignore[arg-type]
    answer = parse(completion, parsing_timeout=timeout)  # type: ignore[arg-type]
    if not answer:
        return False, None
    return bool(verify(gold, answer, timeout_seconds=timeout)), str(answer[-1])


@dataclass(frozen=True)
class GraderDisagreement:
    """One item losslab's recorded grade and math-verify judge differently."""

    id: str
    reference: str
    losslab_prediction: str | None
    losslab_correct: bool
    math_verify_prediction: str | None
    math_verify_correct: bool
    completion_tail: str
    """The completion's last 200 characters (where the answer usually is)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _field(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, Mapping) else getattr(item, name, None)


def grader_disagreements(items: Iterable[Any]) -> list[GraderDisagreement]:
    """Items (EvalItem or rows of eval_<arm>.jsonl: id, answer, prediction, correct, completion)
    on which math-verify's grade of the completion differs from the recorded `correct`."""
    out = []
    for item in items:
        reference = str(_field(item, "answer"))
        completion = str(_field(item, "completion") or "")
        recorded = bool(_field(item, "correct"))
        verdict, extracted = math_verify_grade(completion, reference)
        if verdict != recorded:
            out.append(
                GraderDisagreement(
                    id=str(_field(item, "id")),
                    reference=reference,
                    losslab_prediction=_field(item, "prediction"),
                    losslab_correct=recorded,
                    math_verify_prediction=extracted,
                    math_verify_correct=verdict,
                    completion_tail=completion[-200:],
                )
            )
    return out
