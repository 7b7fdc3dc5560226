"""A small git repository, made by the test itself, that stands in for a reference checkout.

It holds two tiny reference implementations written for these tests (not the real projects'
code): a Spindle-style `_loss(logprobs, batch)` on packed rows and a verl-style
`compute_policy_loss_with_mask` on padded rows, each using module-level helpers, a constant and
a helper imported from another file of the same repository. A second commit breaks the sign so
a test can tell which commit was executed.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

SPINDLE_PATH = "src/spindle/fb.py"
VERL_PATH = "verl/trainer/ppo/core_algos.py"

SPINDLE_HELPERS = """
import not_installed_anywhere  # only `unused` needs it; extraction must not follow it


def masked_negative_sum(objective, mask):
    return -(objective * mask).sum()


def unused():
    return not_installed_anywhere.x
"""

SPINDLE_FB = """
from __future__ import annotations

import torch

from spindle.helpers import masked_negative_sum

RL_LOSSES = frozenset({"ppo", "dppo"})
SIGN = 1.0


def _ratio(logprobs, sampling_logprobs):
    return torch.exp(logprobs - sampling_logprobs)


def _loss_config(loss_name, config):
    if loss_name not in RL_LOSSES:
        raise ValueError(f"unsupported loss_fn: {loss_name}")
    return {key: float(value) for key, value in config.items()}


def _loss(logprobs, batch):
    mask = batch["loss_mask"]
    ratio = _ratio(logprobs, batch["sampling_logprobs"])
    adv = batch["advantages"]
    if batch["loss_name"] == "ppo":
        low = batch["loss_config"].get("clip_low_threshold", 0.8)
        high = batch["loss_config"].get("clip_high_threshold", 1.2)
        objective = torch.minimum(ratio * adv, torch.clamp(ratio, low, high) * adv)
    else:
        tau = batch["loss_config"].get("tv_threshold", 0.1)
        r = ratio.detach()
        p_s = batch["sampling_logprobs"].exp()
        moving = ((adv > 0) & (r > 1)) | ((adv < 0) & (r < 1))
        blocked = moving & ((r * p_s - p_s).abs() > tau)
        objective = ratio * adv * (~blocked).to(logprobs.dtype)
    return SIGN * masked_negative_sum(objective, mask), mask.count_nonzero()
"""

VERL_TF = """
import torch


def masked_sum(values, mask):
    return (torch.where(mask.bool(), values, 0.0) * mask).sum()
"""

VERL_CORE = """
from typing import Optional

import torch

import verl.utils.torch_functional as verl_F
from verl.workers.config import ActorConfig  # annotation only: never needed at run time


def agg_loss(loss_mat, loss_mask, loss_agg_mode, dp_size=1, batch_num_tokens=None):
    if loss_agg_mode != "token-mean":
        raise ValueError(loss_agg_mode)
    if batch_num_tokens is None:
        batch_num_tokens = loss_mask.sum()
    return verl_F.masked_sum(loss_mat, loss_mask) / batch_num_tokens * dp_size


def _keep_mask(log_prob, rollout_log_prob, advantages, response_mask, low, high, loss_mode):
    p, p_s = torch.exp(log_prob), torch.exp(rollout_log_prob)
    if loss_mode == "dppo_binary_tv":
        up, down = (p - p_s) > high, (p - p_s) < -low
    else:
        r = torch.exp(log_prob - rollout_log_prob)
        up, down = r > 1 + high, r < 1 - low
    invalid = torch.where(advantages > 0, up, down)
    return (1.0 - invalid.float()) * response_mask


def compute_policy_loss_with_mask(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Optional[ActorConfig] = None,
    rollout_log_prob: Optional[torch.Tensor] = None,
    loss_mode: Optional[str] = None,
):
    low = config.clip_ratio_low if config.clip_ratio_low is not None else config.clip_ratio
    high = config.clip_ratio_high if config.clip_ratio_high is not None else config.clip_ratio
    mask = _keep_mask(log_prob, rollout_log_prob, advantages, response_mask, low, high, loss_mode)
    weight = torch.clamp(torch.exp(torch.clamp(log_prob - rollout_log_prob, max=20.0)),
                         max=config.get("clip_ratio_c", 10.0)).detach()
    loss_mat = -advantages * weight * mask.detach() * log_prob
    return agg_loss(loss_mat, response_mask, loss_agg_mode, **config.global_batch_info), {}
"""

NETWORK_CORE = """
import urllib.request


def compute_policy_loss_with_mask(log_prob, **kwargs):
    return urllib.request.urlopen("http://example.invalid")
"""


@dataclass(frozen=True)
class RefRepo:
    path: Path
    good: str  # commit with correct references
    broken: str  # later commit: the Spindle loss has its sign flipped


def _git(repo: Path, *args: str) -> str:
    out = subprocess.run(
        [
            "git",
            "-C",
            str(repo),
            "-c",
            "user.name=losslab-test",
            "-c",
            "user.email=t@example.com",
            "-c",
            "commit.gpgsign=false",
            *args,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.lstrip("\n"))


@pytest.fixture(scope="session")
def ref_repo(tmp_path_factory: pytest.TempPathFactory) -> RefRepo:
    root = tmp_path_factory.mktemp("refrepo")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    _write(root, "src/spindle/__init__.py", "")
    _write(root, "src/spindle/helpers.py", SPINDLE_HELPERS)
    _write(root, SPINDLE_PATH, SPINDLE_FB)
    for pkg in ("verl", "verl/utils", "verl/trainer", "verl/trainer/ppo"):
        _write(root, f"{pkg}/__init__.py", "")
    _write(root, "verl/utils/torch_functional.py", VERL_TF)
    _write(root, VERL_PATH, VERL_CORE)
    _write(root, "net/core.py", NETWORK_CORE)
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "references")
    good = _git(root, "rev-parse", "HEAD")
    _write(root, SPINDLE_PATH, SPINDLE_FB.replace("SIGN = 1.0", "SIGN = -1.0"))
    _git(root, "commit", "-q", "-am", "flip the sign")
    broken = _git(root, "rev-parse", "HEAD")
    return RefRepo(root, good, broken)
