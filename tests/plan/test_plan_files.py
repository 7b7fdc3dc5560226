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
from losslab.plan import check_plan_data, check_plan_file
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


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root reads a file of mode 000"
)
def test_a_plan_file_without_read_permission_is_refused(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(SEED_PLAN.read_text(encoding="utf-8"), encoding="utf-8")
    plan.chmod(0)
    result = CliRunner().invoke(app, ["plan", "check", str(plan)])
    assert result.exit_code == 2 and "Permission denied" in result.output


def test_plan_show_of_a_directory_is_exit_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["plan", "show", str(tmp_path)])
    assert result.exit_code == 2 and "is a directory, not a regular file" in result.output


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


def test_losslab_run_refuses_a_traversal_arm_name_before_writing(tmp_path: Path) -> None:
    """Before: the run wrote eval rows over victim_data/train.jsonl beside the run directory and
    checkpoints two levels up, then exited 0."""
    victim = tmp_path / "victim_data" / "train.jsonl"
    victim.parent.mkdir()
    victim.write_text('{"question": "mine"}\n', encoding="utf-8")
    data = json.loads((SEED_PLAN.parent / "arithmetic_dppo_vs_grpo_local.json").read_text())
    data["arms"][0]["name"] = "../../victim_data/train"
    for group in data["restoration_preflight"]["groups"]:
        group["arms"][0]["name"] = "../../victim_data/train"
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(data), encoding="utf-8")
    out = tmp_path / "runs" / "r"
    result = CliRunner().invoke(app, ["run", str(plan), "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert "arms[0].name: '../../victim_data/train' contains '/', a path separator" in result.output
    assert not out.exists() and not (tmp_path / "runs").exists()
    assert victim.read_text(encoding="utf-8") == '{"question": "mine"}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json", "victim_data"]


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


MY_PLAN = SEED_PLAN.parent / "my_dppo_plan.json"


def _plan_with_loss_file(tmp_path: Path, name: str = "my_dppo_loss.py") -> Path:
    """examples/my_dppo_plan.json copied to `tmp_path`, its code-form loss naming `name` there."""
    data = json.loads(MY_PLAN.read_text(encoding="utf-8"))
    data["arms"][1]["loss"] = data["arms"][1]["loss"].replace("my_dppo_loss.py", name)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(data), encoding="utf-8")
    return plan


def test_a_loss_file_that_is_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    """A plan names its loss as `path.py::function`; plan check reads that file. Before: a FIFO
    there blocked plan check forever, a link to /dev/zero read until memory ran out."""
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this OS")
    os.mkfifo(tmp_path / "my_dppo_loss.py")
    code, output, _ = _plan_check(_plan_with_loss_file(tmp_path), timeout=30)
    assert code == 1, output
    assert "error: arms[1].loss: " in output
    assert "is a FIFO (named pipe), not a regular file" in output


def test_a_loss_file_linked_to_dev_zero_is_refused_at_once(tmp_path: Path) -> None:
    if not Path("/dev/zero").exists():
        pytest.skip("no /dev/zero on this OS")
    (tmp_path / "my_dppo_loss.py").symlink_to("/dev/zero")
    code, output, seconds = _plan_check(_plan_with_loss_file(tmp_path))
    assert code == 1, output
    assert "is a character device, not a regular file" in output and seconds < 30


def test_the_example_loss_file_is_still_read(tmp_path: Path) -> None:
    (tmp_path / "my_dppo_loss.py").write_text(
        (SEED_PLAN.parent / "my_dppo_loss.py").read_text(encoding="utf-8"), encoding="utf-8"
    )
    assert check_plan_file(_plan_with_loss_file(tmp_path)).ok


def test_a_pinned_loss_path_outside_its_repository_is_refused() -> None:
    data = json.loads(MY_PLAN.read_text(encoding="utf-8"))
    data["arms"][1]["loss"] = "sail-sg/Stable-RL@" + "c6af1d11" * 5 + ":../../etc/x.py::loss()"
    result = check_plan_data(data, base_dir=MY_PLAN.parent)
    (error,) = [e for e in result.errors if e.path == "arms[1].loss"]
    assert "path '../../etc/x.py' has an empty, '.' or '..' part" in error.message


def test_an_api_key_in_text_that_is_not_json_is_still_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No JSON path to name: the whole text is searched, and the message shows no value."""
    monkeypatch.setenv("TINKER_API_KEY", SECRET)
    path = tmp_path / "plan.json"
    path.write_text('{"title": "' + _json_escaped(SECRET) + '", ', encoding="utf-8")
    result = check_plan_file(path)
    assert [e.path for e in result.errors] == ["$", "$"]
    assert "contains the value of TINKER_API_KEY" in result.errors[0].message
    assert "not valid JSON" in result.errors[1].message
    assert all(SECRET not in str(e) for e in result.errors)
