"""tinker-cookbook 0.6.1's own code on the local backend: one test per failure in issue #12.

1. `create_sampling_client(path, record_stability_info=...)`: the cookbook's periodic-checkpoint
   path (`rl.train.save_checkpoint_and_get_sampling_client` with a `CheckpointManager`).
2. `create_rest_client`: renderer-name metadata of a checkpoint (the resume check), resuming
   from `checkpoints.jsonl`, and the rolling-checkpoint deletion.
3. `stable_reinforce` and `gspo` as built-ins: rollouts -> `assemble_training_data` ->
   `train_step`.
4. `.coroutine()`: `rl.metrics.incorporate_kl_penalty`, `compute_post_kl` and the distillation
   `incorporate_kl_penalty`.
5. `*_async` and futures that act as the client: `train_step` and `save_checkpoint_async` given
   the unresolved `create_lora_training_client(...)` future (the 0.5.8 rl_loop style); the
   `*_async` methods in the Tinker docs' double-await pattern (no 0.6.1 cookbook module calls
   them on a client: only `capture.instrument`, which patches the SDK classes themselves).
6. Batching under `asyncio.gather`: the cookbook's `do_group_rollout` for 2 groups x 4 envs.

Needs the `cookbook` extra (`make install-cookbook`); skipped without it (`_cookbook.py`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import warnings
from functools import partial
from pathlib import Path

import pytest
import torch
from tinker import types

from losslab.backends.local import LocalSamplingClient, LocalServiceClient, make_tiny_model_dir

from ._cookbook import require_cookbook

require_cookbook()

from tinker_cookbook import checkpoint_utils, renderers  # noqa: E402
from tinker_cookbook.completers import TinkerTokenCompleter  # noqa: E402
from tinker_cookbook.distillation import train_on_policy  # noqa: E402
from tinker_cookbook.recipes.math_rl.math_env import MathEnv  # noqa: E402
from tinker_cookbook.rl import metrics as rl_metrics  # noqa: E402
from tinker_cookbook.rl import train as rl_train  # noqa: E402
from tinker_cookbook.rl.data_processing import assemble_training_data  # noqa: E402
from tinker_cookbook.rl.problem_env import ProblemGroupBuilder  # noqa: E402
from tinker_cookbook.rl.rollouts import do_group_rollout  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _threads():
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    return str(make_tiny_model_dir(tmp_path_factory.mktemp("cb") / "llama", arch="llama", seed=0))


@pytest.fixture
def service(tmp_path) -> LocalServiceClient:
    return LocalServiceClient(device="cpu", state_dir=tmp_path / "states")


def _trained(service, model, **kwargs):
    """A client one Adam step away from the base, so policy and base differ."""
    tc = service.create_lora_training_client(model, rank=4, seed=0, **kwargs).result()
    data = [
        types.Datum(
            model_input=types.ModelInput.from_ints([257, 84, 82, 68, 81]),
            loss_fn_inputs={"target_tokens": [84, 82, 68, 81, 198], "weights": [1.0] * 5},
        )
    ]
    tc.forward_backward(data, "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=0.05)).result()
    return tc


def _groups(tc, sampler, n_groups=2, n_envs=4):
    """Cookbook rollouts: MathEnv groups (role_colon renderer) through TinkerTokenCompleter."""
    renderer = renderers.get_renderer("role_colon", tc.get_tokenizer())
    policy = TinkerTokenCompleter(sampler, max_tokens=6)
    builders = [
        ProblemGroupBuilder(
            env_thunk=partial(MathEnv, f"What is {g} + 1?", str(g + 1), renderer),
            num_envs=n_envs,
        )
        for g in range(n_groups)
    ]

    async def rollouts():
        return await asyncio.gather(*[do_group_rollout(b, policy) for b in builders])

    return asyncio.run(rollouts())


def _data(tc, sampler):
    """Datums exactly as the cookbook assembles them, with nonzero advantages (the tiny model
    earns no reward, so the advantages are set to +-1 per group instead of computed)."""
    groups = _groups(tc, sampler)
    advantages = [torch.tensor([1.0, -1.0, 0.5, -0.5]) for _ in groups]
    data, _ = assemble_training_data(groups, advantages)
    return data


# --------------------------------------------------------------------------- 1. stability info
def test_1_periodic_checkpoint_sampler_takes_record_stability_info(service, tiny_model, tmp_path):
    tc = _trained(service, tiny_model)
    mgr = checkpoint_utils.CheckpointManager(tc, service, str(tmp_path), save_every=2)

    async def both_paths():
        due, _ = await rl_train.save_checkpoint_and_get_sampling_client(
            tc, mgr, i_batch=2, record_stability_info=True
        )
        not_due, _ = await rl_train.save_checkpoint_and_get_sampling_client(
            tc, mgr, i_batch=3, record_stability_info=True
        )
        return due, not_due

    due, not_due = asyncio.run(both_paths())
    record = json.loads((tmp_path / "checkpoints.jsonl").read_text().splitlines()[0])
    assert record["name"] == "000002" and record["state_path"] != record["sampler_path"]
    for sampler in (due, not_due):
        seq = (
            sampler.sample(
                types.ModelInput.from_ints([257, 84]), 1, types.SamplingParams(max_tokens=2)
            )
            .result()
            .sequences[0]
        )
        assert service.recorded_stability_info(seq.sequence_id)


# --------------------------------------------------------------------------- 2. REST client
def test_2_renderer_metadata_resume_and_rolling_deletion(service, tiny_model, tmp_path, caplog):
    metadata: dict[str, str] = {}
    checkpoint_utils.add_renderer_name_to_user_metadata(metadata, "role_colon")
    tc = service.create_lora_training_client(
        tiny_model, rank=4, seed=0, user_metadata=metadata
    ).result()
    log_path = str(tmp_path)
    paths = checkpoint_utils.save_checkpoint(tc, "initial", log_path, {"batch": 1}, kind="both")
    assert (
        checkpoint_utils.get_renderer_name_from_checkpoint(service, paths["state_path"])
        == "role_colon"
    )
    with caplog.at_level(logging.INFO, logger="tinker_cookbook.checkpoint_utils"):
        asyncio.run(
            checkpoint_utils.check_renderer_name_for_checkpoint_async(
                service, paths["state_path"], "role_colon"
            )
        )
    assert "Renderer metadata matches" in caplog.text
    # resume as rl.train.main does: last checkpoint -> client with optimizer state
    resume = checkpoint_utils.get_last_checkpoint(log_path)
    resumed = asyncio.run(
        _await(
            service.create_training_client_from_state_with_optimizer(
                resume.state_path, user_metadata=metadata
            )
        )
    )
    assert resumed.optimizer_config() == tc.optimizer_config()
    # rolling checkpoints: each new one deletes the previous through the REST client, and
    # finalize deletes the last (CheckpointManager semantics)
    mgr = checkpoint_utils.CheckpointManager(tc, service, log_path, rolling_save_every=1)

    async def rolling_saves_then_finalize():
        await mgr.maybe_save_rolling_async(1, {"batch": 1})
        await mgr.maybe_save_rolling_async(2, {"batch": 2})
        await mgr.finalize_async()

    with caplog.at_level(logging.INFO, logger="tinker_cookbook.checkpoint_utils"):
        asyncio.run(rolling_saves_then_finalize())
    assert "Failed to delete rolling checkpoint" not in caplog.text
    rolling = [c for c in checkpoint_utils.load_checkpoints_file(log_path) if c.get("rolling")]
    assert [c.name for c in rolling] == ["000001", "000002"]
    assert caplog.text.count("Deleted rolling checkpoint") == 2
    assert not any(Path(c.state_path).exists() for c in rolling)
    assert Path(paths["state_path"]).exists()  # the non-rolling checkpoint is kept


async def _await(future):
    return await future


# --------------------------------------------------------------------------- 3. built-ins
def test_3_stable_reinforce_and_gspo_train_steps(service, tiny_model):
    tc = _trained(service, tiny_model)
    sampler = tc.save_weights_and_get_sampling_client(record_stability_info=True).result()
    data = _data(tc, sampler)
    assert all(d.loss_fn_input_spans is not None for d in data)
    before = tc.lora_state()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the stand-in warning (builtin_losses)
        lps = asyncio.run(rl_train.train_step(data, tc, 1e-3, 1, "stable_reinforce"))
    assert len(lps) == len(data) and all(torch.isfinite(lp).all() for lp in lps)
    moved = tc.lora_state()
    assert any(not torch.equal(before[k], moved[k]) for k in before)
    # gspo: the same datums with rl_loop.py's sequence_ratio_mask (the sampled tokens)
    gspo_data = [
        types.Datum(
            d.model_input,
            {**d.loss_fn_inputs, "sequence_ratio_mask": d.loss_fn_inputs["mask"].to_torch()},
        )
        for d in data
    ]
    metrics: dict = {}
    asyncio.run(rl_train.train_step(gspo_data, tc, 1e-3, 2, "gspo", metrics=metrics))
    assert metrics["step:max"] == 4.0  # _trained's step, stable_reinforce's, two gspo substeps
    # without a recording sampler, stable_reinforce is refused as on Tinker
    plain = tc.save_weights_and_get_sampling_client().result()
    with pytest.raises(ValueError, match="record_stability_info=True"):
        asyncio.run(rl_train.train_step(_data(tc, plain), tc, 1e-3, 1, "stable_reinforce"))


# --------------------------------------------------------------------------- 4. coroutine()
def test_4_kl_penalty_post_kl_and_distillation_use_coroutine(service, tiny_model):
    tc = _trained(service, tiny_model)
    sampler = tc.save_weights_and_get_sampling_client().result()
    base = service.create_sampling_client(base_model=tiny_model).result()
    data = _data(tc, sampler)
    # expected KL(policy || base) estimate, from the local clients directly
    diffs, mask_total = 0.0, 0.0
    for d in data:
        full = d.model_input.append_int(int(d.loss_fn_inputs["target_tokens"].data[-1]))
        base_lp = torch.tensor(base.compute_logprobs(full).result()[1:])
        mask = d.loss_fn_inputs["mask"].to_torch()
        diffs += float(((d.loss_fn_inputs["logprobs"].to_torch() - base_lp) * mask).sum())
        mask_total += float(mask.sum())
    before = [d.loss_fn_inputs["advantages"].to_torch().clone() for d in data]
    kl, _usage = asyncio.run(rl_metrics.incorporate_kl_penalty(data, base, 0.1, 0.0))
    assert abs(kl["kl_policy_base"] - diffs / mask_total) <= 1e-5
    assert abs(kl["kl_policy_base"]) > 1e-4  # the trained policy differs from the base
    assert any(
        not torch.equal(b, d.loss_fn_inputs["advantages"].to_torch())
        for b, d in zip(before, data, strict=True)
    )
    post, _ = asyncio.run(rl_metrics.compute_post_kl(data, sampler))
    assert abs(post["kl_pre_post_v1"]) <= 1e-5  # same weights that sampled: no drift
    distill = asyncio.run(
        train_on_policy.incorporate_kl_penalty(data, [base] * len(data), [0] * len(data), 1.0, 0.0)
    )
    assert any("teacher_kl" in k for k in distill)


# --------------------------------------------------------------------------- 5. async / futures
def test_5_unresolved_client_future_runs_cookbook_train_step(service, tiny_model, tmp_path):
    future = service.create_lora_training_client(tiny_model, rank=4, seed=0)  # no .result()
    sampler = future.result().save_weights_and_get_sampling_client().result()
    data = _data(future.result(), sampler)
    with pytest.warns(FutureWarning, match="Call .result"):
        lps = asyncio.run(rl_train.train_step(data, future, 1e-3, 1, "importance_sampling"))
        paths = asyncio.run(
            checkpoint_utils.save_checkpoint_async(future, "f", str(tmp_path), {"batch": 0})
        )
    assert len(lps) == len(data) and future.result().describe()["steps"] == 1
    assert (tmp_path / "checkpoints.jsonl").is_file() and "state_path" in paths

    async def docs_pattern():  # Tinker docs: the *_async ops return a future to await again
        tc = await service.create_lora_training_client(tiny_model, rank=4, seed=0)
        fb = await (await tc.forward_backward_async(data, "importance_sampling"))
        step = await (await tc.optim_step_async(types.AdamParams(learning_rate=1e-3)))
        client = await tc.save_weights_and_get_sampling_client_async()
        response = await client.sample_async(
            data[0].model_input, 1, types.SamplingParams(max_tokens=2)
        )
        return fb, step, response

    fb, step, response = asyncio.run(docs_pattern())
    direct = rl_train._training_logprobs_from_fwd_bwd(fb)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(direct, lps, strict=True))
    assert step.metrics["step:max"] == 1.0 and len(response.sequences) == 1


# --------------------------------------------------------------------------- 6. batching
def test_6_gathered_cookbook_rollouts_run_as_one_generation(service, tiny_model, monkeypatch):
    """Issue #12 measured 8 one-row generations for 2 groups x 4 envs; now: one of 8 rows."""
    tc = service.create_lora_training_client(tiny_model, rank=4, seed=0).result()
    sampler = tc.save_weights_and_get_sampling_client().result()
    requests_per_generation: list[int] = []
    real_run = LocalSamplingClient._run

    def spy(self, batch):
        requests_per_generation.append(sum(r.num_samples for r in batch))
        return real_run(self, batch)

    monkeypatch.setattr(LocalSamplingClient, "_run", spy)
    groups = _groups(tc, sampler, n_groups=2, n_envs=4)
    assert requests_per_generation == [8]
    assert [len(g.trajectories_G) for g in groups] == [4, 4]
