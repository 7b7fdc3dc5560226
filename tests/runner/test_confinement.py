"""No run writes or deletes outside its run directory (issue 25, failure 1).

Before: an arm named `../../../victim_data/train` (accepted by `plan check`) made `losslab run`
overwrite the user's `victim_data/train.jsonl` with eval rows, write checkpoints two levels up,
exit 0, and let the checkpoint clean-up delete folders there. The names below are injected past
the plan layer (the fake components take arm names as given), so these tests exercise the
runner's own write-time confinement (`rundir.confined`), not the plan check.

The traversal case runs again as the unprivileged user `nobody` where the OS allows it, with the
victim files writable by that user: the refusal must come from losslab, not from permissions.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from losslab.cli import app
from losslab.runner import RunDirError, RunInterrupted, run_plan
from losslab.runner.checkpoint import prune_checkpoints, step_dir_name
from losslab.runner.lock import acquire
from losslab.runner.rundir import PathOutsideRunDir, RunDir, confined

from ._fake_components import factory, write_fake_plan
from ._unprivileged import as_user

REPO = Path(__file__).resolve().parents[2]
VICTIM_TEXT = '{"question": "mine", "answer": "do not touch"}\n'


def _tree(folder: Path) -> dict[str, bytes | str]:
    """Every entry under `folder`: file bytes, or the target of a link."""
    out: dict[str, bytes | str] = {}
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        if p.is_symlink():
            out[rel] = "-> " + os.readlink(p)
        elif p.is_file():
            out[rel] = p.read_bytes()
        else:
            out[rel] = "dir"
    return out


def _victim(base: Path) -> Path:
    victim = base / "victim_data" / "train.jsonl"
    victim.parent.mkdir(parents=True)
    victim.write_text(VICTIM_TEXT)
    return victim


@pytest.mark.parametrize(
    "arm",
    ["../../victim_data/train", "../../../victim_data/train", "x/../../../victim_data/train"],
)
def test_a_traversal_arm_name_is_refused_before_anything_is_written(
    tmp_path: Path, arm: str
) -> None:
    victim = _victim(tmp_path)
    plan = write_fake_plan(tmp_path / "plan.json", arms=["base", arm])
    before = _tree(tmp_path)
    with pytest.raises(PathOutsideRunDir, match="outside the run directory") as info:
        run_plan(plan, out=tmp_path / "runs" / "r", quiet=True, components_factory=factory())
    assert repr(arm) in str(info.value)  # names the arm and the path
    assert victim.read_text() == VICTIM_TEXT
    assert _tree(tmp_path) == before  # not even the run directory was made


def test_an_absolute_arm_name_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    plan = write_fake_plan(tmp_path / "plan.json", arms=["base", str(target)])
    with pytest.raises(PathOutsideRunDir, match=str(target)):
        run_plan(plan, out=tmp_path / "r", quiet=True, components_factory=factory())
    assert not target.exists()


def test_the_cli_exit_code_is_2_and_names_the_path(tmp_path: Path) -> None:
    """Through the CLI guard (what a user sees): exit 2, the path, no traceback."""
    from losslab.cli_errors import guarded

    victim = _victim(tmp_path)
    plan = write_fake_plan(tmp_path / "plan.json", arms=["base", "../../victim_data/train"])
    code = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; from losslab.cli_errors import guarded; "
            "from losslab.runner import run_plan; from runner._fake_components import factory; "
            "guarded(lambda: run_plan(Path(sys.argv[1]), out=Path(sys.argv[2]), quiet=True, "
            "components_factory=factory()))",
            str(plan),
            str(tmp_path / "runs" / "r"),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO / 'tests'}"},
        timeout=120,
    )
    assert guarded is not None
    assert code.returncode == 2, code.stderr
    assert "victim_data/train" in code.stderr and "Traceback" not in code.stderr
    assert victim.read_text() == VICTIM_TEXT


def _interrupted_run(tmp_path: Path) -> tuple[Path, Path]:
    plan = write_fake_plan(tmp_path / "plan.json")
    run = tmp_path / "run"
    with pytest.raises(RunInterrupted):  # the pilot's 3rd step: checkpoints 1 and 2 exist
        run_plan(plan, out=run, quiet=True, components_factory=factory(interrupt_at=3))
    return plan, run


@pytest.mark.parametrize("link", ["arms", "arms/treat", "arms/treat/checkpoints"])
def test_a_symlinked_subfolder_pointing_outside_is_refused_on_resume(
    tmp_path: Path, link: str
) -> None:
    plan, run = _interrupted_run(tmp_path)
    outside = tmp_path / "outside"
    shutil.move(run / link, outside)  # the folder's contents now live outside, behind a link
    (run / link).symlink_to(outside, target_is_directory=True)
    before = _tree(outside)
    # refused by the arm-path check (arms, arms/treat) or by the resume's no-symlink rule
    with pytest.raises(RunDirError, match=r"outside the run directory|is a symbolic link"):
        run_plan(plan, resume=run, quiet=True, components_factory=factory())
    assert _tree(outside) == before  # nothing written into, nothing deleted from, the target


@pytest.mark.parametrize("name", ["run.log", "eval_base_model.jsonl", "manifest.json"])
def test_a_symlinked_file_is_never_written_through(tmp_path: Path, name: str) -> None:
    plan, run = _interrupted_run(tmp_path)
    target = tmp_path / "users_file.txt"
    target.write_text("precious\n")
    (run / name).unlink(missing_ok=True)
    (run / name).symlink_to(target)
    with pytest.raises(RunDirError, match=r"refusing to write|is a symbolic link"):
        run_plan(plan, resume=run, quiet=True, components_factory=factory())
    assert target.read_text() == "precious\n"


def test_a_link_planted_during_a_run_is_still_not_written_through(tmp_path: Path) -> None:
    """The write-time check itself (not the resume's no-symlink rule): a link that appears
    after the directory was opened is refused at the write."""
    run_dir = tmp_path / "run"
    (run_dir / "arms").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (run_dir / "arms" / "treat").symlink_to(outside, target_is_directory=True)
    with pytest.raises(PathOutsideRunDir, match=r"refusing to write .*outside the run directory"):
        RunDir(run_dir).metrics_path("treat")
    target = tmp_path / "users_file.txt"
    target.write_text("precious\n")
    (run_dir / "run.log").symlink_to(target)
    from losslab.runner.progress import RunConsole

    console = RunConsole(run_dir / "run.log", quiet=True, total_phases=1)
    with pytest.raises(PathOutsideRunDir, match="symbolic link"):
        console.log("hello")
    assert target.read_text() == "precious\n" and list(outside.iterdir()) == []


def test_checkpoint_clean_up_unlinks_a_symlinked_step_and_keeps_its_target(tmp_path: Path) -> None:
    ckdir = tmp_path / "run" / "arms" / "a" / "checkpoints"
    ckdir.mkdir(parents=True)
    outside = tmp_path / "outside"
    (outside / "trainer").mkdir(parents=True)
    (outside / "trainer" / "w.bin").write_bytes(b"user data")
    (ckdir / step_dir_name(1)).symlink_to(outside, target_is_directory=True)
    for step in (2, 3):
        (ckdir / step_dir_name(step)).mkdir()
    prune_checkpoints(ckdir, keep_last=1, protect=set())
    assert sorted(p.name for p in ckdir.iterdir()) == [step_dir_name(3)]
    assert (outside / "trainer" / "w.bin").read_bytes() == b"user data"


def test_confined_accepts_inside_paths_and_refuses_escapes(tmp_path: Path) -> None:
    root = tmp_path / "run"
    root.mkdir()
    assert confined(root, root / "arms" / "a" / "metrics.jsonl") == root / "arms/a/metrics.jsonl"
    assert confined(root, root / "x" / ".." / "y") == root / "x" / ".." / "y"  # lands inside
    for bad in (root / ".." / "y", Path("/etc/passwd"), root / "a" / ".." / ".." / "y"):
        with pytest.raises(PathOutsideRunDir):
            confined(root, bad)
    assert RunDir(root).eval_path("a") == root / "eval_a.jsonl"


def test_report_takes_a_shared_lock_and_waits_for_no_run(tmp_path: Path) -> None:
    """`losslab report` refuses while a run holds the directory (its files are changing)."""
    _plan, run = _interrupted_run(tmp_path)
    with acquire(run):
        result = CliRunner().invoke(app, ["report", str(run)])
    assert result.exit_code == 2 and "in use by another losslab run" in result.output
    assert CliRunner().invoke(app, ["report", str(run)]).exit_code == 0


def test_confinement_holds_for_an_unprivileged_user_who_could_write_the_victim(
    nobody: tuple[int | None, Path],
) -> None:
    """As `nobody`, with the victim file writable by nobody: only losslab stands in the way."""
    from losslab.runner.errors import RunError

    uid, base = nobody
    victim = _victim(base)
    os.chmod(victim.parent, 0o777)
    os.chmod(victim, 0o666)
    plan = write_fake_plan(base / "plan.json", arms=["base", "../../victim_data/train"])
    os.chmod(plan, 0o644)

    def attempt() -> dict:
        # the victim is writable by this user: the OS would allow the overwrite
        assert os.access(victim, os.W_OK)
        try:
            run_plan(plan, out=base / "runs" / "r", quiet=True, components_factory=factory())
        except RunError as e:
            return {"exit": e.exit_code, "message": str(e)}
        return {"exit": 0}

    outcome = as_user(uid, attempt)
    assert "error" not in outcome, outcome
    assert uid is None or outcome["uid"] == uid
    assert outcome["exit"] == 2 and "outside the run directory" in outcome["message"]
    assert victim.read_text() == VICTIM_TEXT
    assert not (base / "runs").exists()
