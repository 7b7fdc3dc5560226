"""Checkpoint folders: atomic appearance, RNG round trip, pruning, and artifact writes."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from losslab.runner.checkpoint import (
    TMP_PREFIX,
    capture_rng,
    completed_steps,
    latest_checkpoint,
    prune_checkpoints,
    restore_rng,
    save_checkpoint,
)
from losslab.runner.rundir import dumps_json, write_json_artifact


def _draws() -> tuple[float, float, float]:
    return random.random(), float(np.random.rand()), float(torch.rand(()))


def test_rng_round_trip_reproduces_the_next_draws() -> None:
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    _draws()  # move away from the seeded state
    state = json.loads(json.dumps(capture_rng()))  # must survive JSON (it lives in state.json)
    expected = _draws()
    _draws()
    restore_rng(state)
    assert _draws() == expected


def _save(tmp_path: Path, step: int, calls: list[Path]) -> Path:
    def save_trainer(folder: Path) -> dict:
        calls.append(folder)
        (folder / "w.bin").write_bytes(bytes([step]))
        return {"file": "w.bin"}

    return save_checkpoint(
        tmp_path,
        step,
        cursor={"next_step": step},
        metrics=[{"step": s} for s in range(step)],
        save_trainer=save_trainer,
    )


def test_save_then_latest_reads_it_back(tmp_path: Path) -> None:
    calls: list[Path] = []
    for step in (1, 2, 3):
        _save(tmp_path, step, calls)
    # the trainer wrote into a hidden temp folder that was then renamed into place
    assert all(c.parent.name.startswith(TMP_PREFIX) for c in calls)
    ck = latest_checkpoint(tmp_path)
    assert ck is not None and ck.step == 3 and ck.cursor == {"next_step": 3}
    assert ck.metrics == [{"step": 0}, {"step": 1}, {"step": 2}]
    assert (ck.trainer_dir / "w.bin").read_bytes() == b"\x03"


def test_half_written_checkpoint_is_ignored_and_removed(tmp_path: Path) -> None:
    _save(tmp_path, 1, [])
    partial = tmp_path / f"{TMP_PREFIX}0002"
    (partial / "trainer").mkdir(parents=True)  # a kill while the trainer was saving step 2
    ck = latest_checkpoint(tmp_path)
    assert ck is not None and ck.step == 1
    assert not partial.exists()


def test_prune_keeps_newest_and_protected(tmp_path: Path) -> None:
    for step in range(1, 6):
        _save(tmp_path, step, [])
    prune_checkpoints(tmp_path, keep_last=2, protect={2})
    assert completed_steps(tmp_path) == [2, 4, 5]


def test_atomic_json_leaves_no_temp_file_and_is_readable(tmp_path: Path) -> None:
    path = tmp_path / "a" / "x.json"
    write_json_artifact(path, {"b": 1.5, "a": float("nan")})
    assert json.loads(path.read_text()) == {"a": None, "b": 1.5}  # NaN is not JSON: null
    assert os.listdir(path.parent) == ["x.json"]
    assert path.stat().st_mode & 0o044  # group/other can read an artifact (not mkstemp's 0600)


def test_artifacts_are_never_redacted_and_one_holding_a_secret_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 25: redaction rewrote artifacts (TINKER_API_KEY=a turned sha256 digests into
    `d***m***ged`-like text). Artifacts keep their bytes; one that would hold a (redactable,
    >= 16 chars) key is not written, naming the variable and not the value."""
    from losslab.runner.rundir import SecretInArtifact, redact

    monkeypatch.setenv("TINKER_API_KEY", "a")  # too short to redact: text streams keep it too
    assert dumps_json({"backend": "local"}) == '{\n  "backend": "local"\n}\n'
    assert redact("backend local, sha a3f") == "backend local, sha a3f"
    key = "tml-abcdefghijklmnop"  # 20 chars >= REDACT_MIN_CHARS
    monkeypatch.setenv("TINKER_API_KEY", key)
    assert redact(f"key={key}") == "key=***"  # logs and crash files: redacted
    assert key in dumps_json({"note": f"key={key}"})  # the canonical text itself is unchanged
    with pytest.raises(SecretInArtifact, match="value of TINKER_API_KEY") as info:
        write_json_artifact(tmp_path / "x.json", {"note": f"key={key}"})
    assert key not in str(info.value)
    assert not (tmp_path / "x.json").exists()
