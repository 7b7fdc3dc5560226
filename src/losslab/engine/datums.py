"""Group advantages, datum assembly and the minibatch split, as tinker-cookbook's RL loop does them.

References: tinker-cookbook `rl/data_processing.py` (`compute_advantages`,
`trajectory_to_data`, `remove_constant_reward_groups`) and `rl/train.py` (`train_step` splits the
batch into `num_substeps` chunks, one `optim_step` each).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import tinker
import torch

__all__ = [
    "Rollout",
    "build_datum",
    "group_advantages",
    "keep_varied_groups",
    "split_minibatches",
]

T = TypeVar("T")


@dataclass(frozen=True)
class Rollout:
    """One sampled completion of one prompt, with its sampler log-probs and grade."""

    group: int  # index of the problem within the step's batch
    problem_id: str
    prompt_tokens: list[int]
    tokens: list[int]  # completion tokens, end-of-turn token included when it stopped
    sampler_logprobs: list[float]  # log q(token) for each completion token
    reward: float
    correct: bool
    format: bool
    stopped: bool


def group_advantages(rewards_G: torch.Tensor) -> torch.Tensor:
    """GRPO advantage without std scaling: `A_g = R_g - mean(R)` over one group (cookbook)."""
    if rewards_G.ndim != 1 or rewards_G.numel() == 0:
        raise ValueError(
            f"rewards_G must be a non-empty 1-D tensor, got shape {tuple(rewards_G.shape)}"
        )
    rewards_G = rewards_G.to(torch.float64)
    return (rewards_G - rewards_G.mean()).to(torch.float32)


def build_datum(
    prompt_tokens: Sequence[int],
    tokens: Sequence[int],
    sampler_logprobs: Sequence[float],
    advantage: float,
) -> tinker.Datum:
    """One training datum in the cookbook layout (`trajectory_to_data`, single turn).

    full = prompt + completion (length N+1); model_input = full[:-1]; every per-token input has
    length N and is shifted by one: target_tokens = full[1:], and `logprobs` (sampler),
    `advantages` and `mask` are 0 on the prompt part and (q_t, A, 1) on completion tokens.
    """
    if len(tokens) == 0:
        raise ValueError("a completion with no tokens cannot be trained on")
    if len(sampler_logprobs) != len(tokens):
        raise ValueError(
            f"sampler_logprobs has {len(sampler_logprobs)} entries for {len(tokens)} completion tokens"
        )
    if len(prompt_tokens) == 0:
        raise ValueError("prompt_tokens is empty; the first completion token needs a context")
    full = [int(t) for t in prompt_tokens] + [int(t) for t in tokens]
    ob_len = len(prompt_tokens) - 1  # prompt positions among the N shifted targets
    n = len(full) - 1
    logprobs_T = torch.zeros(n, dtype=torch.float32)
    advantages_T = torch.zeros(n, dtype=torch.float32)
    mask_T = torch.zeros(n, dtype=torch.float32)
    logprobs_T[ob_len:] = torch.tensor(list(sampler_logprobs), dtype=torch.float32)
    advantages_T[ob_len:] = float(advantage)
    mask_T[ob_len:] = 1.0
    return tinker.Datum(
        model_input=tinker.ModelInput.from_ints(full[:-1]),
        loss_fn_inputs={
            "target_tokens": tinker.TensorData.from_torch(
                torch.tensor(full[1:], dtype=torch.int64)
            ),
            "logprobs": tinker.TensorData.from_torch(logprobs_T),
            "advantages": tinker.TensorData.from_torch(advantages_T),
            "mask": tinker.TensorData.from_torch(mask_T),
        },
    )


def split_minibatches(items: Sequence[T], n: int) -> list[list[T]]:
    """Split in order into `n` contiguous non-empty chunks at the cookbook's boundaries.

    tinker-cookbook `split_list`: edges `np.linspace(0, len, n + 1).astype(int)`, so sizes differ
    by at most one and the longer chunks are spread out (7 into 3 gives 2, 2, 3).
    """
    if n <= 0:
        raise ValueError(f"updates_per_batch must be >= 1, got {n}")
    if len(items) < n:
        raise ValueError(f"cannot split {len(items)} datums into {n} non-empty minibatches")
    edges = np.linspace(0, len(items), n + 1).astype(int)
    return [list(items[edges[i] : edges[i + 1]]) for i in range(n)]


def keep_varied_groups(rewards_P_G: Sequence[Sequence[float]]) -> list[int]:
    """Indices of the groups whose rewards are not all equal (cookbook
    `remove_constant_reward_groups`); when every group is constant, the first group alone is kept,
    as the cookbook does, so the step still trains (on zero advantages)."""
    varied = [p for p, rewards_G in enumerate(rewards_P_G) if len(set(rewards_G)) > 1]
    return varied or list(range(min(1, len(rewards_P_G))))
