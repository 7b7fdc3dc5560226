"""Engine: datum layout, advantages, minibatch split, paired arms, resume, gate metrics."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from itertools import islice

import pytest
import torch

from losslab.engine import (
    ArmConfig,
    ArmLoop,
    NonFiniteError,
    build_datum,
    group_advantages,
    keep_varied_groups,
    pilot_metrics,
    rl_step,
    sampling_seed,
    split_minibatches,
    train_steps,
)
from losslab.plan import GATE_METRICS
from losslab.runner.rundir import atomic_write_jsonl, read_jsonl
from losslab.tasks import Grade, Problem, extract_last_number, numeric_equal

from ._fakes import SAMPLER_LP, FakeTrainingClient, ppo_clip_loss, tv_mask_loss


@dataclass
class AddTask:
    """Hand-made task: "a+b" questions that all sum to 2, last-number grading, cookbook reward."""

    name: str = "add"
    train: list[Problem] = field(
        default_factory=lambda: [Problem(f"t{i}", f"{i % 3}+{2 - i % 3}", "2") for i in range(5)]
    )
    test: list[Problem] = field(default_factory=list)

    def messages(self, problem):
        return [{"role": "user", "content": problem.question}]

    def grade(self, problem, text, stopped):
        pred = extract_last_number(text)
        correct = numeric_equal(pred, problem.answer)
        fmt = stopped and pred is not None
        return Grade(float(correct) + 0.1 * (float(fmt) - 1), correct, fmt, pred)

    def describe(self):
        return {"name": self.name}


def train_arm(client, task, arm_config, steps, *, start_step=0, metrics_path=None):
    """The runner's loop (`engine.train_steps` over an `ArmLoop`), persisting like the runner:
    metrics.jsonl rewritten atomically after every step (rows of earlier steps kept)."""
    loop = ArmLoop(client, task, arm_config, next_step=start_step)
    rows = []
    if metrics_path is not None and start_step and metrics_path.is_file():
        rows = [r for r in read_jsonl(metrics_path) if r["step"] < start_step]
    for row in train_steps(loop, start_step, steps, arm=arm_config.name):
        rows.append(row)
        if metrics_path is not None:
            atomic_write_jsonl(metrics_path, rows)
        yield row


def arm(name="a", loss=None, **kw):
    settings = dict(group_size=4, groups_per_batch=2, max_tokens=8, updates_per_batch=2, seed=0)
    settings.update(kw)
    return ArmConfig(name=name, loss_fn=loss or ppo_clip_loss(), loss_name="ppo", **settings)


# ----------------------------------------------------------------------------- datums


def test_build_datum_matches_cookbook_layout():
    # full = [10, 11, 12, 20, 21]; ob_len = len(prompt) - 1 = 2 (trajectory_to_data, shifted by one)
    d = build_datum([10, 11, 12], [20, 21], [-0.5, -0.25], 0.7)
    assert d.model_input.to_ints() == [10, 11, 12, 20]
    inputs = {k: v.to_torch().tolist() for k, v in d.loss_fn_inputs.items()}
    assert inputs["target_tokens"] == [11, 12, 20, 21]
    assert inputs["logprobs"] == [0.0, 0.0, -0.5, -0.25]
    assert inputs["advantages"] == pytest.approx([0.0, 0.0, 0.7, 0.7])
    assert inputs["mask"] == [0.0, 0.0, 1.0, 1.0]
    assert d.loss_fn_inputs["target_tokens"].dtype == "int64"


def test_build_datum_rejects_mismatched_logprobs():
    with pytest.raises(ValueError, match="sampler_logprobs has 1 entries for 2"):
        build_datum([1, 2], [3, 4], [-1.0], 0.0)


def test_group_advantages_center_without_std():
    # rewards [1, 0, 0.9, -0.1]: mean 0.45 -> [0.55, -0.45, 0.45, -0.55]
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.9, -0.1]))
    assert adv.tolist() == pytest.approx([0.55, -0.45, 0.45, -0.55], abs=1e-7)
    assert group_advantages(torch.tensor([0.3, 0.3])).tolist() == [0.0, 0.0]


def test_split_minibatches_contiguous_and_exact():
    # edges int(linspace(0, 7, 4)) = int([0, 2.33, 4.67, 7]) = [0, 2, 4, 7] (cookbook split_list)
    assert split_minibatches(list(range(7)), 3) == [[0, 1], [2, 3], [4, 5, 6]]
    with pytest.raises(ValueError, match="cannot split 1 datums into 2"):
        split_minibatches([0], 2)


# ----------------------------------------------------------------------------- one step


def test_rl_step_datums_advantages_and_updates():
    client = FakeTrainingClient(completions=["2", "3"])
    task = AddTask()
    problems = task.train[:2]  # "0+2", "1+1": both 2
    m = rl_step(client, task, problems, arm(), step=0)
    # Each group: samples "2","3","2","3" -> rewards [1,0,1,0] (all stopped, all formatted).
    assert m["reward/mean"] == pytest.approx(0.5)
    assert m["reward/correct"] == pytest.approx(0.5)
    assert m["reward/format"] == 1.0
    assert m["reward/frac_mixed"] == 1.0
    # 2 groups x 4 = 8 datums -> 2 minibatches of 4, one optim_step each.
    assert client.fb_sizes == [4, 4]
    assert len(client.optim_calls) == 2 and m["optim/steps_executed"] == 2.0
    assert client.optim_calls[0].learning_rate == pytest.approx(1e-4)
    # ArmConfig's Adam defaults are tinker.AdamParams()'s (tinker 0.38.0: beta2 0.95, eps 1e-12)
    assert client.optim_calls[0].beta2 == 0.95 and client.optim_calls[0].eps == 1e-12
    # completion = one digit byte + <|im_end|> = 2 loss tokens per datum, 4 datums per update
    assert m["update1/tokens/loss"] == 8.0
    # First update: trainer == sampler (no shift) -> zero gap and drift.
    assert m["gap/abs_logprob_mean_first_update"] == 0.0
    assert m["update1/policy/drift_vs_sampler_q90"] == 0.0
    assert set(m["data/problem_ids"]) == {"t0", "t1"}
    assert m["time/step_s"] >= m["time/sample_s"] >= 0.0


def test_updates_per_batch_gives_that_many_optim_steps():
    for n in (1, 2, 4):
        client = FakeTrainingClient()
        m = rl_step(client, AddTask(), AddTask().train[:2], arm(updates_per_batch=n), step=0)
        assert len(client.optim_calls) == n == m["optim/steps_executed"]
        assert sum(client.fb_sizes) == 8 and len(client.fb_sizes) == n


def test_remove_constant_reward_groups_is_logged():
    client = FakeTrainingClient(completions=["2"])  # every sample correct -> constant groups
    m = rl_step(
        client, AddTask(), AddTask().train[:2], arm(remove_constant_reward_groups=True), step=0
    )
    # Both groups constant: the cookbook keeps the first one, so 4 zero-advantage datums train.
    assert m["reward/groups_dropped"] == 1.0 and m["data/datums"] == 4.0
    assert m["optim/steps_executed"] == 2.0 and client.fb_sizes == [2, 2]


def test_keep_varied_groups():
    assert keep_varied_groups([[1.0, 0.0], [1.0, 1.0], [0.0, 0.5]]) == [0, 2]
    assert keep_varied_groups([[1.0, 1.0], [0.0, 0.0]]) == [0]
    assert keep_varied_groups([]) == []


def test_fewer_datums_than_updates_runs_one_update_per_datum():
    client = FakeTrainingClient()
    task = AddTask()
    m = rl_step(client, task, task.train[:1], arm(group_size=2, updates_per_batch=4), step=0)
    assert client.fb_sizes == [1, 1] and m["optim/steps_executed"] == 2.0


def test_sampling_uses_plan_settings_and_derived_seeds():
    client = FakeTrainingClient()
    rl_step(client, AddTask(), AddTask().train[:2], arm(temperature=0.7, max_tokens=5), step=3)
    params = [c["params"] for c in client.sample_calls]
    assert [p.seed for p in params] == [sampling_seed(0, 3, 0), sampling_seed(0, 3, 1)]
    assert all(p.temperature == 0.7 and p.max_tokens == 5 for p in params)
    eot = client.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert all(p.stop == [eot] for p in params)
    assert all(c["num_samples"] == 4 for c in client.sample_calls)
    assert len({sampling_seed(0, s, g) for s in range(20) for g in range(8)}) == 160


# ----------------------------------------------------------------------------- arms


def test_paired_arms_see_identical_prompts_and_seeds(tmp_path):
    task = AddTask()
    clients = {}
    records = {}
    for name, loss in (("grpo", ppo_clip_loss()), ("dppo", tv_mask_loss())):
        clients[name] = FakeTrainingClient(shifts=[0.3])
        records[name] = list(
            train_arm(
                clients[name],
                task,
                arm(name, loss),
                steps=3,
                metrics_path=tmp_path / f"{name}.jsonl",
            )
        )
    a, b = clients["grpo"].sample_calls, clients["dppo"].sample_calls
    assert len(a) == len(b) == 5  # steps of 2, 2 and 1 groups
    assert [c["prompt"] for c in a] == [c["prompt"] for c in b]
    assert [c["params"].seed for c in a] == [c["params"].seed for c in b]
    ids = [r["data/problem_ids"] for r in records["grpo"]]
    assert ids == [r["data/problem_ids"] for r in records["dppo"]]
    # data cursor = step: batches [t0 t1] [t2 t3] [t4] of the 5 problems (short last batch)
    assert ids == [["t0", "t1"], ["t2", "t3"], ["t4"]]
    # the arms differ in their loss metrics only where drift exists (update 2)
    assert records["grpo"][0]["update2/loss/clip_fraction"] == pytest.approx(0.5)
    assert read_jsonl(tmp_path / "dppo.jsonl")[2]["step"] == 2


def test_resume_repeats_the_uninterrupted_step(tmp_path):
    task = AddTask()
    full = FakeTrainingClient()
    list(train_arm(full, task, arm(), steps=3, metrics_path=tmp_path / "m.jsonl"))
    resumed = FakeTrainingClient()
    out = list(
        train_arm(resumed, task, arm(), steps=3, start_step=2, metrics_path=tmp_path / "m.jsonl")
    )
    assert [r["step"] for r in out] == [2]
    assert resumed.sample_calls[0]["prompt"] == full.sample_calls[4]["prompt"]
    assert resumed.sample_calls[0]["params"].seed == full.sample_calls[4]["params"].seed
    assert [r["step"] for r in read_jsonl(tmp_path / "m.jsonl")] == [0, 1, 2]


def test_nonfinite_loss_stops_before_optim_and_keeps_log(tmp_path):
    # fb call 3 = step 1, update 1 (2 fb calls per step)
    client = FakeTrainingClient(nan_at_call=3)
    path = tmp_path / "m.jsonl"
    match = r"arm 'a' step 1 update 1 \(stopped before optim_step\): train/loss_sum=nan"
    with pytest.raises(NonFiniteError, match=match) as err:
        list(train_arm(client, AddTask(), arm(), steps=3, metrics_path=path))
    assert len(client.optim_calls) == 2  # only step 0's updates ran
    assert [r["step"] for r in read_jsonl(path)] == [0]  # step 0 is kept, step 1 is not logged
    # the failing step's partial record travels on the error: its rollouts and the bad update
    assert err.value.record["step"] == 1 and "reward/mean" in err.value.record
    assert math.isnan(err.value.record["train/loss_sum"])


def test_arm_config_rejects_bad_values():
    with pytest.raises(ValueError, match="updates_per_batch must be an integer >= 1, got 0"):
        arm(updates_per_batch=0)
    with pytest.raises(ValueError, match="learning_rate must be > 0"):
        arm(learning_rate=-1.0)


# ----------------------------------------------------------------------------- pilot gate


def test_pilot_metrics_on_hand_built_case(tmp_path):
    """Treatment = TV mask (delta 0.1), baseline = PPO clip 0.2 as a side loss.

    Every sampled token has log q = -1. At update 2 the fake trainer's log-prob is
    -1 + s (one optim step since the snapshot), with s = 0.05 at step 0 and 0.3 at step 1.
    Each group has rewards [1, 0, 1, 0] -> A = [+.5, -.5, +.5, -.5]; every completion has 2
    tokens, so half of the loss tokens have A > 0. No token has A = 0, so the gate fractions'
    A != 0 denominator is every loss token here (A = 0 tokens: the test
    test_grpo_clip_fraction_leaves_zero_advantage_tokens_out).
      step 0: |dp| = e^-0.95 - e^-1 = 0.0188616 < 0.1 -> mask 0; r = e^0.05 = 1.051 -> clip 0
      step 1: |dp| = e^-0.7 - e^-1 = 0.1287059 > 0.1 -> A>0 tokens masked: 0.5;
              r = e^0.3 = 1.3499 > 1.2 -> A>0 tokens clipped: 0.5
    Means over the 2 pilot steps: mask 0.25, clip 0.25, drift q90 (all |dp| equal) 0.0737837.
    """
    client = FakeTrainingClient(
        shifts=[0.05, 0.3], model_name="HuggingFaceTB/SmolLM2-135M-Instruct"
    )
    treatment = arm("dppo", tv_mask_loss(0.1), side_losses={"baseline": ppo_clip_loss(0.2)})
    steps = list(islice(train_arm(client, AddTask(), treatment, steps=10), 2))
    got = pilot_metrics(steps, GATE_METRICS, base_model=client.get_info().model_data.model_name)
    drift_0 = math.exp(SAMPLER_LP + 0.05) - math.exp(SAMPLER_LP)
    drift_1 = math.exp(SAMPLER_LP + 0.3) - math.exp(SAMPLER_LP)
    assert got["dppo_masked_token_fraction"] == pytest.approx(0.25)
    assert got["grpo_clip_fraction"] == pytest.approx(0.25)
    assert got["policy_drift_abs_p_q90"] == pytest.approx((drift_0 + drift_1) / 2, rel=1e-5)
    assert (drift_0 + drift_1) / 2 == pytest.approx(0.0737837, abs=1e-7)
    assert got["executed_updates_per_batch"] == 2.0
    assert got["executed_base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    # the side loss did not step: still exactly 2 optim steps per batch
    assert len(client.optim_calls) == 4


def test_pilot_metrics_flags_inconsistent_updates_and_missing_baseline():
    base = {
        "update2/loss/clip_fraction": 0.1,
        "update2/dppo/mask_fraction_nonzero_adv": 0.1,
        "update2/policy/drift_vs_sampler_q90": 0.01,
    }
    steps = [
        {
            **base,
            "step": 0,
            "optim/steps_executed": 2.0,
            "update2/baseline/loss/clip_fraction_nonzero_adv": 0.0,
        },
        {
            **base,
            "step": 1,
            "optim/steps_executed": 1.0,
            "update2/baseline/loss/clip_fraction_nonzero_adv": 0.0,
        },
    ]
    got = pilot_metrics(steps, GATE_METRICS, base_model="m")
    assert math.isnan(got["executed_updates_per_batch"])
    assert got["executed_updates_per_batch_detail"] == "2,1"
    with pytest.raises(
        KeyError, match="baseline/loss/clip_fraction_nonzero_adv' is missing at steps \\[0\\]"
    ):
        pilot_metrics(
            [{**base, "step": 0, "optim/steps_executed": 2.0}], GATE_METRICS, base_model="m"
        )


def test_grpo_clip_fraction_leaves_zero_advantage_tokens_out():
    """The gate's GRPO clip fraction has the DPPO mask fraction's denominator (A != 0 tokens,
    Stable-RL's pg_clipfrac), read from the real `ppo` loss as the baseline side loss.

    Four loss tokens, r = e^0.3 = 1.35 > 1.2 on each, A = (+1, +1, 0, 0): the clip zeroes the
    two A > 0 tokens (Tinker's ppo never clips A = 0), so the all-token share is 2/4 and the
    A != 0 share 2/2."""
    from losslab.losses import get_loss
    from losslab.losses.data import TokenData

    lp = [torch.tensor([-0.7, -0.7, -0.7, -0.7], requires_grad=True)]
    batch = TokenData(
        logprobs_D=lp,
        sampler_logprobs_D=[torch.full((4,), -1.0)],
        advantages_D=[torch.tensor([1.0, 1.0, 0.0, 0.0])],
        mask_D=[torch.ones(4)],
    )
    metrics = get_loss("ppo")(batch).metrics
    assert metrics["loss/clip_fraction"] == pytest.approx(0.5)
    row = {f"update2/baseline/{k}": v for k, v in metrics.items()}
    row.update({"step": 0, "update2/dppo/mask_fraction_nonzero_adv": 0.0})
    row.update({"update2/policy/drift_vs_sampler_q90": 0.0, "optim/steps_executed": 2.0})
    got = pilot_metrics([row], GATE_METRICS, base_model="m")
    assert got["grpo_clip_fraction"] == pytest.approx(1.0)


def test_metrics_jsonl_is_json_per_line(tmp_path):
    client = FakeTrainingClient()
    list(train_arm(client, AddTask(), arm(), steps=1, metrics_path=tmp_path / "m.jsonl"))
    lines = (tmp_path / "m.jsonl").read_text().splitlines()
    record = json.loads(lines[0])
    for key in (
        "reward/mean",
        "update1/loss/clip_fraction",
        "update2/policy/drift_vs_sampler_q50",
        "time/sample_s",
        "optim/steps_executed",
        "update2/policy/ratio_vs_sampler_q90",
        "update1/grad/logprob_norm",
    ):
        assert key in record, key
    assert replace(arm(), name="b").name == "b"
