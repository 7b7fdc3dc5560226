"""Checks of the process environment made when `losslab run` starts, before any file is written:
a secret too short to redact and a malformed timeout variable are refused naming the variable
(never its value), instead of failing later as a backend error or corrupting what is written;
and the record of where a run ran (`environment_record`, manifest.json's `environment`).
"""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
from typing import Any

import torch

from losslab.runner.errors import RunError
from losslab.runner.rundir import REDACT_MIN_CHARS

API_KEY_ENV = "TINKER_API_KEY"
VERSIONED = ("torch", "transformers", "peft", "tinker", "numpy", "scipy", "reasoning-gym")


class SecretTooShort(RunError):
    """A secret environment variable the run uses is too short to be redacted from its logs."""

    exit_code = 4


class BadEnvironmentSetting(RunError):
    """An environment variable losslab reads holds a value it cannot use."""

    exit_code = 2


def check_api_key(backend: str) -> None:
    """Refuse a set TINKER_API_KEY shorter than `REDACT_MIN_CHARS` on the tinker backend.

    Why: logs and crash files replace the key's value by `***`; a value of a few characters
    ("a") would also match ordinary text, so it can be neither redacted safely nor told apart
    from it. Real Tinker keys are far longer. A local run does not use the key and is not
    refused; its artifacts are never redacted, whatever the key (`rundir.redact`)."""
    if backend != "tinker":
        return
    value = os.environ.get(API_KEY_ENV, "").strip()
    if value and len(value) < REDACT_MIN_CHARS:
        raise SecretTooShort(
            f"{API_KEY_ENV} is set to a value shorter than {REDACT_MIN_CHARS} characters; "
            "that is not a Tinker API key, and it could not be kept out of the logs safely. "
            f"Set {API_KEY_ENV} to your full key"
        )


def check_timeouts(backend: str) -> None:
    """Each LOSSLAB_TINKER_*TIMEOUT_S the tinker backend reads, if set, is seconds > 0."""
    if backend != "tinker":
        return
    from losslab.backends.tinker import CALL_TIMEOUT_ENV, TIMEOUT_ENV

    for name in (TIMEOUT_ENV, CALL_TIMEOUT_ENV):
        raw = os.environ.get(name)
        if raw is None or raw == "":
            continue
        try:
            seconds = float(raw)
        except ValueError:
            seconds = float("nan")
        if not (seconds > 0 and seconds != float("inf")):
            raise BadEnvironmentSetting(
                f"{name}={raw[:40]!r}: expected a number of seconds > 0 (e.g. {name}=600), "
                "or unset it for the default"
            )


def check_start_environment(backend: str) -> None:
    """Every environment check of a run's start (`check_api_key`, `check_timeouts`)."""
    check_api_key(backend)
    check_timeouts(backend)


def environment_record(device: str, **run: Any) -> dict[str, Any]:
    """Python, platform, the `VERSIONED` packages' versions (None: not installed), the backend's
    `device`, torch's thread count and the CPU count, then the `run` facts (model, task, data)."""
    versions = {}
    for pkg in VERSIONED:
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            versions[pkg] = None
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": versions,
        "device": device,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        **run,
    }
