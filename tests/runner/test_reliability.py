"""Run directories on a bad day: a second process, a kill while creating, damaged artifacts and
checkpoints, a read-only folder, a full disk, SIGTERM, a bug. Each ends in one message naming the
file (or a completed run whose numbers equal an undisturbed one), never a traceback.

Driven by the fake components (tests/runner/_fake_components.py), so each case takes a second.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from losslab.cli import app
from losslab.cli_errors import EXIT_BUG, guarded
from losslab.runner import RunDirError, RunInterrupted, run_plan
from losslab.runner.lock import RunDirLocked, acquire
from losslab.runner.rundir import RunDir

from ._fake_components import factory, write_fake_plan
from ._fake_components import final_state as _final_state

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO / 'tests'}"}


def _run(plan: Path, **kw):
    return run_plan(plan, quiet=True, components_factory=factory(), **kw)


def _log(run: Path) -> str:
    return (run / "run.log").read_text()


def _report(run: Path):
    result = CliRunner().invoke(app, ["report", str(run)])
    assert result.exit_code != EXIT_BUG and "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    return result


# --- one run per directory -------------------------------------------------------------------


def test_a_second_run_on_a_held_directory_is_refused_naming_the_holders_pid(
    plan: Path, tmp_path: Path, reference: dict
) -> None:
    run = tmp_path / "run"
    with pytest.raises(RunInterrupted):  # make a resumable dir: stop inside the pilot
        run_plan(plan, out=run, quiet=True, components_factory=factory(interrupt_at=2))
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from losslab.runner.lock import acquire; "
            "l = acquire(sys.argv[1]); print('held', flush=True); time.sleep(120)",
            str(run),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(
            RunDirLocked, match=rf"in use by another losslab run \(pid {holder.pid} "
        ):
            _run(plan, resume=run)
    finally:
        holder.kill()
        holder.wait(30)
    # the kernel dropped the killed holder's lock: the resume now goes through, unchanged numbers
    _run(plan, resume=run)
    assert _final_state(run) == reference


def test_the_lock_is_held_for_the_whole_run_and_released_after(plan: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    seen: list[str] = []

    def probe_factory(plan_file: Path, backend: str):
        comp = factory()(plan_file, backend)
        original = comp.preflight

        def preflight(ctx):
            try:
                acquire(run).release()
                seen.append("free")
            except RunDirLocked as e:
                seen.append(str(e))
            return original(ctx)

        comp.preflight = preflight
        return comp

    run_plan(plan, out=run, quiet=True, components_factory=probe_factory)
    assert len(seen) == 1 and f"pid {os.getpid()}" in seen[0]
    acquire(run).release()  # free once the run returned


# --- atomic creation and half-made directories -----------------------------------------------


def test_a_kill_while_creating_the_run_dir_leaves_no_half_made_dir(
    plan: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    script = (
        "import os, sys\n"
        "from pathlib import Path\n"
        "from losslab.runner.rundir import RunDir\n"
        "RunDir.write_manifest = lambda self, m: os.kill(os.getpid(), 9)  # killed after plan.json\n"
        "RunDir.create(Path(sys.argv[1]), Path(sys.argv[2]), backend='local', force=False)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, str(run), str(plan)], env=ENV, timeout=120)
    assert proc.returncode == -signal.SIGKILL
    assert not run.exists()  # only a hidden temp sibling may remain, never a half-made `run`
    assert len(list(tmp_path.glob(".run.creating-*"))) == 1
    _run(plan, out=run)  # and the same --out can be used right away; the leftover is removed
    assert (run / "verdict.json").is_file()
    assert not list(tmp_path.glob(".run.creating-*"))


def test_a_half_made_dir_with_only_this_plan_is_completed_by_resume(
    plan: Path, tmp_path: Path, reference: dict
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "plan.json").write_bytes(plan.read_bytes())  # what a pre-atomic kill left behind
    with pytest.raises(RunDirError, match="has no manifest.json .a run killed while creating it"):
        _run(plan, out=run)
    _run(plan, resume=run)
    assert _final_state(run) == reference


@pytest.mark.parametrize("extra", ["another plan", "other files"])
def test_a_half_made_dir_that_cannot_be_completed_is_reported(
    plan: Path, tmp_path: Path, extra: str
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    if extra == "another plan":
        (run / "plan.json").write_text('{"arms": ["x", "y"]}')
        words = "its plan.json is another plan"
    else:
        (run / "plan.json").write_bytes(plan.read_bytes())
        (run / "preflight.json").write_text("{}")
        words = "it also holds preflight.json"
    with pytest.raises(RunDirError, match=f"manifest.json is missing and {words}"):
        _run(plan, resume=run)


# --- damaged checkpoints and artifacts -------------------------------------------------------


def test_resume_falls_back_to_the_newest_intact_checkpoint_and_says_which(
    plan: Path, tmp_path: Path, reference: dict
) -> None:
    run = tmp_path / "run"
    with pytest.raises(RunInterrupted):  # treat's last step: checkpoints step_0002, step_0003
        run_plan(plan, out=run, quiet=True, components_factory=factory(interrupt_at=8))
    (run / "arms" / "treat" / "checkpoints" / "step_0003" / "trainer" / "s.pt").unlink()
    _run(plan, resume=run)
    log = _log(run)
    assert "treat: checkpoint step_0003 is damaged (" in log and "s.pt is missing" in log
    assert "treat: falling back to the newest intact one: checkpoint step_0002" in log
    assert _final_state(run) == reference


def test_an_altered_final_checkpoint_is_recomputed_before_evaluation(
    plan: Path, tmp_path: Path, reference: dict
) -> None:
    run = tmp_path / "run"
    _run(plan, out=run)
    weights = run / "arms" / "base" / "checkpoints" / "step_0004" / "trainer" / "s.pt"
    weights.write_bytes(weights.read_bytes()[:-7] + b"garbage")
    (run / "eval_base.jsonl").unlink()
    _run(plan, resume=run)
    log = _log(run)
    assert "step_0004 is damaged" in log and "differs from the sha256 recorded" in log
    assert "base: falling back to the newest intact one: checkpoint step_0003" in log
    assert _final_state(run) == reference


DAMAGE = {
    # file -> (new content, what a resume does: "recomputed" or the words of its refusal)
    "manifest.json": ('{"phases": ', "manifest.json is damaged: not valid JSON"),
    "manifest.json list": ("[]", "manifest.json is damaged: expected an object"),
    "manifest.json phases": ('{"phases": {"arms": 3}}', "phases.arms is not an object"),
    "eval_treat.jsonl": ('{"id": "item0"}\nnot json\n', "recomputed"),
    "verdict.json": ("\x00\x01", "recomputed"),
    "preflight.json": ("[]", "recomputed"),
    "pilot/gate.json": ('{"passed": tr', "recomputed"),
    "executed_config.json": ("[1, 2]", "recomputed"),
    "arms/base/checkpoints/step_0004/state.json": ('{"step": "four"}', "recomputed"),
    "arms/treat/metrics.jsonl": ('{"step": 0}\n[1]\n', "recomputed"),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_a_damaged_artifact_is_named_and_recomputed_or_refused(
    plan: Path, tmp_path: Path, case: str, reference: dict
) -> None:
    run = tmp_path / "run"
    _run(plan, out=run)
    rel = case.split(" ")[0]
    content, outcome = DAMAGE[case]
    (run / rel).write_text(content)
    if rel == "arms/base/checkpoints/step_0004/state.json":
        (run / "eval_base.jsonl").unlink()  # so that the final checkpoint is needed again
    report = _report(run)
    if outcome == "recomputed":
        _run(plan, resume=run)
        assert Path(rel).name in _log(run) and "damaged" in _log(run)
        assert _final_state(run) == reference
    else:
        with pytest.raises(RunDirError, match=outcome):
            _run(plan, resume=run)
        assert report.exit_code == 2 and rel in report.output
    assert "Traceback" not in _report(run).output


# --- read-only folder, full disk, bugs, signals ----------------------------------------------


def test_report_on_a_read_only_run_dir_says_so(
    plan: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    _run(plan, out=run)

    def refuse(path, *a, **k):
        raise PermissionError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr("losslab.report.build.atomic_write_json", refuse)
    r = _report(run)
    assert r.exit_code == 1
    assert f"cannot write {run / 'report.json'}: Read-only file system" in r.output
    assert "Copy the folder somewhere writable" in r.output


def test_a_full_disk_while_logging_is_one_message(
    plan: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from losslab.runner.progress import RunConsole

    def full(self, message, echo=True):
        raise OSError(errno.ENOSPC, "No space left on device", str(self.log_path))

    monkeypatch.setattr(RunConsole, "log", full)
    with pytest.raises(SystemExit) as exit_info:
        guarded(lambda: _run(plan, out=tmp_path / "run"))
    err = capsys.readouterr().err
    assert exit_info.value.code == 1 and "Traceback" not in err
    assert f"no space left on the device while writing {tmp_path / 'run' / 'run.log'}" in err
    assert "--resume" in err


def test_a_bug_names_the_crash_file_and_keeps_secrets_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    secret = "tml-secret-value-1234567890"
    monkeypatch.setenv("TINKER_API_KEY", secret)
    monkeypatch.setenv("LOSSLAB_CRASH_DIR", str(tmp_path / "crashes"))

    def buggy() -> None:
        raise ZeroDivisionError(f"oops {secret}")

    with pytest.raises(SystemExit) as exit_info:
        guarded(buggy, argv=["losslab", "run", "x.json"])
    err = capsys.readouterr().err
    assert exit_info.value.code == EXIT_BUG
    (crash,) = (tmp_path / "crashes").iterdir()
    assert (
        f"losslab hit a bug (ZeroDivisionError: oops ***); the details were written to {crash}"
        in err
    )
    text = crash.read_text()
    assert "Traceback" in text and "buggy" in text and "command: losslab run x.json" in text
    assert secret not in text and secret not in err


SIGTERM_SCRIPT = """
import sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[3])
from runner import _fake_components as fake
from losslab.cli_errors import guarded
from losslab.runner import run_plan

step = fake.FakeTrainer.step
def slow_step(self, i):
    time.sleep(0.4)
    return step(self, i)
fake.FakeTrainer.step = slow_step
guarded(lambda: run_plan(Path(sys.argv[1]), out=Path(sys.argv[2]), quiet=True,
                         components_factory=fake.factory()))
"""


def start_until_first_checkpoint(script: str, plan: Path, run: Path) -> subprocess.Popen:
    """`script` (argv: plan, run dir, tests folder) in a child Python, returned once the
    treatment arm's first checkpoint exists, so a signal sent now lands mid-run."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(plan), str(run), str(REPO / "tests")],
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    first = run / "arms" / "treat" / "checkpoints" / "step_0001"
    deadline = time.monotonic() + 120
    while not first.is_dir() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert first.is_dir(), "the run never reached its first checkpoint"
    return proc


def test_sigterm_is_handled_like_ctrl_c(plan: Path, tmp_path: Path, reference: dict) -> None:
    run = tmp_path / "run"
    proc = start_until_first_checkpoint(SIGTERM_SCRIPT, plan, run)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert time.monotonic() - t0 < 5  # acted on within a step, not at the end of the run
    assert proc.returncode == 143, err
    assert "Traceback" not in err and "terminated (SIGTERM). Continue with: " in err
    assert "terminated (SIGTERM); the run directory is resumable" in _log(run)
    _run(plan, resume=run)
    assert _final_state(run) == reference


# --- secrets ---------------------------------------------------------------------------------


def test_a_plan_holding_the_api_key_is_refused_and_never_copied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "tml-abcdefghijklmnopqrstuvwxyz"
    monkeypatch.setenv("TINKER_API_KEY", secret)
    plan = json.loads((REPO / "examples" / "gsm8k_dppo_vs_grpo.json").read_text())
    plan["command"] = f"TINKER_API_KEY={secret} losslab run plan.json"
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    r = CliRunner().invoke(app, ["plan", "check", str(path)])
    assert r.exit_code == 1 and "the plan contains the value of TINKER_API_KEY" in r.output
    assert secret not in r.output
    fake = write_fake_plan(tmp_path / "fake.json", note=secret)  # bypasses plan validation
    with pytest.raises(RunDirError, match="contains the value of TINKER_API_KEY"):
        RunDir.create(tmp_path / "run", fake, backend="local", force=False)
    assert not (tmp_path / "run").exists()
