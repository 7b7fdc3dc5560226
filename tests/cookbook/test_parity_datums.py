"""Advantages, datums, the minibatch split, constant-group removal and the data cursor against
tinker-cookbook's own functions (the `cookbook` extra)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tinker
import torch

from ._cookbook import require_cookbook

require_cookbook()

from tinker_cookbook.completers import TokensWithLogprobs  # noqa: E402
from tinker_cookbook.rl import data_processing  # noqa: E402
from tinker_cookbook.rl.types import Trajectory, TrajectoryGroup, Transition  # noqa: E402
from tinker_cookbook.utils.misc_utils import split_list  # noqa: E402

from losslab.engine import (  # noqa: E402
    build_datum,
    group_advantages,
    keep_varied_groups,
    split_minibatches,
)
from losslab.tasks import Problem, batch_for_step  # noqa: E402

GSM8K = Path(__file__).resolve().parents[3] / "shared" / "gsm8k"


def _trajectory(prompt: list[int], tokens: list[int], logprobs: list[float], reward: float):
    transition = Transition(
        ob=tinker.ModelInput.from_ints(prompt),
        ac=TokensWithLogprobs(tokens=tokens, maybe_logprobs=logprobs),  # no sequence id
        reward=reward,
        episode_done=True,
    )
    return Trajectory(transitions=[transition], final_ob=tinker.ModelInput.empty())


def _group(rewards: list[float]) -> TrajectoryGroup:
    trajectories = [
        _trajectory([1, 2, 3], [4 + i, 9], [-0.5 - i, -1.25], r) for i, r in enumerate(rewards)
    ]
    return TrajectoryGroup(trajectories, [0.0] * len(rewards), [{} for _ in rewards])


def _as_lists(datum: tinker.Datum) -> dict:
    out = {"model_input": datum.model_input.to_ints()}
    for key, value in datum.loss_fn_inputs.items():
        out[key] = value.to_torch().tolist()
    return out


@pytest.mark.parametrize(
    ("prompt", "tokens", "logprobs", "advantage"),
    [
        ([1, 2, 3], [4, 5], [-0.5, -1.25], 0.375),
        ([7], [8], [-2.0], -1.0),
        (list(range(10, 30)), list(range(40, 47)), [-0.1 * i for i in range(7)], 0.1),
    ],
)
def test_datum_equals_trajectory_to_data(prompt, tokens, logprobs, advantage):
    (expected,) = data_processing.trajectory_to_data(
        _trajectory(prompt, tokens, logprobs, 0.0), advantage
    )
    ours = build_datum(prompt, tokens, logprobs, advantage)
    assert _as_lists(ours) == _as_lists(expected)
    for key in ours.loss_fn_inputs:
        assert ours.loss_fn_inputs[key].dtype == expected.loss_fn_inputs[key].dtype, key


@pytest.mark.parametrize(
    "rewards", [[1.0, 0.0, 0.9, -0.1], [0.3, 0.3], [1.0, -0.1, -0.1, 0.9, 0.0, 1.0, 1.0, 0.9]]
)
def test_advantages_equal_compute_advantages(rewards):
    (expected,) = data_processing.compute_advantages([_group(rewards)])
    ours = group_advantages(torch.tensor(rewards))
    assert ours.tolist() == expected.tolist()


def test_split_equals_split_list_on_every_size():
    for n in range(1, 130):
        for k in range(1, n + 1):
            assert split_minibatches(list(range(n)), k) == split_list(list(range(n)), k), (n, k)


@pytest.mark.parametrize(
    "rewards_P",
    [
        [[1.0, 0.0], [1.0, 1.0], [0.0, 0.9]],
        [[1.0, 1.0], [0.0, 0.0], [-0.1, -0.1]],  # all constant: the cookbook keeps the first
        [[0.5, 0.5, 0.5]],
        [[0.0, 1.0]],
    ],
)
def test_constant_groups_equal_remove_constant_reward_groups(rewards_P):
    groups = [_group(r) for r in rewards_P]
    kept = data_processing.remove_constant_reward_groups(groups)
    assert keep_varied_groups(rewards_P) == [groups.index(g) for g in kept]


def test_train_order_and_cursor_equal_gsm8k_dataset_across_an_epoch(monkeypatch):
    import datasets
    from tinker_cookbook.recipes.math_rl import math_env
    from tinker_cookbook.rl.dataset_utils import EpochCycledRLDataset

    train = GSM8K / "train.jsonl"
    if not train.is_file():
        pytest.skip(f"{train} is absent (the shared GSM8K copy)")
    rows = [json.loads(line) for line in train.read_text().splitlines() if line.strip()]
    monkeypatch.setattr(
        math_env, "load_dataset", lambda *a, **k: datasets.Dataset.from_list(rows)
    )  # the cookbook's hub load, served from the shared file
    batch_size = 1000  # 7473 rows: 7 full batches and a short one of 473
    cookbook = EpochCycledRLDataset(
        math_env.Gsm8kDataset(batch_size, group_size=2, renderer=None, split="train", seed=0),
        num_epochs=2,
    )
    from losslab.tasks.gsm8k import Gsm8kTask

    task = Gsm8kTask(seed=0, data=GSM8K)
    assert len(cookbook) == 16
    for step in (0, 6, 7, 8, 15):
        builders = cookbook.get_batch(step)
        expected = [(b.env_thunk.args[0], b.env_thunk.args[1]) for b in builders]
        ours: list[Problem] = batch_for_step(task.train, step, batch_size)
        assert [(p.question, p.answer) for p in ours] == expected, step
