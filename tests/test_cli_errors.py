"""The CLI's top-level handler (losslab.cli_errors): usage errors stay typer's, expected failures
are one line with their exit code, and only a bug writes a crash file."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from typer.testing import CliRunner

from losslab.cli import app
from losslab.cli_errors import EXIT_BUG, expected_failure, os_error_message


def test_a_usage_error_is_typers_message_not_a_bug(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOSSLAB_CRASH_DIR", str(tmp_path))
    result = CliRunner().invoke(app, ["run", "--bogus"])
    assert result.exit_code == 2
    assert "No such option: --bogus" in result.output and "bug" not in result.output
    assert not list(tmp_path.iterdir())  # no crash file for a typo


@pytest.mark.parametrize(
    ("exc", "code", "words"),
    [
        (OSError(errno.ENOSPC, "No space left on device", "/d/run.log"), 1, "no space left"),
        (PermissionError(errno.EACCES, "Permission denied", "/ro/report.json"), 1, "cannot write"),
        (OSError(errno.EROFS, "Read-only file system", "/ro/x"), 1, "read-only"),
        (FileNotFoundError(errno.ENOENT, "No such file", "/nope"), 1, "no such file"),
        (MemoryError(), 1, "out of memory"),
        (RecursionError(), 2, "nested too deeply"),
    ],
)
def test_expected_failures_are_one_line_with_their_code(
    exc: BaseException, code: int, words: str
) -> None:
    message, exit_code = expected_failure(exc)  # type: ignore[misc]
    assert exit_code == code and words in message and "\n" not in message


def test_an_unexpected_exception_is_a_bug() -> None:
    assert expected_failure(ZeroDivisionError("x")) is None
    assert EXIT_BUG == 70


def test_os_error_messages_name_the_file() -> None:
    text = os_error_message(PermissionError(errno.EACCES, "Permission denied", "/ro/a.json"))
    assert "/ro/a.json" in text
