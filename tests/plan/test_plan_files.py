"""Hostile plan files (issue 25): what `plan check` reads and how the JSON text is parsed.

Special files are refused before a byte is read (a FIFO would block, /dev/zero would fill
memory), duplicate keys are refused at their JSON path (Python's parser keeps the last one
silently), invalid Unicode is refused at its path, and the value of TINKER_API_KEY is found
however the plan encodes it, without any output showing it.
"""

from __future__ import annotations

import base64
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from losslab.cli import app
from losslab.plan import check_plan_file
from losslab.plan.semantics import MAX_PLAN_BYTES

from ._plans import SEED_PLAN, fresh_seed

SECRET = "tml-Zq8xY3vW0uT5sR2pQ9oN"


def _limit_memory() -> None:
    """2 GiB of address space: a plan check that reads /dev/zero fails fast instead of
    taking the shared machine's memory."""
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def _plan_check(path: Path | str, timeout: float = 60) -> tuple[int, str, float]:
    """(exit code, stderr + stdout, seconds) of `losslab plan check PATH` in a fresh process,
    so a check that blocks or reads forever fails this test instead of hanging it."""
    start = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "losslab.cli", "plan", "check", str(path)],
            capture_output=True,
            text=True,
            timeout=timeout,
            preexec_fn=_limit_memory,
        )
    except subprocess.TimeoutExpired:
        return -1, f"timed out after {timeout} s", time.monotonic() - start
    return done.returncode, done.stderr + done.stdout, time.monotonic() - start


def test_dev_zero_is_refused_at_once_without_reading_it() -> None:
    if not Path("/dev/zero").exists():
        pytest.skip("no /dev/zero on this OS")
    code, output, seconds = _plan_check("/dev/zero")
    assert code == 2, output
    assert "is a character device, not a regular file" in output
    assert "Traceback" not in output and seconds < 30


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this OS")
    fifo = tmp_path / "plan.json"
    os.mkfifo(fifo)
    code, output, _ = _plan_check(fifo, timeout=30)  # nobody writes: a blocking open never returns
    assert code == 2, output
    assert "is a FIFO (named pipe), not a regular file" in output


def test_a_directory_is_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["plan", "check", str(tmp_path)])
    assert result.exit_code == 2 and "is a directory, not a regular file" in result.output
    assert "Traceback" not in result.output


def test_a_symlink_to_the_plan_is_read(tmp_path: Path) -> None:
    link = tmp_path / "plan.json"
    link.symlink_to(SEED_PLAN)
    assert check_plan_file(link).ok


def test_a_plan_over_the_size_bound_is_refused_before_reading(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    with big.open("wb") as f:  # sparse: the size, not the bytes, is what is checked
        f.truncate(MAX_PLAN_BYTES + 1)
    result = CliRunner().invoke(app, ["plan", "check", str(big)])
    assert result.exit_code == 2
    assert f"is {MAX_PLAN_BYTES + 1} bytes; at most {MAX_PLAN_BYTES} are read" in result.output


def test_bytes_that_are_not_utf8_are_refused(tmp_path: Path) -> None:
    bad = tmp_path / "plan.json"
    bad.write_bytes(b'{"title": "caf\xe9"}')
    result = CliRunner().invoke(app, ["plan", "check", str(bad)])
    assert result.exit_code == 2 and "is not UTF-8 (byte 0xe9 at offset 14)" in result.output


def _with_text(tmp_path: Path, edit: str, old: str) -> Path:
    """The seed plan's text with `old` (which must occur once) replaced by `edit`."""
    text = SEED_PLAN.read_text(encoding="utf-8")
    assert text.count(old) == 1, old
    path = tmp_path / "plan.json"
    path.write_text(text.replace(old, edit), encoding="utf-8")
    return path


def test_a_duplicate_top_level_key_is_refused_at_its_path(tmp_path: Path) -> None:
    """`json.loads` keeps the second "title" and drops the first without a word."""
    title = json.dumps(fresh_seed()["title"])
    path = _with_text(tmp_path, f'"title": "first", "title": {title}', f'"title": {title}')
    result = check_plan_file(path)
    assert not result.ok
    assert [(e.path, "appears more than once" in e.message) for e in result.errors] == [
        ("title", True)
    ]


def test_a_duplicate_key_in_an_arm_is_refused_at_its_path(tmp_path: Path) -> None:
    loss = '"loss": "grpo_clip_eps0.2"'
    path = _with_text(tmp_path, f'"lr": 1.0, {loss}', loss)
    result = CliRunner().invoke(app, ["plan", "check", str(path)])
    assert result.exit_code == 1
    assert "error: arms[0].lr: this key appears more than once in its object" in result.output


def test_a_lone_surrogate_in_the_file_is_refused_at_its_path(tmp_path: Path) -> None:
    title = json.dumps(fresh_seed()["title"])
    path = _with_text(tmp_path, '"title": "DPPO \\ud800 vs GRPO"', f'"title": {title}')
    result = CliRunner().invoke(app, ["plan", "check", str(path)])
    assert result.exit_code == 1, result.output
    assert "error: title: the string holds a lone UTF-16 surrogate ('\\ud800'" in result.output


def test_a_lone_surrogate_stops_losslab_run_before_any_work(tmp_path: Path) -> None:
    """Before: the run trained and evaluated, then crashed (exit 70) writing the report."""
    title = json.dumps(fresh_seed()["title"])
    path = _with_text(tmp_path, '"title": "\\udc80"', f'"title": {title}')
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", str(path), "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert "title: the string holds a lone UTF-16 surrogate" in result.output
    assert not out.exists()


def _json_escaped(text: str) -> str:
    return "".join(f"\\u{ord(c):04x}" for c in text)


ENCODINGS = {
    "json-escape-first": lambda s: "\\u" + f"{ord(s[0]):04x}" + s[1:],
    "json-escape-all": _json_escaped,
    "json-double-escape": lambda s: "\\\\u" + f"{ord(s[0]):04x}" + s[1:],
    "python-hex-escape": lambda s: "\\\\x" + f"{ord(s[0]):02x}" + s[1:],
    "percent-first": lambda s: f"%{ord(s[0]):02x}" + s[1:],
    "percent-all": lambda s: "".join(f"%{b:02X}" for b in s.encode()),
    "html-entity": lambda s: "&#116;" + s[1:],
    "hex": lambda s: s.encode().hex(),
    "base64": lambda s: base64.b64encode(s.encode()).decode(),
    "base64-offset": lambda s: base64.b64encode(b"Bearer " + s.encode()).decode(),
    "base64-urlsafe": lambda s: base64.urlsafe_b64encode(b"k=" + s.encode()).decode(),
}


@pytest.mark.parametrize("encoding", sorted(ENCODINGS))
def test_an_encoded_api_key_is_found_and_never_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, encoding: str
) -> None:
    """Before: only the key as written was found; `"\\u0074ml-..."` passed plan check."""
    monkeypatch.setenv("TINKER_API_KEY", SECRET)
    encoded = ENCODINGS[encoding](SECRET)
    assert SECRET not in encoded
    method = json.dumps(fresh_seed()["method"])
    path = _with_text(tmp_path, f'"method": "see {encoded} for access"', f'"method": {method}')
    assert SECRET not in path.read_text(encoding="utf-8")
    result = CliRunner().invoke(app, ["plan", "check", str(path)])
    assert result.exit_code == 1
    assert (
        "error: method: the plan contains the value of TINKER_API_KEY in the string"
        in result.output
    )
    assert SECRET not in result.output and encoded not in result.output


def test_an_api_key_as_an_object_key_is_refused_without_showing_its_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TINKER_API_KEY", SECRET)
    data = fresh_seed()
    data["engine"] = {"task_config": {_json_escaped(SECRET): 1}}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data).replace("\\\\u", "\\u"), encoding="utf-8")
    result = CliRunner().invoke(app, ["plan", "check", str(path)])
    assert result.exit_code == 1
    assert "error: $: the plan contains the value of TINKER_API_KEY in this key" in result.output
    assert SECRET not in result.output


def test_a_short_key_is_not_searched_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Below `MIN_SECRET_CHARS` every plan would 'contain' the key ("a" is in every word);
    refusing such a key is the run's start-up check, not plan check's."""
    monkeypatch.setenv("TINKER_API_KEY", "a")
    assert check_plan_file(SEED_PLAN).ok
