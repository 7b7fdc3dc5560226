"""The damaged-run-dir matrix (issue 25, failure 5): every file of a completed run x truncate /
delete / corrupt / symlink, then `losslab report` and `losslab run --resume`.

Before: an eval file cut to 5 rows was kept and the report showed n = 5 beside a 24-item verdict
(exit 0); deleting the `files` key of a checkpoint's state.json switched its sha256 check off; an
eval file cut mid-write crashed every resume.

Each case must give:
* no exit other than 0 or 2 (never 70, a bug), no traceback;
* `report` on the damaged directory: exit 2 naming the file whenever the file is one the report
  reads (the manifest's ledger of artifacts, manifest.json, plan.json) or a symlink;
* `--resume`: exit 2 naming the file (or the directory), or exit 0 having recomputed the damage:
  the final numbers equal an undisturbed run's, every final checkpoint verifies, and the report
  afterwards is exit 0 (the ledger matches again).
Anything else counts as a silent acceptance. Both counts must be 0.

Not judged as silent: a damaged *older* checkpoint (`step_0003`) of a completed run, which no
command reads (it is verified, and skipped if damaged, only when a resume falls back to it).
One completed fake run is built per module and copied for each case.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from losslab.cli import app
from losslab.cli_errors import guarded
from losslab.runner import run_plan
from losslab.runner.checkpoint import step_dir_name, verify_checkpoint

from ._fake_components import factory, final_state, write_fake_plan

DAMAGES = ("truncate", "delete", "corrupt", "symlink")
UNREAD_BY_COMPLETED_RUN = ("/step_0003/",)


@pytest.fixture(scope="module")
def completed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("completed")
    plan = write_fake_plan(base / "plan.json")
    run_plan(plan, out=base / "run", quiet=True, components_factory=factory())
    return plan, base / "run"


def _damage(path: Path, how: str, outside: Path) -> None:
    data = path.read_bytes()
    if how == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif how == "delete":
        path.unlink()
    elif how == "corrupt":  # ASCII, so a text file stays UTF-8: only the content can tell
        mid = len(data) // 2
        path.write_bytes(data[:mid] + b"00000000" + data[mid + 8 :])
    elif how == "symlink":  # the same bytes, but behind a link to a file that is not the run's
        outside.mkdir(parents=True, exist_ok=True)
        target = outside / path.name
        shutil.move(path, target)
        path.symlink_to(target)


def _code(fn) -> int:
    try:
        guarded(fn)
    except SystemExit as e:
        return int(e.code or 0)
    return 0


def _report(run: Path) -> tuple[int, str]:
    r = CliRunner().invoke(app, ["report", str(run)])
    assert "Traceback" not in r.output, r.output
    return r.exit_code, r.output


def _finals_verify(run: Path) -> bool:
    for arm in ("base", "treat"):
        try:
            verify_checkpoint(run / "arms" / arm / "checkpoints" / step_dir_name(4))
        except ValueError:
            return False
    return True


@pytest.mark.slow  # 100 cases, ~8 min on a shared 2-core machine (each: 2 reports, a resume)
def test_the_damaged_run_dir_matrix(
    completed: tuple[Path, Path], tmp_path: Path, reference: dict, capsys: pytest.CaptureFixture
) -> None:
    plan, run0 = completed
    manifest = json.loads((run0 / "manifest.json").read_text())
    report_inputs = set(manifest["artifacts"]) | {"manifest.json", "plan.json"}
    files = sorted(
        p.relative_to(run0).as_posix() for p in run0.rglob("*") if p.is_file() and p.stat().st_size
    )
    assert len(files) >= 25  # every artifact, checkpoint file, log, report and the lock
    bugs, silent, cases = [], [], 0
    for rel in files:
        for how in DAMAGES:
            cases += 1
            case = tmp_path / f"c{cases}"
            run = case / "run"
            shutil.copytree(run0, run, symlinks=True)
            _damage(run / rel, how, case / "outside")
            what = f"{rel} x {how}"
            rep_code, rep_out = _report(run)
            if rep_code not in (0, 2):
                bugs.append(f"{what}: report exit {rep_code}")
            must_refuse = how == "symlink" or rel in report_inputs
            if must_refuse and rep_code == 0:
                silent.append(f"{what}: report exit 0 on a damaged input")
            code = _code(
                lambda run=run: run_plan(plan, resume=run, quiet=True, components_factory=factory())
            )
            err = capsys.readouterr().err
            if code not in (0, 2) or "Traceback" in err:
                bugs.append(f"{what}: resume exit {code}: {err[-300:]}")
                continue
            if code == 2:
                if str(run) not in err:
                    silent.append(f"{what}: resume exit 2 without naming the file: {err[-200:]}")
                continue
            if any(part in "/" + rel for part in UNREAD_BY_COMPLETED_RUN):
                continue
            if final_state(run) != reference:
                silent.append(f"{what}: resume exit 0 with other numbers")
            elif not _finals_verify(run):
                silent.append(f"{what}: resume exit 0 leaving a damaged final checkpoint")
            elif _report(run)[0] != 0:
                silent.append(f"{what}: resume exit 0 but the damage is still there")
    print(f"damaged-run-dir matrix: {cases} cases, {len(bugs)} exit 70, {len(silent)} silent")
    assert not bugs, "\n".join(bugs)
    assert not silent, "\n".join(silent)


def test_an_eval_file_cut_to_5_rows_is_refused_by_report_and_recomputed_on_resume(
    completed: tuple[Path, Path], tmp_path: Path, reference: dict
) -> None:
    """The issue's case: 40 rows cut to 5 whole rows (still valid JSON lines)."""
    plan, run0 = completed
    run = tmp_path / "run"
    shutil.copytree(run0, run)
    path = run / "eval_treat.jsonl"
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:5]))
    code, out = _report(run)
    assert code == 2 and "eval_treat.jsonl is damaged: it has 5 rows, manifest.json records 40" in (
        out.replace("\n", "")
    )
    run_plan(plan, resume=run, quiet=True, components_factory=factory())
    assert final_state(run) == reference
    assert "eval_treat.jsonl is damaged: it has 5 rows" in (run / "run.log").read_text()


def test_an_eval_file_cut_mid_line_is_recomputed_on_resume(
    completed: tuple[Path, Path], tmp_path: Path, reference: dict
) -> None:
    plan, run0 = completed
    run = tmp_path / "run"
    shutil.copytree(run0, run)
    path = run / "eval_base_model.jsonl"
    path.write_bytes(path.read_bytes()[:-25])  # the last row cut inside its JSON
    run_plan(plan, resume=run, quiet=True, components_factory=factory())
    assert final_state(run) == reference
    assert _report(run)[0] == 0


@pytest.mark.parametrize(
    "edit",
    [
        lambda s: s.pop("files"),
        lambda s: s.update(files="nope"),
        lambda s: s.update(cursor={"next_step": "four"}),
        lambda s: s.update(cursor={"next_step": 2}),
        lambda s: s.update(metrics=s["metrics"][:1]),
        lambda s: s["rng"].update(numpy="x"),
    ],
    ids=["no files", "files not an object", "cursor str", "cursor step", "metrics", "rng"],
)
def test_a_state_json_of_the_wrong_shape_falls_back_to_the_previous_checkpoint(
    completed: tuple[Path, Path], tmp_path: Path, reference: dict, edit
) -> None:
    """Before: deleting `files` switched the sha256 check off; a wrong-shape cursor crashed."""
    plan, run0 = completed
    run = tmp_path / "run"
    shutil.copytree(run0, run)
    state_path = run / "arms" / "treat" / "checkpoints" / step_dir_name(4) / "state.json"
    state = json.loads(state_path.read_text())
    edit(state)
    state_path.write_text(json.dumps(state))
    with pytest.raises(ValueError, match="state.json"):
        verify_checkpoint(state_path.parent)
    run_plan(plan, resume=run, quiet=True, components_factory=factory())
    log = (run / "run.log").read_text()
    assert "treat: checkpoint step_0004 is damaged" in log
    assert "falling back to the newest intact one: checkpoint step_0003" in log
    assert final_state(run) == reference and _finals_verify(run)
