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
