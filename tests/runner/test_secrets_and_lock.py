"""Secrets never rewrite artifacts; a lock that cannot be turned on the user (issue 25, 2 and 3).

Before: with `TINKER_API_KEY=a` on a local run, redaction replaced every "a" in what was
written: state.json's sha256 digests no longer matched (every checkpoint "damaged"), the manifest
said `"backend": "loc***l"`, the run ended "no final checkpoint to evaluate" and every --resume
was refused. A `.lock` planted as a symlink made `acquire` truncate its target and write the pid
into it. The secret case runs again as the unprivileged user `nobody` where the OS allows it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from losslab.cli import app
from losslab.runner import run_plan
from losslab.runner.checkpoint import completed_steps, step_dir_name, verify_checkpoint
from losslab.runner.errors import RunDirError
from losslab.runner.lock import LOCK_NAME, acquire, acquire_shared

from ._fake_components import factory, final_state, write_fake_plan
from ._unprivileged import as_user


def _intact_run_with_short_key(base: Path) -> dict:
    plan = write_fake_plan(base / "plan.json")
    run = base / "run"
    run_plan(plan, out=run, quiet=True, components_factory=factory())
    manifest = json.loads((run / "manifest.json").read_text())
    for arm in ("base", "treat"):
        ckdir = run / "arms" / arm / "checkpoints"
        for step in completed_steps(ckdir):
            verify_checkpoint(ckdir / step_dir_name(step))  # raises on a digest mismatch
    # a completed run resumes (skips every phase) instead of being refused
    run_plan(plan, resume=run, quiet=True, components_factory=factory())
    return {"backend": manifest["backend"], "log": (run / "run.log").read_text()}


def test_a_one_letter_api_key_leaves_a_local_run_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reference: dict
) -> None:
    monkeypatch.setenv("TINKER_API_KEY", "a")
    seen = _intact_run_with_short_key(tmp_path)
    assert seen["backend"] == "local"
    assert "***" not in seen["log"] and "resuming" in seen["log"]
    assert final_state(tmp_path / "run") == reference  # the same numbers as with no key set


def test_a_one_letter_api_key_as_an_unprivileged_user(nobody: tuple[int | None, Path]) -> None:
    uid, base = nobody

    def attempt() -> dict:
        os.environ["TINKER_API_KEY"] = "a"
        return _intact_run_with_short_key(base)

    outcome = as_user(uid, attempt)
    assert "error" not in outcome, outcome
    assert uid is None or outcome["uid"] == uid
    assert outcome["backend"] == "local" and "***" not in outcome["log"]


def test_a_too_short_key_is_refused_on_tinker_naming_the_variable_not_the_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TINKER_API_KEY", "zq9")
    plan = write_fake_plan(tmp_path / "plan.json")
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", str(plan), "--backend", "tinker", "--out", str(out)])
    assert result.exit_code == 4, result.output
    assert "TINKER_API_KEY is set to a value shorter than 16 characters" in result.output
    assert "zq9" not in result.output
    assert not out.exists()  # refused at start: nothing written


@pytest.mark.parametrize("value", ["soon", "-5", "0", "nan", "inf"])
@pytest.mark.parametrize("name", ["LOSSLAB_TINKER_TIMEOUT_S", "LOSSLAB_TINKER_CALL_TIMEOUT_S"])
def test_a_bad_tinker_timeout_names_the_variable_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    """Before: exit 4 (a backend error) after the run directory was made."""
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    monkeypatch.setenv(name, value)
    plan = write_fake_plan(tmp_path / "plan.json")
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", str(plan), "--backend", "tinker", "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert f"{name}={value!r}: expected a number of seconds > 0" in result.output
    assert not out.exists()


# --- the lock ---------------------------------------------------------------------------------


def test_a_symlinked_lock_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    target = tmp_path / "users_notes.txt"
    target.write_text("my notes\n")
    (run / LOCK_NAME).symlink_to(target)
    for take in (acquire, acquire_shared):
        with pytest.raises(RunDirError, match=r"\.lock is a symbolic link"):
            take(run)
    assert target.read_text() == "my notes\n"


def test_a_dangling_lock_link_creates_nothing(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK_NAME).symlink_to(tmp_path / "would_be_created")
    with pytest.raises(RunDirError, match="symbolic link"):
        acquire(run)
    assert not (tmp_path / "would_be_created").exists()


def test_a_fifo_or_folder_lock_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo_run, dir_run = tmp_path / "a", tmp_path / "b"
    fifo_run.mkdir()
    dir_run.mkdir()
    os.mkfifo(fifo_run / LOCK_NAME)  # opening a FIFO for reading would block without O_NONBLOCK
    (dir_run / LOCK_NAME).mkdir()
    with pytest.raises(RunDirError, match="not a regular file"):
        acquire(fifo_run)
    with pytest.raises((RunDirError, IsADirectoryError)):
        acquire(dir_run)


def test_a_run_with_a_symlinked_lock_exits_2_and_leaves_the_target(tmp_path: Path) -> None:
    plan = write_fake_plan(tmp_path / "plan.json")
    run = tmp_path / "run"
    run_plan(plan, out=run, quiet=True, components_factory=factory())
    target = tmp_path / "victim.txt"
    target.write_text("keep\n")
    (run / LOCK_NAME).unlink()
    (run / LOCK_NAME).symlink_to(target)
    with pytest.raises(RunDirError, match="symbolic link"):
        run_plan(plan, resume=run, quiet=True, components_factory=factory())
    assert target.read_text() == "keep\n"
    result = CliRunner().invoke(app, ["report", str(run)])
    assert result.exit_code == 2 and "symbolic link" in result.output
    assert target.read_text() == "keep\n"


def test_shared_locks_coexist_and_exclude_a_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    first, second = acquire_shared(run), acquire_shared(run)
    assert first is not None and second is not None
    with pytest.raises(RunDirError, match="in use by another losslab run"):
        acquire(run)
    first.release()
    second.release()
    acquire(run).release()
