"""The engine end to end on the local backend with a tiny random model and the real losses."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from losslab.backends.local import LocalServiceClient, make_tiny_model_dir
from losslab.engine import (
    ArmConfig,
    ArmLoop,
    accuracy,
    evaluate,
    pilot_metrics,
    renderer_for,
    train_steps,
)
from losslab.losses import as_tinker_loss_fn, parse_loss_spec
from losslab.plan import GATE_METRICS
from losslab.tasks import Grade, Problem

PPO = "ppo(clip_low_threshold=0.8, clip_high_threshold=1.2)"
DPPO = "dppo_binary_tv(low=0.15, high=0.15, anchor='sampler', clip_ratio_c=10)"


@dataclass
class EvenLengthTask:
    """A random tiny model gets mixed rewards here: correct = the completion has an even length."""

    name: str = "even"
    train: list[Problem] = field(
        default_factory=lambda: [Problem(f"p{i}", f"say {i}", "0") for i in range(6)]
    )
    test: list[Problem] = field(
        default_factory=lambda: [Problem(f"e{i}", f"say {i}", "0") for i in range(4)]
    )

    def messages(self, problem):
        return [{"role": "user", "content": problem.question}]

    def grade(self, problem, text, stopped):
        correct = len(text) % 2 == 0
        return Grade(float(correct), correct, True, str(len(text)))

    def describe(self):
        return {"name": self.name}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("m") / "tiny", "llama", seed=0)


def make_arm(name, spec, **kw):
    loss = parse_loss_spec(spec)
    return ArmConfig(
        name=name,
        loss_fn=as_tinker_loss_fn(loss),
        loss_name=loss.name,
        learning_rate=0.05,
        group_size=4,
        groups_per_batch=2,
        max_tokens=6,
        updates_per_batch=2,
        **kw,
    )


def test_paired_arms_on_local_backend(tiny_dir, tmp_path):
    service = LocalServiceClient(device="cpu")
    task = EvenLengthTask()
    runs = {}
    for name, spec, side in (
        ("grpo", PPO, {}),
        ("dppo", DPPO, {"baseline": as_tinker_loss_fn(parse_loss_spec(PPO))}),
    ):
        client = service.create_lora_training_client(str(tiny_dir), rank=4, seed=0).result()
        runs[name] = (
            client,
            list(train_steps(ArmLoop(client, task, make_arm(name, spec, side_losses=side)), 0, 2)),
        )
    g, d = runs["grpo"][1], runs["dppo"][1]
    # Same base weights and sampling seeds: step 0 rollouts are identical, so are their rewards.
    assert g[0]["reward/mean"] == d[0]["reward/mean"]
    assert g[0]["tokens/completion_total"] == d[0]["tokens/completion_total"]
    assert [m["data/sampling_seeds"] for m in g] == [m["data/sampling_seeds"] for m in d]
    for m in g + d:
        assert m["optim/steps_executed"] == 2.0
        # update 1 runs on the snapshot's weights: trainer and sampler agree to float noise
        assert m["update1/gap/abs_logprob_max"] < 1e-4
    assert any(m["reward/frac_mixed"] > 0 for m in d)
    # update 2 follows one optim step at lr 0.05: the policy has moved
    assert max(m["update2/policy/drift_vs_sampler_q90"] for m in d) > 1e-4
    model_name = runs["dppo"][0].get_info().model_data.model_name
    gate = pilot_metrics(d, GATE_METRICS, base_model=model_name)
    assert gate["executed_updates_per_batch"] == 2.0 and gate["executed_base_model"] == str(
        tiny_dir
    )
    client = runs["dppo"][0]
    items = evaluate(
        client.save_weights_and_get_sampling_client().result(),
        task,
        task.test,
        renderer_for(client),
        max_tokens=6,
        batch=4,
    )
    again = evaluate(
        client.save_weights_and_get_sampling_client().result(),
        task,
        task.test,
        renderer_for(client),
        max_tokens=6,
        batch=2,
    )
    assert [i.completion for i in items] == [i.completion for i in again]  # greedy is deterministic
    assert accuracy(items) == sum(len(i.completion) % 2 == 0 for i in items) / 4
