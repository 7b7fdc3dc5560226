"""Fixtures of the runner tests: the default fake plan and one undisturbed run of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from losslab.runner import run_plan

from ._fake_components import factory, final_state, write_fake_plan


@pytest.fixture
def plan(tmp_path: Path) -> Path:
    return write_fake_plan(tmp_path / "plan.json")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Final state of one uninterrupted run of the default fake plan."""
    tmp = tmp_path_factory.mktemp("reference")
    run_plan(
        write_fake_plan(tmp / "plan.json"),
        out=tmp / "run",
        quiet=True,
        components_factory=factory(),
    )
    return final_state(tmp / "run")
