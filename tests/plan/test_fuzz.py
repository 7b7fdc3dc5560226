"""No input makes plan checking crash: any value at any path of the seed plan gives problems or a
plan, never an exception (property test, derandomized so it is deterministic)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from losslab.plan import check_plan_data

from ._plans import fresh_seed


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, value in node.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out += _paths(value, (*prefix, i))
    return out


PATHS = _paths(fresh_seed())

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=6,
)


@settings(max_examples=300, derandomize=True, deadline=None)
@given(path=st.sampled_from(PATHS), value=json_values, delete=st.booleans())
def test_any_single_change_is_checked_without_exception(
    path: tuple[Any, ...], value: Any, delete: bool
) -> None:
    data = fresh_seed()
    node: Any = data
    for part in path[:-1]:
        node = node[part]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    result = check_plan_data(data)  # must not raise
    assert result.ok == (result.plan is not None)
    for problem in result.errors:
        assert problem.path and "\n" not in problem.message


def _value_at(data: Any, path: tuple[Any, ...]) -> Any:
    node = data
    for part in path:
        node = node[part]
    return node


def _json_path(path: tuple[Any, ...]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


STRINGS = [p for p in PATHS if isinstance(_value_at(fresh_seed(), p), str)]


def _invalid(text: str) -> bool:
    """A lone surrogate, or a control character other than tab, newline, carriage return."""
    return any(
        0xD800 <= ord(c) <= 0xDFFF or (ord(c) < 32 and c not in "\t\n\r") or ord(c) == 127
        for c in text
    )


# surrogates (Cs) and control characters (Cc) included: neither is in hypothesis's default text
hostile_text = st.text(
    alphabet=st.characters(categories=["Cs", "Cc", "Ll", "Nd", "Po", "Zs"]), min_size=1, max_size=6
)


@settings(max_examples=200, derandomize=True, deadline=None)
@given(path=st.sampled_from(STRINGS), text=hostile_text, as_key=st.booleans())
def test_any_string_or_key_with_invalid_unicode_or_control_bytes_is_refused_at_its_path(
    path: tuple[Any, ...], text: str, as_key: bool
) -> None:
    """A string value (or a new key beside it) holding a lone surrogate, NUL or another control
    character is refused at exactly its JSON path; any other text gives problems or a plan."""
    data = fresh_seed()
    parent = _value_at(data, path[:-1])
    if as_key and isinstance(parent, dict):
        parent[text] = 1
        where = _json_path((*path[:-1], text))
    else:
        parent[path[-1]] = text
        where = _json_path(path)
    result = check_plan_data(data)  # must not raise
    if _invalid(text):
        assert not result.ok
        shown = ascii(where) if _invalid(where) else where  # a path holding one is escaped
        assert any(p.path == shown for p in result.errors), (where, result.errors)
    for problem in result.errors:
        str(problem).encode("utf-8")  # every line prints: no surrogate reaches a message
