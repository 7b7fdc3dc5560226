"""The call-text grammar `name(key=value, ...)` shared by loss specs, registry specs and revisions."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from losslab.callspec import (
    CallSpecError,
    format_call,
    format_value,
    parse_call,
    parse_value,
    split_keyword,
    split_top_level,
)


@pytest.mark.parametrize(
    ("text", "parts"),
    [
        ("a=1, b=2", ["a=1", "b=2"]),
        # commas inside quotes and brackets do not split
        ("s='a,b', k={'x': [1, 2]}, t=(3, 4)", ["s='a,b'", "k={'x': [1, 2]}", "t=(3, 4)"]),
        # an escaped quote does not close the string, so the comma after it stays inside
        (r"s='it\'s, fine', n=1", [r"s='it\'s, fine'", "n=1"]),
        # empty parts are kept (the caller decides whether a trailing comma is allowed)
        ("a=1,,b=2,", ["a=1", "", "b=2", ""]),
        ("", [""]),
    ],
)
def test_split_top_level(text: str, parts: list[str]) -> None:
    assert split_top_level(text) == parts


def test_split_keyword() -> None:
    assert split_keyword(" low = 1e-2 ") == ("low", "1e-2")
    assert split_keyword("s='a=b'") == ("s", "'a=b'")  # the first '=' separates key and value
    assert split_keyword("clip 0.8/1.2") is None  # free text, not key=value
    assert split_keyword("'a=b'") is None  # a key must be an identifier


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0.8", 0.8),
        ("10", 10),  # ints stay ints; callers that want floats convert
        ("-1e-3", -0.001),
        ("'x'", "x"),
        ('"a,b"', "a,b"),
        ("True", True),
        ("None", None),
        ("[1, (2, 3)]", [1, (2, 3)]),
        ("inf", math.inf),
        ("-Infinity", -math.inf),
    ],
)
def test_parse_value_literals(text: str, value: object) -> None:
    assert parse_value(text) == value
    assert parse_value(text, bare_words=True) == value


def test_parse_value_nan_and_bare_words() -> None:
    assert math.isnan(parse_value("nan"))
    assert parse_value("seq-mean-token-sum-norm", bare_words=True) == "seq-mean-token-sum-norm"
    with pytest.raises(CallSpecError, match=r"value 'token-mean' is not a literal \(number"):
        parse_value("token-mean")
    with pytest.raises(CallSpecError, match="or bare word"):
        parse_value("a b", bare_words=True)  # a bare word has no whitespace
    with pytest.raises(CallSpecError, match="empty value"):
        parse_value(" ")


@pytest.mark.parametrize(
    ("text", "name", "kwargs"),
    [
        ("ppo", "ppo", {}),
        ("ppo()", "ppo", {}),
        ("  ppo ( a = 1 , b='x', ) ", "ppo", {"a": 1, "b": "x"}),  # one trailing comma allowed
        ("f(k={'x': [1, 2]}, s='a,b')", "f", {"k": {"x": [1, 2]}, "s": "a,b"}),
    ],
)
def test_parse_call(text: str, name: str, kwargs: dict[str, object]) -> None:
    assert parse_call(text) == (name, kwargs)


@pytest.mark.parametrize(
    ("text", "message", "part"),
    [
        ("ppo(", r"cannot parse loss spec 'ppo\(': not a loss spec of the form", None),
        ("", "cannot parse loss spec '': not a loss spec", None),
        (
            "ppo(0.2)",
            r"cannot parse parameters '0.2' in loss spec 'ppo\(0.2\)': expected keyword=",
            "0.2",
        ),
        ("ppo(a=1,,b=2)", "parameters '' in .*: empty argument between commas", ""),
        ("ppo(a=1, a=2)", r"parameter 'a' is given twice in loss spec 'ppo\(a=1, a=2\)'", "a=2"),
        (
            "ppo(a=0.8 b=1.2)",
            r"cannot parse parameters 'a=0.8 b=1.2' in .*: value '0.8 b=1.2' is not a literal",
            "a=0.8 b=1.2",
        ),
        ("ppo(a=foo)", "value 'foo' is not a literal", "a=foo"),  # no bare words by default
    ],
)
def test_parse_call_errors_name_text_and_part(text: str, message: str, part: str | None) -> None:
    with pytest.raises(CallSpecError, match=message) as info:
        parse_call(text, what="loss spec")
    assert info.value.text == text and info.value.part == part
    assert isinstance(info.value, ValueError)


def test_format_value() -> None:
    assert format_value("sampler") == '"sampler"'
    assert format_value("token-mean", bare_words=True) == "token-mean"
    # words that would read back as something else are quoted even with bare words
    assert format_value("inf", bare_words=True) == '"inf"'
    assert format_value("True", bare_words=True) == '"True"'
    assert format_value("a b", bare_words=True) == '"a b"'
    assert format_value(math.inf) == "inf" and format_value(-math.inf) == "-inf"
    assert format_value(0.1 + 0.2) == "0.30000000000000004"  # exact repr, no rounding
    assert (
        format_call("ppo", {"clip_ratio_c": 10, "anchor": "x"})
        == 'ppo(clip_ratio_c=10, anchor="x")'
    )


_KEYS = st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True)
_VALUES = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
    | st.lists(st.integers(), max_size=3)
)


@given(st.dictionaries(_KEYS, _VALUES, max_size=5), st.booleans())
def test_format_call_round_trips(kwargs: dict[str, object], bare_words: bool) -> None:
    text = format_call("f", kwargs, bare_words=bare_words)
    assert parse_call(text, bare_words=bare_words) == ("f", kwargs)
