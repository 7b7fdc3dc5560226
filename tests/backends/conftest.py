"""Fixtures: tiny random model folders of every family (built once per session), a CPU service."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tinker import types

from losslab.backends.local import LocalServiceClient, make_tiny_model_dir
from losslab.backends.local.tiny import TINY_ARCHS


@pytest.fixture(scope="session", autouse=True)
def _threads():
    torch.set_num_threads(1)  # shared 2-core machine; tiny models gain nothing from threads


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny_models")
    return {arch: make_tiny_model_dir(root / arch, arch=arch, seed=0) for arch in TINY_ARCHS}


@pytest.fixture(scope="session")
def tiny_llama(tiny_dirs) -> str:
    return str(tiny_dirs["llama"])


@pytest.fixture
def service(tmp_path) -> LocalServiceClient:
    return LocalServiceClient(device="cpu", state_dir=tmp_path / "states")


def rl_datum(full: list[int], prompt_len: int, sampler_lp: float, advantage: float) -> types.Datum:
    """A datum in the cookbook's rl_loop layout: model_input = full[:-1], targets = full[1:],
    zeros on the prompt part (ob_len = prompt_len - 1 positions)."""
    ob = prompt_len - 1
    n = len(full) - 1
    return types.Datum(
        model_input=types.ModelInput.from_ints(full[:-1]),
        loss_fn_inputs={
            "target_tokens": full[1:],
            "logprobs": [0.0] * ob + [sampler_lp] * (n - ob),
            "advantages": [0.0] * ob + [advantage] * (n - ob),
        },
    )


def rl_batch(seed: int = 0) -> list[types.Datum]:
    """Three datums of different lengths, mixed-sign advantages. The tiny model is near uniform
    (log(1/259) = -5.56), so datum 0 (A>0, r ~ 1.4) and datum 1 (A<0, r ~ 0.77) are clipped by PPO, datum 2 is not."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for length, lp, adv in ((12, -5.9, 1.0), (9, -5.3, -0.5), (15, -5.56, 0.7)):
        full = torch.randint(3, 250, (length,), generator=g).tolist()
        out.append(rl_datum(full, prompt_len=4, sampler_lp=lp, advantage=adv))
    return out
