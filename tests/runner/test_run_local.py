"""`losslab run` on the real local backend with a tiny model: SIGKILL at several points, resume,
and compare with an uninterrupted run; a failed gate stops the CLI with the named check.

The plan is the user's GSM8K plan shrunk to seconds (tests/runner/_tiny_plan.py): the same
preflights, gate checks and decision rule, 2 arms x 2 rollout steps, 1 pilot step, 4 eval items.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from losslab.cli import app
from losslab.runner import run_plan

from ._tiny_plan import make_eos_biased_tiny_model, write_tiny_plan

ARMS = ("grpo_seed0", "dppo_seed0")
FINAL = "step_0002"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    model = make_eos_biased_tiny_model(root / "model")
    plan = write_tiny_plan(root / "plan.json", model)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the CLI subprocesses below (OMP_NUM_THREADS=1)
    try:
        run_plan(plan, out=root / "reference", quiet=True)  # uninterrupted
    finally:
        torch.set_num_threads(threads)
    return {"root": root, "model": model, "plan": plan, "reference": root / "reference"}


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "losslab.cli", *args]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _kill_when(cmd: list[str], marker: Path, timeout: float = 120.0) -> int | None:
    """Start `cmd`, SIGKILL it as soon as `marker` exists; returns its exit code (None if killed
    before it ended on its own)."""
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if marker.exists():
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return None
        if proc.poll() is not None:
            pytest.fail(
                f"run ended before {marker.name} appeared: {proc.stderr.read().decode()[-2000:]}"
            )
        time.sleep(0.02)
    proc.kill()
    pytest.fail(f"{marker} did not appear within {timeout} s")


def _final(run_dir: Path) -> dict:
    """Final LoRA weights, AdamW state, step counters, metrics (timings aside), eval, verdict."""
    out: dict = {}
    for arm in ARMS:
        ck = run_dir / "arms" / arm / "checkpoints" / FINAL / "trainer"
        adapter = load_file(str(ck / "adapter.safetensors"))
        opt = torch.load(ck / "optimizer.pt", weights_only=True)
        meta = json.loads((ck / "meta.json").read_text())
        rows = [json.loads(x) for x in (run_dir / "arms" / arm / "metrics.jsonl").open()]
        out[arm] = {
            "adapter": {k: v.tolist() for k, v in adapter.items()},
            "adam": {i: {k: v.tolist() for k, v in s.items()} for i, s in opt["state"].items()},
            "meta": {k: meta[k] for k in ("steps", "snapshots", "adam_params")},
            "metrics": [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows],
            "eval": (run_dir / f"eval_{arm}.jsonl").read_text(),
        }
    verdict = json.loads((run_dir / "verdict.json").read_text())
    out["verdict"] = {k: v for k, v in verdict.items()}
    return out


def test_reference_run_trains(tiny: dict[str, Path]) -> None:
    """Guard against a vacuous resume test: the weights moved away from LoRA's zero B init."""
    adapter = load_file(
        str(
            tiny["reference"]
            / "arms"
            / "dppo_seed0"
            / "checkpoints"
            / FINAL
            / "trainer"
            / "adapter.safetensors"
        )
    )
    assert any(float(v.abs().max()) > 0 for k, v in adapter.items() if "lora_B" in k)


def test_pilot_diagnostics_of_the_reference_run(tiny: dict[str, Path]) -> None:
    """The pilot phase writes its diagnostics and the alignment check; the report shows them."""
    run = tiny["reference"]
    plan = json.loads(tiny["plan"].read_text())
    diag = json.loads((run / "pilot" / "diagnostics.json").read_text())
    assert diag["available"] is True
    # the local backend's sampler and trainer are one model: no gap before any update
    assert diag["mismatch"]["abs_logprob_max"] < 1e-4
    assert diag["alignment"]["passed"] is True
    assert diag["groups"]["planned_group_size"] == plan["engine"]["group_size"]
    assert 1 <= diag["groups"]["effective_group_size_mean"] <= plan["engine"]["group_size"]
    treatment_seed = json.loads((run / "manifest.json").read_text())["schedule"]["seeds"][
        "dppo_seed0"
    ]
    assert diag["seeds"]["arm"] == diag["seeds"]["global_rngs"] == treatment_seed
    # the local client reports the seed it was created with
    assert diag["seeds"]["training_client"] == {
        "requested": treatment_seed,
        "reported": treatment_seed,
        "note": "reported by the client",
    }
    pilot = json.loads((run / "manifest.json").read_text())["phases"]["pilot"]
    assert [c["check"] for c in pilot["checks"]] == ["sampler_trainer_alignment"]
    html = (run / "report.html").read_text(encoding="utf-8")
    assert 'id="pilot-mismatch-vs-drift"' in html and 'id="pilot-groups"' in html
    # the gate's artifact names, beside each per-update gate metric, what made it act
    gate = json.loads((run / "pilot" / "gate.json").read_text())
    rows = {r["metric"]: r for r in diag["trust_region"]}
    assert gate["mismatch_vs_drift"]["dppo_masked_token_fraction"] == {
        k: rows["dppo_masked_token_fraction"][k]
        for k in ("mismatch_only", "mismatch_and_drift", "acted_because")
    }


def test_sigkill_at_several_points_then_resume_is_identical(
    tiny: dict[str, Path], tmp_path: Path
) -> None:
    run = tmp_path / "run"
    plan = str(tiny["plan"])
    # 0) Ctrl-C (SIGINT) during restoration: one message, exit 130, no traceback
    proc = subprocess.Popen(
        _cli("run", plan, "--out", str(run), "--quiet"),
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    while not (run / "preflight.json").exists() and proc.poll() is None:
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert f"Continue with: losslab run {plan} --backend local --resume {run}" in err
    assert "Traceback" not in err
    # 1) resumed, SIGKILLed right after the pilot's checkpoint (treatment arm, pilot phase)
    _kill_when(
        _cli("run", plan, "--resume", str(run), "--quiet"),
        run / "arms" / "dppo_seed0" / "checkpoints" / "step_0001" / "state.json",
    )
    # 2) resumed, killed once the baseline arm checkpointed its first step (mid-arm)
    _kill_when(
        _cli("run", plan, "--resume", str(run), "--quiet"),
        run / "arms" / "grpo_seed0" / "checkpoints" / "step_0001" / "state.json",
    )
    # 3) resumed, killed when the first arm's evaluation file appeared (mid-evaluation)
    _kill_when(_cli("run", plan, "--resume", str(run), "--quiet"), run / "eval_grpo_seed0.jsonl")
    assert not (run / "verdict.json").exists()
    # 4) resumed to the end (in this process: the CLI's exit and output are checked in
    #    test_cli_run.py, and a fourth interpreter start would only cost time)
    done = CliRunner().invoke(app, ["run", plan, "--resume", str(run), "--quiet"])
    assert done.exit_code == 0, done.output
    assert "verdict: " in done.output and str(run / "report.html") in done.output
    assert _final(run) == _final(tiny["reference"])
    manifest = json.loads((run / "manifest.json").read_text())
    assert len(manifest["resumed"]) == 4


def test_failed_gate_stops_the_cli_with_the_named_check(
    tiny: dict[str, Path], tmp_path: Path
) -> None:
    # a masked-token fraction >= 0.5 is impossible for this model (the pilot measures 0.0)
    plan = write_tiny_plan(tmp_path / "plan.json", tiny["model"], gate_min_mask=0.5)
    proc = subprocess.run(
        _cli("run", str(plan), "--out", str(tmp_path / "run"), "--quiet"),
        env=_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 3
    assert "Traceback" not in proc.stderr
    assert (
        "gate failed: check 'dppo_masked_token_fraction' measured 0, bound [0.5, 1]" in proc.stderr
    )
    gate = json.loads((tmp_path / "run" / "pilot" / "gate.json").read_text())
    assert gate["passed"] is False
    assert not (tmp_path / "run" / "arms" / "grpo_seed0").exists()


def test_resume_survives_a_deleted_adapter_in_the_final_checkpoint(
    tiny: dict[str, Path], tmp_path: Path
) -> None:
    import shutil

    run = tmp_path / "run"
    shutil.copytree(tiny["reference"], run)
    ck = run / "arms" / "dppo_seed0" / "checkpoints"
    (ck / FINAL / "trainer" / "adapter.safetensors").unlink()  # the damaged checkpoint
    (run / "eval_dppo_seed0.jsonl").unlink()  # so that the final weights are needed again
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the reference run
    try:
        run_plan(tiny["plan"], resume=run, quiet=True)
    finally:
        torch.set_num_threads(threads)
    log = (run / "run.log").read_text()
    assert f"dppo_seed0: checkpoint {FINAL} is damaged (" in log
    assert "adapter.safetensors is missing" in log
    assert "falling back to the newest intact one: checkpoint step_0001" in log
    assert _final(run) == _final(tiny["reference"])
