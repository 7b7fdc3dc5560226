"""Every one of the 49 objectives keeps the record's exact signature (names, order, defaults)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

import losslab.objectives as O

from ._record import SIGNATURES, parse_params, parse_record_signatures

RECORD = Path("seeds") / "objectives_reverse_engineering_record.txt"


def test_literal_table_matches_the_record(shared_dir: Path) -> None:
    parsed = parse_record_signatures(shared_dir / RECORD)
    assert parsed == SIGNATURES


def test_all_exports_exactly_the_49_names() -> None:
    assert len(SIGNATURES) == 49
    assert sorted(O.__all__) == sorted(SIGNATURES)
    assert len(O.__all__) == len(set(O.__all__))


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_signature(name: str) -> None:
    params = list(inspect.signature(getattr(O, name)).parameters.values())
    got = [
        (p.name, None if p.default is inspect.Parameter.empty else repr(p.default)) for p in params
    ]
    assert got == parse_params(SIGNATURES[name])
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params)


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_importable_from_its_submodule(name: str) -> None:
    fn = getattr(O, name)
    assert fn.__module__.startswith("losslab.objectives.")
    assert fn.__doc__, f"{name} has no docstring"
