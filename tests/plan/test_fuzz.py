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
