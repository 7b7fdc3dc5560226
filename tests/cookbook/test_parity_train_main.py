"""One step of tinker-cookbook's `rl.train.main` (math_rl GSM8K) on losslab's local backend.

The cookbook's own loop (dataset builder, rollouts, advantages, datums, `train_step`, logging)
runs unchanged; only `tinker.ServiceClient` is pointed at `LocalServiceClient` with a tiny random
Qwen3 from a config, and the GSM8K hub load is served from the shared copy. Needs the `cookbook`
extra and ../shared/gsm8k.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from ._cookbook import require_cookbook

require_cookbook()

import tinker  # noqa: E402
from tinker_cookbook.recipes.math_rl import math_env  # noqa: E402
from tinker_cookbook.rl import train  # noqa: E402

from losslab.backends.local import LocalServiceClient, make_tiny_model_dir  # noqa: E402

GSM8K = Path(__file__).resolve().parents[3] / "shared" / "gsm8k"


def test_one_rl_train_main_step_runs_on_the_local_backend(tmp_path, monkeypatch):
    import datasets

    rows: dict[str, list[dict]] = {}
    for split in ("train", "test"):
        path = GSM8K / f"{split}.jsonl"
        if not path.is_file():
            pytest.skip(f"{path} is absent (the shared GSM8K copy)")
        # short questions only: the tiny model's byte-level prompt must fit its 512 positions
        every = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        rows[split] = [r for r in every if len(r["question"]) < 160][:16]
    monkeypatch.setattr(
        math_env,
        "load_dataset",
        lambda *args, split="train", **kw: datasets.Dataset.from_list(rows[split]),
    )
    model = make_tiny_model_dir(tmp_path / "tiny-qwen3", arch="qwen3", seed=0)
    made: list[LocalServiceClient] = []

    def local_service_client(**sdk_kwargs):  # base_url, user_metadata, display_name
        made.append(LocalServiceClient(device="cpu", state_dir=tmp_path / "states"))
        return made[-1]

    monkeypatch.setattr(tinker, "ServiceClient", local_service_client)
    config = train.Config(
        learning_rate=1e-4,
        dataset_builder=math_env.Gsm8kDatasetBuilder(
            batch_size=2,
            model_name_for_tokenizer=str(model),
            renderer_name="qwen3_instruct",
            group_size=2,
        ),
        model_name=str(model),
        recipe_name="losslab_parity_test",
        max_tokens=8,
        log_path=str(tmp_path / "log"),
        renderer_name="qwen3_instruct",
        lora_rank=4,
        eval_every=0,
        save_every=0,
        max_steps=1,
    )
    asyncio.run(train.main(config))
    assert len(made) == 1
    metrics = [
        json.loads(line)
        for line in (tmp_path / "log" / "metrics.jsonl").read_text().splitlines()
        if line.strip()
    ]
    (step0,) = [m for m in metrics if m.get("progress/batch") == 0]
    # the cookbook graded its rollouts with MathEnv and ran its optimizer step on our client
    assert -0.1 <= step0["env/all/reward/total"] <= 1.0
    assert step0["optim/lr"] == 1e-4
    assert step0["env/all/total_episodes"] == 4  # batch_size 2 groups x group_size 2
    assert step0["tokens/trained"] > 0 and step0["grad_norm:mean"] >= 0.0
    # sampled and trained on the same weights: the sampler's and the trainer's log-probs agree,
    # so the cookbook's KL(sample || train) estimate is float noise
    assert abs(step0["optim/kl_sample_train_v1"]) < 1e-3
    assert (tmp_path / "log" / "checkpoints.jsonl").read_text().strip()  # the final save ran
