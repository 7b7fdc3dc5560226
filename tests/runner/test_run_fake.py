"""The runner's phases, artifacts, stops and resume, driven by a fake `Components` (fast).

The fake trains a tiny torch model whose batches come from the global RNG (tests/runner/
_fake_components.py), so "identical after resume" below means weights, optimizer state, RNG and
data cursor were all restored exactly.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from losslab.runner import CheckFailed, ResumeRefused, RunDirError, RunInterrupted, run_plan
from losslab.runner import rundir as rundir_mod
from losslab.runner.checkpoint import completed_steps
from losslab.runner.errors import DiskFull

from ._fake_components import factory, write_fake_plan
from ._fake_components import final_state as _final_state

ARTIFACTS = [
    "manifest.json",
    "plan.json",
    "preflight.json",
    "restoration.json",
    "pilot/gate.json",
    "feasibility.json",
    "executed_config.json",
    "arms/base/metrics.jsonl",
    "arms/treat/metrics.jsonl",
    "eval_base.jsonl",
    "eval_treat.jsonl",
    "generation_audit.json",
    "verdict.json",
    "report.json",
    "report.html",
    "run.log",
]


def test_complete_run_writes_every_artifact(plan: Path, tmp_path: Path) -> None:
    made = []
    result = run_plan(
        plan, out=tmp_path / "run", quiet=True, components_factory=factory(record=made)
    )
    run = tmp_path / "run"
    for rel in ARTIFACTS:
        assert (run / rel).is_file(), rel
    manifest = json.loads((run / "manifest.json").read_text())
    assert {p: v["status"] for p, v in manifest["phases"].items()} == {
        p: "done"
        for p in (
            "preflight",
            "restoration",
            "pilot",
            "feasibility",
            "gate",
            "arms",
            "evaluation",
            "audit",
            "decision",
            "report",
        )
    }
    # pilot (2 steps of treat) + 2 remaining treat steps + 4 base steps: the pilot is reused
    assert made[0].calls["steps"] == 8
    assert result.verdict == json.loads((run / "verdict.json").read_text())
    assert result.report_html == run / "report.html"
    # only the newest two checkpoints are kept, and they are the last two steps
    assert completed_steps(run / "arms" / "treat" / "checkpoints") == [3, 4]
    assert manifest["plan_sha256"] == rundir_mod.sha256_file(plan)


# Kill points: k-th training step call (1..8). Pilot = calls 1-2 (treat steps 0-1), then base
# steps 0-3 (calls 3-6), then treat steps 2-3 (calls 7-8). Every kill lands inside a step.
@pytest.mark.parametrize("interrupt_at", [1, 2, 4, 7, 8])
def test_resume_after_ctrl_c_matches_uninterrupted_run(
    plan: Path, tmp_path: Path, interrupt_at: int, reference: dict
) -> None:
    with pytest.raises(RunInterrupted, match="--resume"):
        run_plan(
            plan,
            out=tmp_path / "run",
            quiet=True,
            components_factory=factory(interrupt_at=interrupt_at),
        )
    assert not (tmp_path / "run" / "verdict.json").exists()
    made = []
    run_plan(plan, resume=tmp_path / "run", quiet=True, components_factory=factory(record=made))
    assert _final_state(tmp_path / "run") == reference
    # the resumed run redid only the interrupted step and what followed it
    assert made[0].calls["steps"] == 8 - (interrupt_at - 1)
    assert made[0].calls["preflight"] == 0


def test_resume_of_finished_run_redoes_nothing(plan: Path, tmp_path: Path) -> None:
    run_plan(plan, out=tmp_path / "run", quiet=True, components_factory=factory())
    made = []
    run_plan(plan, resume=tmp_path / "run", quiet=True, components_factory=factory(record=made))
    assert made[0].calls == {"steps": 0, "preflight": 0, "evaluate": 0}


def test_failed_gate_stops_naming_check_measured_and_bound(tmp_path: Path) -> None:
    plan = write_fake_plan(tmp_path / "plan.json", gate_min=0.5)
    with pytest.raises(CheckFailed) as e:
        run_plan(plan, out=tmp_path / "run", quiet=True, components_factory=factory())
    # the fake's mask fraction is 0.05 every step, so the pilot mean is 0.05 < 0.5
    msg = str(e.value)
    assert "gate" in msg and "dppo_masked_token_fraction" in msg
    assert "0.05" in msg and ">= 0.5" in msg and "pilot/gate.json" in msg
    run = tmp_path / "run"
    assert not (run / "arms" / "base").exists()  # the arms never started
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["phases"]["gate"]["status"] == "failed"
    html = (run / "report.html").read_text()
    assert "Stopped at gate" in html and "dppo_masked_token_fraction" in html


def test_force_continues_past_failed_gate_and_report_says_so(tmp_path: Path) -> None:
    plan = write_fake_plan(tmp_path / "plan.json", gate_min=0.5)
    result = run_plan(
        plan, out=tmp_path / "run", quiet=True, force=True, components_factory=factory()
    )
    assert result.verdict is not None
    facts = json.loads((tmp_path / "run" / "report.json").read_text())
    assert facts["status"]["forced"][0]["phase"] == "gate"
    html = (tmp_path / "run" / "report.html").read_text()
    assert "--force overrode a failed check in gate" in html
    # the failed row itself says it was overridden, in gate.json and in the report's table
    (row,) = json.loads((tmp_path / "run" / "pilot" / "gate.json").read_text())["failures"]
    assert row["check"] == "dppo_masked_token_fraction" and row["overridden"] is True
    assert "overridden by --force" in html


def test_failed_preflight_stops_before_training(tmp_path: Path) -> None:
    plan = write_fake_plan(tmp_path / "plan.json", preflight_pass=False)
    with pytest.raises(
        CheckFailed,
        match=r"preflight failed: check 'loss.max_abs_error' measured 0.5, bound <= 1e-05",
    ):
        run_plan(plan, out=tmp_path / "run", quiet=True, components_factory=factory())
    assert not (tmp_path / "run" / "arms").exists()


def test_resume_with_force_continues_a_stopped_run(tmp_path: Path) -> None:
    plan = write_fake_plan(tmp_path / "plan.json", gate_min=0.5)
    with pytest.raises(CheckFailed):
        run_plan(plan, out=tmp_path / "run", quiet=True, components_factory=factory())
    made = []
    run_plan(
        plan,
        resume=tmp_path / "run",
        quiet=True,
        force=True,
        components_factory=factory(record=made),
    )
    assert made[0].calls["steps"] == 6  # the pilot's 2 steps were kept
    assert (
        json.loads((tmp_path / "run" / "manifest.json").read_text())["phases"]["gate"]["status"]
        == "forced"
    )


def test_executed_config_mismatch_stops(tmp_path: Path) -> None:
    plan = write_fake_plan(tmp_path / "plan.json", executed_model="other-model")
    with pytest.raises(
        CheckFailed, match=r"check 'treat.base_model' measured 'other-model', bound == 'fake-model'"
    ):
        run_plan(plan, out=tmp_path / "run", quiet=True, components_factory=factory())
    recorded = json.loads((tmp_path / "run" / "executed_config.json").read_text())
    assert recorded["treat"]["base_model"]["match"] is False


def test_resume_refuses_another_plan(plan: Path, tmp_path: Path) -> None:
    run_plan(plan, out=tmp_path / "run", quiet=True, components_factory=factory())
    other = write_fake_plan(tmp_path / "other.json", steps=5)
    with pytest.raises(ResumeRefused, match="another plan"):
        run_plan(other, resume=tmp_path / "run", quiet=True, components_factory=factory())


def test_resume_refuses_another_losslab_version(
    plan: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_plan(plan, out=tmp_path / "run", quiet=True, components_factory=factory())
    monkeypatch.setattr(rundir_mod, "__version__", "99.0.0")
    with pytest.raises(ResumeRefused, match=r"losslab 0\.1\.0, this is losslab 99\.0\.0"):
        run_plan(plan, resume=tmp_path / "run", quiet=True, components_factory=factory())


def test_resume_refuses_another_backend(plan: Path, tmp_path: Path) -> None:
    run_plan(plan, out=tmp_path / "run", quiet=True, components_factory=factory())
    with pytest.raises(ResumeRefused, match="--backend local, not tinker"):
        run_plan(
            plan,
            resume=tmp_path / "run",
            backend="tinker",
            quiet=True,
            components_factory=factory(),
        )


def test_out_must_be_new_or_empty(plan: Path, tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "x").write_text("keep me")
    with pytest.raises(RunDirError, match="not empty"):
        run_plan(plan, out=tmp_path / "run", quiet=True, components_factory=factory())


def test_disk_full_gives_resume_hint_and_run_resumes(
    plan: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reference: dict
) -> None:
    from losslab.runner import checkpoint as ck_mod

    real = ck_mod.save_checkpoint
    calls = {"n": 0}

    def full_disk(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(errno.ENOSPC, "No space left on device", "step_0003")
        return real(*args, **kwargs)

    monkeypatch.setattr("losslab.runner.run.save_checkpoint", full_disk)
    with pytest.raises(
        DiskFull, match=r"no space left on the device while writing step_0003.*--resume"
    ):
        run_plan(plan, out=tmp_path / "run", quiet=True, components_factory=factory())
    monkeypatch.setattr("losslab.runner.run.save_checkpoint", real)
    run_plan(plan, resume=tmp_path / "run", quiet=True, components_factory=factory())
    assert _final_state(tmp_path / "run") == reference


def test_secrets_never_reach_the_log(
    plan: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TINKER_API_KEY", "tml-secret-value-123")
    made = []

    def leaky(plan_file: Path, backend: str):
        comp = factory(record=made)(plan_file, backend)
        comp.environment = lambda: {"note": "key tml-secret-value-123"}  # a careless component
        return comp

    # artifacts are never redacted (issue 25): one that would carry the key is refused instead
    with pytest.raises(RunDirError, match=r"manifest.json: it would contain the value of TINKER"):
        run_plan(plan, out=tmp_path / "run", quiet=True, components_factory=leaky)
    for f in (tmp_path / "run").rglob("*"):
        if f.is_file():
            assert b"tml-secret-value-123" not in f.read_bytes(), f


def test_progress_bars_mode_runs_and_prints_the_verdict(
    plan: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("losslab.runner.progress.stdout_is_terminal", lambda: True)
    run_plan(plan, out=tmp_path / "run", quiet=False, components_factory=factory())
    out, err = capsys.readouterr()
    assert "treat step 4/4" not in out + err  # on a terminal the bars show the steps
    assert "verdict: " in err and f"report: {(tmp_path / 'run' / 'report.html').resolve()}" in err
    # per-step lines go to run.log in bar mode (the bars show them on screen)
    log = (tmp_path / "run" / "run.log").read_text()
    assert "treat step 4/4" in log and "base step 1/4" in log


def test_not_a_terminal_prints_one_line_per_step_and_phase_on_stdout(
    plan: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`make demo | cat`: stdout is a pipe, so no bars, and every run.log line reaches stdout."""
    run_plan(plan, out=tmp_path / "run", quiet=False, components_factory=factory())
    out = capsys.readouterr().out
    # the pilot is treat's first 2 steps (of 2), then treat continues with steps 3 and 4 of 4
    expected = ["treat step 1/2 ", "treat step 2/2 ", "treat step 3/4 ", "treat step 4/4 "]
    expected += [f"base step {k}/4 " for k in range(1, 5)]
    for line in expected:
        assert line in out, line
    for phase in ("preflight", "pilot", "arms", "evaluation", "decision", "report"):
        assert f"[{phase}] start" in out and f"[{phase}] end after" in out, phase
    log = (tmp_path / "run" / "run.log").read_text().splitlines()
    # the same messages as run.log, minus its UTC stamp
    assert [line.split(" ", 1)[1] for line in log] == [x for x in out.splitlines() if x][: len(log)]
