"""Fixtures for plan tests."""

from __future__ import annotations

from typing import Any

import pytest

from ._plans import fresh_seed


@pytest.fixture
def seed_plan() -> dict[str, Any]:
    """A deep copy of the seed plan that a test may mutate."""
    return fresh_seed()
