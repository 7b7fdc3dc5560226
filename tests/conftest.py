"""Shared pytest fixtures: the path to the team's shared folder (absent on a user's machine)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED = REPO_ROOT.parent / "shared"


@pytest.fixture(scope="session", autouse=True)
def _hub_offline():
    """No test touches the network: the local backend downloads from the Hugging Face hub
    unless HF_HUB_OFFLINE=1, so the whole session runs offline (tests of the download path
    replace `snapshot_download` and unset the variable themselves)."""
    import os

    saved = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    yield
    if saved is None:
        os.environ.pop("HF_HUB_OFFLINE", None)
    else:
        os.environ["HF_HUB_OFFLINE"] = saved


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The `../shared` folder beside the checkout; tests that need it skip when it is absent."""
    if not SHARED.is_dir():
        pytest.skip(f"../shared is absent ({SHARED}): golden vectors are only in the team checkout")
    return SHARED


@pytest.fixture(scope="session")
def golden_tinker_ppo_dppo(shared_dir: Path) -> Path:
    path = shared_dir / "conformance" / "tinker_ppo_and_dppo_seed0.json"
    if not path.is_file():
        pytest.skip(f"golden file {path} is absent")
    return path


@pytest.fixture(autouse=True)
def _pinned_sources_never_from_the_network(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tests never fetch pinned sources from the network: the source cache is a fresh folder
    and the remote a local path that does not exist, so a fetch fails at once (tests of the
    fetch path create their own file:// remotes)."""
    monkeypatch.setenv("LOSSLAB_CACHE_DIR", str(tmp_path_factory.mktemp("source-cache")))
    monkeypatch.setenv(
        "LOSSLAB_SOURCE_REMOTE",
        str(tmp_path_factory.getbasetemp() / "no-remote" / "{owner}+{name}"),
    )
