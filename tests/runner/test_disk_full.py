"""A full disk at any write: exit 1 naming the path and "no space left", and the run resumes to
the numbers of an undisturbed run (issue 25, failure 4: a full disk while the adapter was saved
was reported as a bug, exit 70).

Two ways: ENOSPC injected at the atomic write layer (`losslab.atomic._write_all`, where a real
write reports it, without a file name), at a spread of the run's 59 atomic writes; and, where
this process may mount one (root), a real 1 MiB tmpfs that fills up mid-run.
"""

from __future__ import annotations

import errno
import shutil
import subprocess
from pathlib import Path

import pytest

from losslab import atomic
from losslab.atomic import as_disk_full
from losslab.cli_errors import guarded
from losslab.runner import run_plan
from losslab.runner.errors import DiskFull

from ._fake_components import factory, final_state, write_fake_plan

# a fake run makes 59 atomic writes (counted by wrapping atomic_write_bytes): plan.json and the
# manifest while creating the directory (1-2), then manifest updates (phase status and the
# artifact ledger), phase artifacts, metrics.jsonl rows, eval files, verdict and report; these
# cover each kind
WRITE_INDICES = (1, 2, 3, 6, 11, 17, 24, 31, 38, 45, 52, 59)


def _fill_disk_at(monkeypatch: pytest.MonkeyPatch, k: int) -> dict[str, int]:
    calls = {"n": 0}
    real = atomic._write_all

    def write(f, data: bytes) -> None:
        calls["n"] += 1
        if calls["n"] == k:
            raise OSError(errno.ENOSPC, "No space left on device")  # as write(2): no file name
        real(f, data)

    monkeypatch.setattr(atomic, "_write_all", write)
    return calls


@pytest.mark.parametrize("k", WRITE_INDICES)
def test_enospc_at_any_atomic_write_is_exit_1_and_the_run_resumes(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    reference: dict,
    k: int,
) -> None:
    plan = write_fake_plan(tmp_path / "plan.json")
    run = tmp_path / "run"
    _fill_disk_at(monkeypatch, k)
    with pytest.raises(SystemExit) as info:
        guarded(lambda: run_plan(plan, out=run, quiet=True, components_factory=factory()))
    err = capsys.readouterr().err
    assert info.value.code == 1, err
    assert "no space left on the device while" in err and "Traceback" not in err
    assert str(tmp_path) in err  # names the file (or the run directory) that did not fit
    monkeypatch.undo()  # space freed
    if run.exists():
        assert "--resume" in err
        run_plan(plan, resume=run, quiet=True, components_factory=factory())
    else:  # full while creating it: the directory was never made (atomic), start again
        run_plan(plan, out=run, quiet=True, components_factory=factory())
    assert final_state(run) == reference
    assert not [p for p in run.rglob(".*.tmp")]  # no temp file left behind


def test_a_full_disk_seen_through_safetensors_or_torch_save_is_disk_full(tmp_path: Path) -> None:
    """What libraries raise instead of OSError: safetensors' message, torch's "file write failed"
    (judged by free space), and an unrelated error left alone."""
    st = RuntimeError("Error while serializing: IoError(No space left on device (os error 28))")
    full = as_disk_full(st, tmp_path)
    assert full is not None and full.errno == errno.ENOSPC and full.filename == str(tmp_path)
    torch_msg = RuntimeError(
        "[enforce fail at inline_container.cc:595] . PytorchStreamWriter "
        "failed writing file data/0: file write failed"
    )
    assert shutil.disk_usage(tmp_path).free > 1 << 20  # this disk is not full: not a disk error
    assert as_disk_full(torch_msg, tmp_path) is None
    assert as_disk_full(ValueError("bad shape"), tmp_path) is None


def test_a_full_disk_while_the_trainer_saves_is_exit_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reference: dict
) -> None:
    from ._fake_components import FakeTrainer

    real_save = FakeTrainer.save
    calls = {"n": 0}

    def save(self, folder: Path):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("IoError(No space left on device (os error 28))")
        return real_save(self, folder)

    monkeypatch.setattr(FakeTrainer, "save", save)
    plan = write_fake_plan(tmp_path / "plan.json")
    with pytest.raises(DiskFull, match=r"no space left on the device while writing .*trainer"):
        run_plan(plan, out=tmp_path / "run", quiet=True, components_factory=factory())
    monkeypatch.undo()
    run_plan(plan, resume=tmp_path / "run", quiet=True, components_factory=factory())
    assert final_state(tmp_path / "run") == reference


def _mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir()
    try:
        proc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
            capture_output=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def test_a_real_full_filesystem_is_exit_1_and_resumable_after_growing_it(
    tmp_path: Path, capsys: pytest.CaptureFixture, reference: dict
) -> None:
    """A 256 KiB tmpfs: a fake run needs ~480 KiB (du of one), so it fills mid-run."""
    mnt = tmp_path / "mnt"
    if not _mount_tmpfs(mnt, "256k"):
        pytest.skip("cannot mount a small tmpfs here (needs root and mount rights)")
    try:
        plan = write_fake_plan(tmp_path / "plan.json")
        run = mnt / "run"
        with pytest.raises(SystemExit) as info:
            guarded(lambda: run_plan(plan, out=run, quiet=True, components_factory=factory()))
        err = capsys.readouterr().err
        assert info.value.code == 1 and "no space left on the device while" in err, err
        assert "Traceback" not in err
        grown = subprocess.run(
            ["mount", "-o", "remount,size=64m", str(mnt)], capture_output=True, timeout=20
        )
        assert grown.returncode == 0, grown.stderr
        if run.exists():
            run_plan(plan, resume=run, quiet=True, components_factory=factory())
        else:
            run_plan(plan, out=run, quiet=True, components_factory=factory())
        assert final_state(run) == reference
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=20)
