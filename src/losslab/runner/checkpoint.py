"""Per-step checkpoints: the whole state needed to continue an arm bit-for-bit after a kill.

A checkpoint is the folder `checkpoints/step_NNNN/` (NNNN = number of completed RL steps):

    state.json    step, data cursor, metrics rows so far, Python/NumPy/torch RNG states,
                  and whatever the trainer reported about its own saved state
    trainer/      what the trainer wrote: LoRA weights and optimizer state (local backend);
                  on Tinker the weights live on the service and state.json holds their path

It is built in a hidden temp folder `.tmp-step_NNNN.*` and renamed into place in one
`os.replace` (`losslab.atomic.atomic_dir`), so a folder named `step_NNNN` is always complete; a
kill mid-save leaves only a temp folder, removed on resume.
"""

from __future__ import annotations

import base64
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from losslab.atomic import as_disk_full, atomic_dir
from losslab.runner.rundir import confined, read_json, sha256_file, write_json_artifact

STEP_PREFIX = "step_"
TMP_PREFIX = ".tmp-step_"


@dataclass(frozen=True)
class Checkpoint:
    """A completed checkpoint read back from disk."""

    path: Path
    step: int  # completed RL steps
    cursor: dict[str, Any]  # the data cursor the trainer needs to draw the next batch
    metrics: list[dict[str, Any]]  # metrics rows of steps 0..step-1
    rng: dict[str, Any]
    trainer: dict[str, Any]  # the trainer's own description of its saved state

    @property
    def trainer_dir(self) -> Path:
        return self.path / "trainer"


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global RNGs (what a checkpoint captures)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def capture_rng() -> dict[str, Any]:
    """Python, NumPy and torch global RNG states as JSON-safe values."""
    py_version, py_state, py_gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_cached = np.random.get_state()
    return {
        "python": [py_version, list(py_state), py_gauss],
        "numpy": [np_name, np_keys.tolist(), int(np_pos), int(np_has_gauss), float(np_cached)],
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
    }


def restore_rng(rng: dict[str, Any]) -> None:
    """Inverse of `capture_rng`."""
    py_version, py_state, py_gauss = rng["python"]
    random.setstate((py_version, tuple(py_state), py_gauss))
    np_name, np_keys, np_pos, np_has_gauss, np_cached = rng["numpy"]
    np.random.set_state(
        (np_name, np.asarray(np_keys, dtype=np.uint32), np_pos, np_has_gauss, np_cached)
    )
    raw = np.frombuffer(base64.b64decode(rng["torch"]), dtype=np.uint8).copy()
    torch.set_rng_state(torch.from_numpy(raw))


def step_dir_name(step: int) -> str:
    return f"{STEP_PREFIX}{step:04d}"


def save_checkpoint(
    checkpoints_dir: Path,
    step: int,
    *,
    cursor: dict[str, Any],
    metrics: list[dict[str, Any]],
    save_trainer: Callable[[Path], dict[str, Any]],
) -> Path:
    """Write the checkpoint after `step` completed steps; returns its folder.

    `save_trainer(folder)` writes the trainer's weights and optimizer state into `folder` and
    returns a JSON-safe description (e.g. the Tinker state path), kept in state.json.
    """
    final = checkpoints_dir / step_dir_name(step)
    # an existing `final` is replaced: a resumed run recomputed this step; the new copy is identical
    with atomic_dir(final, prefix=f"{TMP_PREFIX}{step:04d}.") as tmp:
        (tmp / "trainer").mkdir()
        try:
            trainer_info = save_trainer(tmp / "trainer")
        except Exception as e:  # a full disk seen through safetensors / torch.save
            full = as_disk_full(e, tmp / "trainer")
            if full is None:
                raise
            raise full from e
        write_json_artifact(
            tmp / "state.json",
            {
                "step": step,
                "cursor": cursor,
                "metrics": metrics,
                "rng": capture_rng(),
                "trainer": trainer_info,
                "files": file_hashes(tmp / "trainer"),
            },
        )
    return final


def file_hashes(folder: Path) -> dict[str, str]:
    """sha256 of every file under `folder`, by path relative to it (what resume verifies)."""
    return {
        p.relative_to(folder).as_posix(): sha256_file(p)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


class DamagedCheckpoint(ValueError):
    """A checkpoint folder whose state.json or trainer files are missing or altered."""


_STATE_KEYS = {"step": int, "cursor": dict, "metrics": list, "rng": dict, "trainer": dict}


def _shape_problem(state: dict[str, Any]) -> str | None:
    """Why state.json's cursor, metrics or RNG states cannot be what `save_checkpoint` wrote
    (restoring them would crash or continue from the wrong place), else None."""
    cursor, step = state["cursor"], state["step"]
    # the data cursor is the step index (runner.trainer, the fake trainer of the tests)
    if "next_step" in cursor and (
        not isinstance(cursor["next_step"], int)
        or isinstance(cursor["next_step"], bool)
        or cursor["next_step"] != step
    ):
        return f"cursor.next_step is {cursor['next_step']!r}, expected {step} (the folder's step)"
    if len(state["metrics"]) != step or not all(isinstance(r, dict) for r in state["metrics"]):
        return f"'metrics' holds {len(state['metrics'])} rows for {step} steps"
    rng = state["rng"]
    python, numpy, torch_state = rng.get("python"), rng.get("numpy"), rng.get("torch")
    if not (isinstance(python, list) and len(python) == 3 and isinstance(python[1], list)):
        return "rng.python is not [version, state, gauss]"
    if not (isinstance(numpy, list) and len(numpy) == 5 and isinstance(numpy[1], list)):
        return "rng.numpy is not [name, keys, pos, has_gauss, cached]"
    if not isinstance(torch_state, str):
        return "rng.torch is not a base64 string"
    return None


def verify_checkpoint(path: Path) -> Checkpoint:
    """Read a checkpoint and check it whole: state.json's schema, its step against the folder
    name, and every trainer file against the sha256 recorded at save time.

    Raises:
        DamagedCheckpoint: naming the file that is missing, unreadable or altered.
    """
    state_path = path / "state.json"
    try:
        state = read_json(state_path)
    except FileNotFoundError:
        raise DamagedCheckpoint(f"{state_path} is missing") from None
    except (OSError, ValueError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise DamagedCheckpoint(f"{state_path} is not readable JSON ({e})") from None
    if not isinstance(state, dict):
        raise DamagedCheckpoint(f"{state_path} is not a JSON object")
    for key, kind in _STATE_KEYS.items():
        if not isinstance(state.get(key), kind) or isinstance(state.get(key), bool):
            raise DamagedCheckpoint(f"{state_path}: '{key}' is missing or not a {kind.__name__}")
    if step_dir_name(state["step"]) != path.name:
        raise DamagedCheckpoint(f"{state_path}: step {state['step']} does not match {path.name}")
    why = _shape_problem(state)
    if why is not None:
        raise DamagedCheckpoint(f"{state_path}: {why}")
    files = state.get("files")
    # mandatory: without it the sha256 check of the trainer files would be silently off
    if not isinstance(files, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in files.items()
    ):
        raise DamagedCheckpoint(
            f"{state_path}: 'files' (the sha256 of each trainer file) is missing or not an "
            "object of strings"
        )
    trainer = path / "trainer"
    if not trainer.is_dir() or trainer.is_symlink():
        raise DamagedCheckpoint(f"{trainer} is missing or not a folder")
    on_disk = file_hashes(trainer)
    for rel, digest in sorted(files.items()):
        file = trainer / rel
        if rel not in on_disk:
            raise DamagedCheckpoint(f"{file} is missing")
        if on_disk[rel] != digest:
            raise DamagedCheckpoint(f"{file} differs from the sha256 recorded when it was saved")
    extra = sorted(set(on_disk) - set(files))
    if extra:
        raise DamagedCheckpoint(f"{trainer / extra[0]} was not there when the checkpoint was saved")
    return Checkpoint(
        path=path,
        step=state["step"],
        cursor=state["cursor"],
        metrics=state["metrics"],
        rng=state["rng"],
        trainer=state["trainer"],
    )


def load_checkpoint(path: Path) -> Checkpoint:
    """A checkpoint read back and verified (`verify_checkpoint`)."""
    return verify_checkpoint(path)


def completed_steps(checkpoints_dir: Path) -> list[int]:
    if not checkpoints_dir.is_dir():
        return []
    steps = []
    for p in checkpoints_dir.iterdir():
        digits = p.name[len(STEP_PREFIX) :]
        if p.is_dir() and p.name.startswith(STEP_PREFIX) and digits.isdigit():
            steps.append(int(digits))  # intact or not: newest_intact_checkpoint verifies
    return sorted(steps)


def latest_checkpoint(checkpoints_dir: Path) -> Checkpoint | None:
    """The newest intact checkpoint (see `newest_intact_checkpoint`), damaged ones skipped."""
    return newest_intact_checkpoint(checkpoints_dir)[0]


def newest_intact_checkpoint(
    checkpoints_dir: Path,
) -> tuple[Checkpoint | None, list[tuple[Path, str]]]:
    """The checkpoint with the most completed steps that passes `verify_checkpoint`, and each
    newer one that did not, with why (after removing half-written temp folders).

    Why fall back: `prune_checkpoints` keeps the previous checkpoint exactly so that a damaged
    newest one (a deleted adapter file, a bad disk write) costs one recomputed step, not the run.
    """
    if checkpoints_dir.is_dir():
        for p in checkpoints_dir.glob(f"{TMP_PREFIX}*"):
            remove_checkpoint_dir(checkpoints_dir, p)
    damaged: list[tuple[Path, str]] = []
    for step in reversed(completed_steps(checkpoints_dir)):
        path = checkpoints_dir / step_dir_name(step)
        try:
            return verify_checkpoint(path), damaged
        except DamagedCheckpoint as e:
            damaged.append((path, str(e)))
    return None, damaged


def prune_checkpoints(checkpoints_dir: Path, keep_last: int, protect: set[int]) -> None:
    """Delete all but the newest `keep_last` checkpoints, never those in `protect`.

    Why keep more than one: the newest is what resume needs; `protect` keeps milestones the
    report or the treatment arm read (the pilot's last step, the final step).
    """
    steps = completed_steps(checkpoints_dir)
    for s in steps[:-keep_last] if keep_last > 0 else steps:
        if s not in protect:
            remove_checkpoint_dir(checkpoints_dir, checkpoints_dir / step_dir_name(s))


def remove_checkpoint_dir(checkpoints_dir: Path, path: Path) -> None:
    """Delete one checkpoint (or temp) folder of `checkpoints_dir`, never anything outside it:
    a symlink is unlinked (its target kept), and a folder is deleted only while it resolves
    inside `checkpoints_dir` (`rundir.confined`; `shutil.rmtree` itself never follows links)."""
    if path.is_symlink():
        path.unlink()
        return
    shutil.rmtree(confined(checkpoints_dir, path), ignore_errors=True)
