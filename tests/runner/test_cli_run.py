"""`losslab run` / `losslab report` on bad input: one clear message, an exit code, no traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from losslab.cli import app

REPO = Path(__file__).resolve().parents[2]
GSM8K_PLAN = REPO / "examples" / "gsm8k_dppo_vs_grpo.json"


def _invoke(*args: str):
    result = CliRunner().invoke(app, list(args))
    # no exception escaped the command (typer would show a traceback for one)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def test_missing_plan_file(tmp_path: Path) -> None:
    r = _invoke("run", str(tmp_path / "nope.json"), "--out", str(tmp_path / "run"))
    assert r.exit_code == 1
    assert f"plan file {tmp_path / 'nope.json'} does not exist" in r.output
    assert not (tmp_path / "run").exists()


def test_a_plan_that_is_a_fifo_or_a_device_is_refused_as_not_a_regular_file(
    tmp_path: Path,
) -> None:
    """Issue 25: `run` asked `is_file()` first and called a FIFO or /dev/zero "does not exist"
    (exit 1); the plan reader (losslab.plan.files) now names what it is, without opening a FIFO
    for reading (that would block) or reading /dev/zero (that never ends): exit 2."""
    import os

    fifo = tmp_path / "plan.fifo"
    os.mkfifo(fifo)
    device = tmp_path / "plan.json"
    device.symlink_to("/dev/zero")
    for path, kind in ((fifo, "a FIFO (named pipe)"), (device, "a character device")):
        r = _invoke("run", str(path), "--out", str(tmp_path / "run"))
        assert r.exit_code == 2, r.output
        assert f"plan file {str(path)!r} is {kind}, not a regular file" in r.output
        assert "does not exist" not in r.output
        assert not (tmp_path / "run").exists()


def test_malformed_plan_json(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"title": "x", ')
    r = _invoke("run", str(bad), "--out", str(tmp_path / "run"))
    assert r.exit_code == 2
    assert "is not valid" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "run").exists()  # nothing is written for a plan that fails to load


@pytest.mark.parametrize("feature", ["custom_optimizer", "learned_generator"])
def test_unimplemented_feature_is_refused_up_front(tmp_path: Path, feature: str) -> None:
    plan = json.loads(GSM8K_PLAN.read_text())
    plan["experiment_features"][feature] = True
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    r = _invoke("run", str(path), "--out", str(tmp_path / "run"))
    assert r.exit_code == 2
    assert f"experiment_features.{feature}" in r.output
    assert not (tmp_path / "run").exists()


def test_unknown_backend(tmp_path: Path) -> None:
    r = _invoke("run", str(GSM8K_PLAN), "--backend", "gpu")
    assert r.exit_code == 2 and "--backend 'gpu': expected one of 'local', 'tinker'" in r.output


def test_plan_backend_hint_is_checked(tmp_path: Path) -> None:
    plan = json.loads(GSM8K_PLAN.read_text())
    plan.setdefault("engine", {})["backend"] = "gpu"
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    r = _invoke("run", str(path), "--out", str(tmp_path / "run"))
    assert r.exit_code == 2
    # refused by plan validation (backends.registry), before the run builds anything
    assert "engine.backend: 'gpu' is not a backend; expected one of 'local', 'tinker'" in r.output
    assert not (tmp_path / "run").exists()


def test_out_and_resume_together(tmp_path: Path) -> None:
    r = _invoke("run", str(GSM8K_PLAN), "--out", "a", "--resume", "b")
    assert r.exit_code == 2 and "either --out" in r.output


def test_resume_of_a_folder_that_is_not_a_run(tmp_path: Path) -> None:
    (tmp_path / "junk").mkdir()
    r = _invoke("run", str(GSM8K_PLAN), "--resume", str(tmp_path / "junk"))
    assert r.exit_code == 2
    assert "is not a losslab run directory: manifest.json is missing" in r.output


def test_tinker_backend_without_key_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    # the correctness preflight runs locally; the restoration preflight is the first backend call
    r = _invoke("run", str(GSM8K_PLAN), "--backend", "tinker", "--out", str(tmp_path / "run"), "-q")
    assert r.exit_code == 4, r.output
    assert "backend 'tinker' is not available" in r.output and "TINKER_API_KEY" in r.output
    # the run directory stays resumable: the finished phase is recorded, nothing half-written
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["phases"]["preflight"]["status"] == "done"


def test_report_of_a_folder_that_is_not_a_run(tmp_path: Path) -> None:
    r = _invoke("report", str(tmp_path))
    assert r.exit_code == 2 and "no manifest.json" in r.output


def test_report_rebuilds_from_a_run_directory(tmp_path: Path) -> None:
    from losslab.runner import run_plan

    from ._fake_components import factory, write_fake_plan

    plan = write_fake_plan(tmp_path / "plan.json")
    run_plan(plan, out=tmp_path / "run", quiet=True, components_factory=factory())
    (tmp_path / "run" / "report.html").unlink()
    r = _invoke("report", str(tmp_path / "run"))
    assert r.exit_code == 0
    assert f"report: {(tmp_path / 'run' / 'report.html').resolve()}" in r.output
    assert "Verdict: " in (tmp_path / "run" / "report.html").read_text()


def test_tinker_clients_are_created_with_the_arms_adam_params() -> None:
    # The executed-config check reads optimizer_config() before the first step; the Tinker
    # wrapper reports the AdamParams it was created with, so they must be passed on creation
    # (found against a real Tinker-API server: lr 1e-4, the SDK default, instead of the plan's).
    from losslab.runner.components import DefaultComponents

    calls = []

    class Service:
        def create_lora_training_client(self, base_model, **kwargs):
            calls.append((base_model, kwargs))

            class Done:
                def result(self):
                    return "client"

            return Done()

    comp = DefaultComponents(REPO / "examples" / "gsm8k_dppo_vs_grpo.json", "tinker")
    comp.__dict__["service"] = Service()  # the cached_property, without a key or network
    arm = comp.plan.arms[0]
    assert comp._create_client(arm.name) == "client"
    ((base_model, kwargs),) = calls
    assert base_model == comp.plan.base_model
    assert kwargs["adam_params"].learning_rate == comp.plan.adam_config(arm)["learning_rate"]


def test_missing_tracker_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    r = _invoke("run", str(GSM8K_PLAN), "--out", str(tmp_path / "run"), "--tracker", "wandb")
    assert r.exit_code == 1
    assert "--tracker wandb: the wandb package is not installed" in r.output
    assert not (tmp_path / "run").exists()
