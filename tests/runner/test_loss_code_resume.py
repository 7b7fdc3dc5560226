"""`--resume` refuses a run whose loss code changed: the manifest keeps each code loss's sha256.

End to end: `run_plan` builds the arms' losses before it opens the run directory and hands
their code provenance (`UserLossFn.code`) to it; a resume with the file edited is exit 2 naming
the file, before the directory is touched.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from losslab.runner.errors import ResumeRefused
from losslab.runner.rundir import RunDir, read_json

ROOT = Path(__file__).resolve().parents[2]
PLAN = ROOT / "examples" / "arithmetic_dppo_vs_grpo_local.json"
USER_FILE = ROOT / "examples" / "my_dppo_loss.py"


def _code_plan(tmp_path: Path) -> Path:
    shutil.copy(USER_FILE, tmp_path / "my_dppo_loss.py")
    plan = json.loads(PLAN.read_text())
    plan["arms"][1]["loss"] = "my_dppo_loss.py::dppo_loss(delta=0.15, cap=10.0)"
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    return path


def _loss_code(plan_file: Path) -> dict:
    from losslab.runner.components import DefaultComponents

    comp = DefaultComponents(plan_file, "local")
    return {a: dict(fn.code) for a, fn in comp.losses.items() if getattr(fn, "code", None)}


def test_resume_refuses_a_changed_loss_file(tmp_path: Path) -> None:
    plan = _code_plan(tmp_path)
    code = _loss_code(plan)
    assert set(code) == {"dppo_seed0"} and code["dppo_seed0"]["signature"] == "tinker"
    run = RunDir.create(tmp_path / "run", plan, backend="local", force=False, loss_code=code)
    run.release()
    manifest = read_json(tmp_path / "run" / "manifest.json")
    assert manifest["loss_code"]["dppo_seed0"]["sha256"] == code["dppo_seed0"]["sha256"]

    # the same bytes: resumable
    RunDir.open_for_resume(
        tmp_path / "run", plan, backend="local", force=False, loss_code=_loss_code(plan)
    ).release()

    # one edit to the loss file: refused, naming the file, and the manifest left as it was
    user = tmp_path / "my_dppo_loss.py"
    user.write_text(user.read_text().replace("diff > delta", "diff > 0.2"))
    before = (tmp_path / "run" / "manifest.json").read_text()
    with pytest.raises(ResumeRefused, match="changed since the run started") as err:
        RunDir.open_for_resume(
            tmp_path / "run", plan, backend="local", force=False, loss_code=_loss_code(plan)
        )
    assert str(user) in str(err.value) and err.value.exit_code == 2
    assert (tmp_path / "run" / "manifest.json").read_text() == before


def test_run_plan_records_the_code_and_refuses_the_changed_file_on_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through `run_plan`: the run stops at its first phase (a fake one) so nothing trains."""
    from losslab.runner import run as run_module
    from losslab.runner.errors import RunError

    plan = _code_plan(tmp_path)

    def stop(run: RunDir, *args: object, **kwargs: object) -> None:
        run.release()  # what `_run_in` does on every way out
        raise RunError("stopped by the test after the run directory was made")

    monkeypatch.setattr(run_module, "_run_in", stop)
    with pytest.raises(RunError, match="stopped by the test"):
        run_module.run_plan(plan, backend="local", out=tmp_path / "run")
    manifest = read_json(tmp_path / "run" / "manifest.json")
    assert manifest["loss_code"]["dppo_seed0"]["file"] == str(tmp_path / "my_dppo_loss.py")
    (tmp_path / "my_dppo_loss.py").write_text(USER_FILE.read_text() + "\n# edited\n")
    with pytest.raises(ResumeRefused, match="my_dppo_loss.py"):
        run_module.run_plan(plan, backend="local", resume=tmp_path / "run")
