"""losslab.atomic: files and folders appear whole or not at all, and leave no temp files behind."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from losslab import atomic
from losslab.atomic import atomic_dir, atomic_write_bytes, atomic_write_json, atomic_write_text


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_bytes_round_trip_and_parents_created(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "x.bin"
    data = bytes(range(256))  # every byte value, so no encoding step can hide a change
    assert atomic_write_bytes(path, data) == path
    assert path.read_bytes() == data
    assert os.listdir(path.parent) == ["x.bin"]  # the temp file was renamed, not copied


def test_text_and_json_round_trip(tmp_path: Path) -> None:
    text = "naïve ✓\nline 2\n"
    atomic_write_text(tmp_path / "t.txt", text)
    assert (tmp_path / "t.txt").read_bytes() == text.encode("utf-8")  # utf-8 is the default

    obj = {"b": [1, 2.5, None], "a": "x"}
    atomic_write_json(tmp_path / "o.json", obj, indent=1, sort_keys=True)
    # same text json.dumps gives for these arguments, plus the final newline
    expected = json.dumps(obj, indent=1, sort_keys=True) + "\n"
    assert (tmp_path / "o.json").read_text(encoding="utf-8") == expected
    assert json.loads(expected) == obj
    assert sorted(os.listdir(tmp_path)) == ["o.json", "t.txt"]


def test_existing_file_is_replaced_whole(tmp_path: Path) -> None:
    path = tmp_path / "x.txt"
    atomic_write_text(path, "a much longer old content\n" * 10)
    atomic_write_text(path, "new\n")
    assert path.read_text() == "new\n"  # no tail of the longer old file survives


def test_file_mode_is_what_open_would_give(tmp_path: Path) -> None:
    path = atomic_write_bytes(tmp_path / "x.bin", b"1")
    # open(path, "w") creates 0o666 minus the umask (0o644 under the usual umask 022, so group
    # and others can read); mkstemp alone would give 0o600
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~_umask()
    reference = tmp_path / "plain.bin"
    reference.write_bytes(b"1")
    assert stat.S_IMODE(path.stat().st_mode) == stat.S_IMODE(reference.stat().st_mode)


def test_failure_mid_write_keeps_old_file_and_leaves_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "x.json"
    atomic_write_json(path, {"v": 1})

    def broken_fsync(fd: int) -> None:  # the data is written to the temp file, then the disk fails
        raise OSError(5, "simulated I/O error")

    monkeypatch.setattr(atomic.os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="simulated"):
        atomic_write_json(path, {"v": 2})
    assert json.loads(path.read_text()) == {"v": 1}
    assert os.listdir(tmp_path) == ["x.json"]


def test_unserializable_json_keeps_old_file(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    atomic_write_json(path, {"v": 1})
    with pytest.raises(TypeError):
        atomic_write_json(path, {"v": object()})
    assert json.loads(path.read_text()) == {"v": 1}
    assert os.listdir(tmp_path) == ["x.json"]


def test_atomic_dir_creates_folder_with_content_and_mode(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "model"
    with atomic_dir(target) as tmp:
        assert tmp.parent == target.parent and tmp.name.startswith(".model.")  # hidden sibling
        assert not target.exists()  # nothing visible until the body finished
        (tmp / "w.bin").write_bytes(b"\x01\x02")
    assert (target / "w.bin").read_bytes() == b"\x01\x02"
    assert os.listdir(target.parent) == ["model"]
    # mkdir would give 0o777 minus the umask; mkdtemp alone gives 0o700
    assert stat.S_IMODE(target.stat().st_mode) == 0o777 & ~_umask()


def test_atomic_dir_replaces_existing_target_whole(tmp_path: Path) -> None:
    target = tmp_path / "ck"
    with atomic_dir(target) as tmp:
        (tmp / "old_only.bin").write_bytes(b"old")
        (tmp / "both.bin").write_bytes(b"old")
    with atomic_dir(target) as tmp:
        (tmp / "both.bin").write_bytes(b"new")
    assert sorted(os.listdir(target)) == ["both.bin"]  # old_only.bin went with the old folder
    assert (target / "both.bin").read_bytes() == b"new"
    assert os.listdir(tmp_path) == ["ck"]  # neither the temp folder nor the old one is left


def test_atomic_dir_exception_keeps_old_target_and_removes_temp(tmp_path: Path) -> None:
    target = tmp_path / "ck"
    target.mkdir()
    (target / "w.bin").write_bytes(b"old")
    with pytest.raises(RuntimeError, match="killed"), atomic_dir(target) as tmp:
        (tmp / "w.bin").write_bytes(b"half")
        raise RuntimeError("killed mid-save")
    assert (target / "w.bin").read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["ck"]


def test_atomic_dir_prefix_names_the_temp_folder(tmp_path: Path) -> None:
    seen: list[str] = []
    with atomic_dir(tmp_path / "step_0003", prefix=".tmp-step_0003.") as tmp:
        seen.append(tmp.name)
    assert seen[0].startswith(".tmp-step_0003.")
    assert os.listdir(tmp_path) == ["step_0003"]


def test_atomic_dir_without_overwrite_keeps_existing_target(tmp_path: Path) -> None:
    target = tmp_path / "cache"
    target.mkdir()
    (target / "model.safetensors").write_bytes(b"theirs")
    with pytest.raises(FileExistsError), atomic_dir(target, overwrite=False) as tmp:
        (tmp / "model.safetensors").write_bytes(b"ours")
    assert (target / "model.safetensors").read_bytes() == b"theirs"
    assert os.listdir(tmp_path) == ["cache"]
