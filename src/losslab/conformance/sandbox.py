"""Run a reference in a separate, network-less Python process and read back its result.

Both ways losslab executes someone else's loss code use it: `pinned.run_pinned` (source extracted
from a git commit, run by `pinned_runner.py`) and the TRL adapter (an installed release run by its
own interpreter). The child gets a scratch HOME, one OpenMP thread, no proxy, and only the PATH of
this process; it reads `input.json` and writes `output.json` in a temporary folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from losslab.conformance.fixtures import Fixture

INFERRED_BLOCKED_NOTE = (
    "clip/mask token sets inferred from exact-zero gradients on loss tokens with A != 0"
)
"""The note of every executed reference whose clipped/masked tokens are read off its gradient."""


def run_isolated(
    command: Callable[[Path, Path], list[str]],
    payload: Mapping[str, Any],
    *,
    timeout_s: float,
    fail: Callable[[str], Exception],
    who: str,
    action: str,
    prefix: str,
    extra_env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """`payload` -> input.json, run `command(input, output)`, return output.json's object.

    Errors are `fail(message)`: `who` ran past `timeout_s` ("... ran past 120 s and was
    stopped"), or `action` failed with the exit code and the last 8 lines of its stderr."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        inp, out = Path(tmp) / "input.json", Path(tmp) / "output.json"
        inp.write_text(json.dumps(payload), encoding="utf-8")
        env = {
            "PATH": os.environ.get("PATH", ""),
            "OMP_NUM_THREADS": "1",
            "HOME": tmp,
            "NO_PROXY": "*",
            "no_proxy": "*",
            **(extra_env or {}),
        }
        try:
            proc = subprocess.run(
                command(inp, out),
                capture_output=True,
                timeout=timeout_s,
                cwd=tmp,
                env=env,
                check=False,
            )
        except subprocess.TimeoutExpired as err:
            raise fail(f"{who} ran past {timeout_s:.0f} s and was stopped") from err
        if proc.returncode != 0 or not out.exists():
            tail = proc.stderr.decode(errors="replace").strip().splitlines()[-8:]
            raise fail(f"{action} failed (exit {proc.returncode}):\n  " + "\n  ".join(tail))
        return json.loads(out.read_text(encoding="utf-8"))


def blocked_from_gradients(fixture: Fixture, grad_D: list[np.ndarray]) -> list[np.ndarray]:
    """Per sequence: the loss tokens with A != 0 whose gradient is exactly zero, i.e. the ones
    the reference clipped or masked (`INFERRED_BLOCKED_NOTE`)."""
    return [
        (g == 0) & (seq.loss_mask != 0) & (seq.advantages != 0)
        for seq, g in zip(fixture.sequences, grad_D, strict=True)
    ]
