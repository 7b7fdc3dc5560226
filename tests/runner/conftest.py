"""Fixtures of the runner tests: the default fake plan and one undisturbed run of it."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
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


@pytest.fixture
def nobody() -> Iterator[tuple[int | None, Path]]:
    """(uid to drop to, a world-writable scratch folder under /tmp): the uid of `nobody` when
    running as root (skipped where there is no such user), None when already unprivileged. The
    folder is outside pytest's tmp_path, which `nobody` could not enter."""
    uid = None
    if os.geteuid() == 0:
        try:
            import pwd

            uid = pwd.getpwnam("nobody").pw_uid
        except KeyError:
            pytest.skip("running as root and there is no user 'nobody' to drop to")
    base = Path(tempfile.mkdtemp(prefix="losslab-nobody-", dir="/tmp"))
    os.chmod(base, 0o777)
    try:
        yield uid, base
    finally:
        shutil.rmtree(base, ignore_errors=True)
