"""Pinned sources fetched with git into losslab's cache, offline: local file:// remotes only."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from losslab.conformance.fetch import FetchError, cached_dir, fetch_pinned
from losslab.conformance.preflight import PreflightError, run_preflight
from losslab.plan import parse_revision

from .conftest import VERL_PATH, RefRepo

PLAN = Path(__file__).resolve().parents[2] / "examples" / "gsm8k_dppo_vs_grpo.json"


def _stable_rl(commit: str) -> str:
    return (
        f"sail-sg/Stable-RL@{commit}:{VERL_PATH}::compute_policy_loss_with_mask("
        "loss_mode='dppo_binary_tv', clip_ratio=0.15, clip_ratio_c=10)"
    )


def _copy_remote(ref_repo: RefRepo, tmp_path: Path) -> Path:
    remote = tmp_path / "remote"
    shutil.copytree(ref_repo.path, remote)
    return remote


def test_fetch_then_cache_then_offline(ref_repo: RefRepo, tmp_path: Path) -> None:
    remote = _copy_remote(ref_repo, tmp_path)
    cache = tmp_path / "cache"
    rev = parse_revision(_stable_rl(ref_repo.good))
    files = fetch_pinned(rev, cache=cache, remote=f"file://{remote}")
    assert files.commit == ref_repo.good
    assert files.obtained.startswith("fetched from file://")  # type: ignore[attr-defined]
    assert "compute_policy_loss_with_mask" in (files.read(VERL_PATH) or "")
    # the remote is gone: the cached commit is used, also offline
    shutil.rmtree(remote)
    again = fetch_pinned(rev, cache=cache, remote=f"file://{remote}", offline=True)
    assert again.commit == ref_repo.good and again.obtained == "cache"  # type: ignore[attr-defined]
    assert cached_dir("sail-sg/Stable-RL", cache).is_dir()


def test_offline_without_cache_is_a_clear_error(ref_repo: RefRepo, tmp_path: Path) -> None:
    rev = parse_revision(_stable_rl(ref_repo.good))
    with pytest.raises(FetchError, match="offline and sail-sg/Stable-RL@.* is not in the cache"):
        fetch_pinned(rev, cache=tmp_path / "cache", offline=True)


def test_unknown_commit_is_a_clear_error(ref_repo: RefRepo, tmp_path: Path) -> None:
    remote = _copy_remote(ref_repo, tmp_path)
    rev = parse_revision(_stable_rl("1" * 40))
    with pytest.raises(FetchError, match=f"could not fetch commit {'1' * 40}"):
        fetch_pinned(rev, cache=tmp_path / "cache", remote=f"file://{remote}")


def test_preflight_fetches_and_says_so(
    ref_repo: RefRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    remote = _copy_remote(ref_repo, tmp_path)
    monkeypatch.setenv("LOSSLAB_SOURCE_REMOTE", f"file://{remote}")
    plan = json.loads(PLAN.read_text())
    plan["correctness_preflight"]["paths"][0]["reference_revision"] = _stable_rl(ref_repo.good)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    rep = run_preflight(path)  # no --source: the pinned commit is fetched and executed
    assert rep["passed"], rep["paths"][0]["checks"]
    sha = subprocess.run(
        ["git", "-C", str(remote), "show", f"{ref_repo.good}:{VERL_PATH}"],
        capture_output=True,
        check=True,
    ).stdout
    import hashlib

    ref = rep["provenance"]["reference"]
    assert ref["summary"] == (
        f"executed pinned source sail-sg/Stable-RL@{ref_repo.good} "
        f"(file sha256 {hashlib.sha256(sha).hexdigest()})"
    )
    assert ref["obtained"].startswith("fetched from file://")
    # Spindle has no fetchable commit: re-derived, and the summary says the source did not run
    assert rep["provenance"]["baseline"]["summary"].startswith(
        "losslab re-derivation, pinned source NOT executed (formula restated from "
        "modal-projects/spindle@88b2e5f3"
    )
    assert rep["paths"][0]["stress"]["provenance"]["executed"] is True
    # offline now works from the cache
    assert run_preflight(path, offline=True)["provenance"]["reference"]["executed"]


def test_preflight_without_source_or_network_refuses(tmp_path: Path) -> None:
    with pytest.raises(PreflightError, match="--allow-rederivation"):
        run_preflight(PLAN)
    rep = run_preflight(PLAN, allow_rederivation=True)
    summary = rep["provenance"]["reference"]["summary"]
    assert summary.startswith("losslab re-derivation, pinned source NOT executed")
    assert "could not fetch commit c6af1d119c0fe30d16dd9a837d35fdf695acd226" in summary


def test_partial_clone_reads_files_lazily(ref_repo: RefRepo, tmp_path: Path) -> None:
    from losslab.conformance.pinned import PinnedSourceError

    remote = _copy_remote(ref_repo, tmp_path)
    cache = tmp_path / "cache"
    rev = parse_revision(_stable_rl(ref_repo.good))
    files = fetch_pinned(rev, cache=cache, remote=f"file://{remote}")
    assert files.read(VERL_PATH) is not None  # fetched on first read, kept in the cache
    shutil.rmtree(remote)
    offline = fetch_pinned(rev, cache=cache, offline=True)
    assert offline.read(VERL_PATH) is not None
    assert offline.read("no/such/file.py") is None  # not in the tree: None, as before
    with pytest.raises(PinnedSourceError, match="is in commit .* but its content cannot be read"):
        offline.read("net/core.py")  # in the tree, never read, remote gone
