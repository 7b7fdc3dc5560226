"""`make gpu-check`: the plan's RL step at real size on one GPU, through the local backend.

    .venv/bin/python bench/gpu_check.py          # CUDA: writes bench/results_gpu.json
    .venv/bin/python bench/gpu_check.py --dry --out /tmp/gpu_check.json   # CPU, tiny (make test)

The model is Qwen/Qwen3.5-2B's architecture from its published config
(`backends/local/public_configs/Qwen--Qwen3.5-2B.json`: 18 Gated-DeltaNet + 6 full-attention
layers, hidden 2048, 1.88B parameters with the tied unembedding) with random weights drawn on
the device in bf16 and saved to a scratch folder (nothing downloaded; the offline byte-level
tokenizer, since the step never decodes text). The step is the plan's: 32 prompts x 8 samples
x 512 new tokens at T = 1 (no early stop, `stop=[]`: a random model's completions run to the
cap, the projection's upper bound), LoRA rank 32, GRPO's clipped-ratio loss (eps 0.2) through
`forward_backward_custom`, 2 minibatch updates with AdamW lr 2e-5, on a `LocalServiceClient`
with its CUDA defaults (the runner's). Prompts are random token ids of `--prompt-tokens` (128,
about GSM8K's with a chat template) and advantages group-centred random rewards, seeded.

It reports tokens/s of sampling (decoded tokens) and training (prefix-trie tokens run), the
step time, the peak GPU memory, which linear-attention kernels ran
(`linear_attention.kernel_report`: flash-linear-attention and causal-conv1d when the `gpu`
extra is installed, else the torch paths) and the cost projection of the same step
(`stats.cost.step_work` FLOPs at the projection's assumed utilisation of the detected GPU's
peak), with the achieved utilisation. `--dry` runs the same code on the CPU with the config
shrunk (`tiny.shrink_config`), float32, 2 prompts x 2 samples x 4 tokens, for the test suite.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BASE_MODEL = "Qwen/Qwen3.5-2B"
GRPO_CLIP = "ppo(clip_low_threshold=0.8, clip_high_threshold=1.2)"
PLAN_STEP = {"prompts": 32, "samples": 8, "max_tokens": 512, "updates": 2, "rank": 32}
DRY_STEP = {"prompts": 2, "samples": 2, "max_tokens": 4, "updates": 2, "rank": 4}
LEARNING_RATE = 2e-5
BUDGET_S = 8 * 60


def build_model(folder: Path, dry: bool, device: str, dtype) -> dict[str, Any]:
    """Random weights of the published architecture (shrunk when `dry`), drawn on `device`."""
    import torch
    from transformers import AutoModelForCausalLM

    from losslab.backends.local.models import public_config
    from losslab.backends.local.tiny import make_tiny_tokenizer, shrink_config

    tokenizer = make_tiny_tokenizer()
    config = public_config(BASE_MODEL)
    if dry:
        config = shrink_config(config, vocab_size=len(tokenizer))
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config.eos_token_id = config.pad_token_id = eos if dry else config.eos_token_id
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.save_pretrained(str(folder), safe_serialization=True)
    tokenizer.save_pretrained(str(folder))
    return {"config": config, "params": sum(p.numel() for p in model.parameters())}


def plan_step(service, folder: Path, job: dict[str, int], prompt_tokens: int) -> dict[str, Any]:
    """One RL step of `job` through the local backend; seconds and token counts per phase."""
    import torch
    from tinker import types

    from losslab.backends.local.logprobs import plan_microbatches
    from losslab.engine.datums import build_datum, group_advantages, split_minibatches
    from losslab.losses import as_tinker_loss_fn, parse_loss_spec

    tc = service.create_lora_training_client(
        str(folder),
        rank=job["rank"],
        seed=0,
        adam_params=types.AdamParams(learning_rate=LEARNING_RATE),
    ).result()
    vocab = tc._vocab
    g = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(0, vocab, (prompt_tokens,), generator=g).tolist()
        for _ in range(job["prompts"])
    ]
    params = types.SamplingParams(max_tokens=job["max_tokens"], temperature=1.0, stop=[], seed=None)
    synchronize = torch.cuda.synchronize if service.device.type == "cuda" else (lambda: None)

    synchronize()
    t0 = time.perf_counter()
    sampler = tc.save_weights_and_get_sampling_client().result()
    futures = [
        sampler.sample(types.ModelInput.from_ints(p), job["samples"], params) for p in prompts
    ]
    responses = [f.result() for f in futures]
    synchronize()
    sampling_s = time.perf_counter() - t0

    data = []
    for prompt, resp in zip(prompts, responses, strict=True):
        rewards = torch.rand(len(resp.sequences), generator=g)
        for seq, adv in zip(resp.sequences, group_advantages(rewards).tolist(), strict=True):
            data.append(build_datum(prompt, list(seq.tokens), list(seq.logprobs), adv))
    loss_fn = as_tinker_loss_fn(parse_loss_spec(GRPO_CLIP))
    minibatches = split_minibatches(data, job["updates"])
    trie_tokens = [
        sum(
            mb.tokens
            for mb in plan_microbatches(
                [d.model_input.to_ints() for d in batch],
                service.max_tokens_per_batch,
                tc._share_prefix,
            )
        )
        for batch in minibatches
    ]
    synchronize()
    t1 = time.perf_counter()
    for batch in minibatches:
        tc.forward_backward_custom(batch, loss_fn).result()
        tc.optim_step(types.AdamParams(learning_rate=LEARNING_RATE)).result()
    synchronize()
    training_s = time.perf_counter() - t1
    decoded = sum(len(s.tokens) for r in responses for s in r.sequences)
    return {
        "sampling_s": sampling_s,
        "training_s": training_s,
        "step_s": sampling_s + training_s,
        "prompt_tokens": prompt_tokens,
        "decoded_tokens": decoded,
        "completion_tokens_mean": decoded / len(data),
        "training_datum_tokens": sum(len(d.model_input.to_ints()) for d in data),
        "training_trie_tokens": sum(trie_tokens),
        "trie_tokens_per_minibatch": trie_tokens,
        "max_tokens_per_batch": service.max_tokens_per_batch,
        "two_phase": any(
            len(
                plan_microbatches(
                    [d.model_input.to_ints() for d in b],
                    service.max_tokens_per_batch,
                    tc._share_prefix,
                )
            )
            > 1
            for b in minibatches
        ),
        "sampling_tokens_per_s": decoded / sampling_s,
        "training_tokens_per_s": sum(trie_tokens) / training_s,
        "share_prefix": tc._share_prefix,
        "describe": tc.describe(),
    }


def projection(config, step: dict[str, Any], job: dict[str, int], gpu_name: str) -> dict[str, Any]:
    """`stats.cost`'s FLOPs of the measured step and its roofline time at the assumed
    utilisation of the GPU class named like the device; achieved utilisation = FLOPs /
    (seconds x peak)."""
    from losslab.stats.cost import (
        DEFAULT_UTILISATION,
        GPU_CLASSES,
        architecture_from_config,
        params_from_config,
        step_work,
    )

    arch, n = architecture_from_config(config), params_from_config(config)
    work = step_work(
        arch,
        n,
        groups=job["prompts"],
        group_size=job["samples"],
        prompt_tokens=step["prompt_tokens"],
        completion_tokens=step["completion_tokens_mean"],
        updates=job["updates"],
        eval_tokens=job["max_tokens"],
        max_tokens_per_batch=step["max_tokens_per_batch"],
    )
    gpu = next((g for key, g in GPU_CLASSES.items() if key.split("-")[0] in gpu_name), None)
    out: dict[str, Any] = {
        "params": n,
        "architecture": arch.name,
        "training_path": work.training_path,
        "sampling_flops": work.sampling_flops,
        "training_flops": work.training_flops,
        "assumed_utilisation": DEFAULT_UTILISATION,
        "gpu_class": gpu.name if gpu else None,
    }
    if gpu is not None:
        peak = gpu.bf16_tflops * 1e12
        out["projected_sampling_s"] = work.sampling_flops / (peak * DEFAULT_UTILISATION)
        out["projected_training_s"] = work.training_flops / (peak * DEFAULT_UTILISATION)
        out["achieved_utilisation_sampling"] = work.sampling_flops / (step["sampling_s"] * peak)
        out["achieved_utilisation_training"] = work.training_flops / (step["training_s"] * peak)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry", action="store_true", help="CPU, tiny config, a few tokens")
    ap.add_argument("--out", default=None, help="default bench/results_gpu.json")
    ap.add_argument("--prompt-tokens", type=int, default=None, help="default 128 (dry: 6)")
    args = ap.parse_args()
    import torch

    from losslab.atomic import atomic_write_json
    from losslab.backends.local import LocalServiceClient
    from losslab.backends.local.linear_attention import kernel_report, kernels_for

    if not args.dry and not torch.cuda.is_available():
        raise SystemExit(
            "gpu-check: no CUDA device here. It needs one H100/H200-class GPU (see "
            "docs/benchmarks.md); `bench/gpu_check.py --dry` runs the same code on the CPU"
        )
    device = "cpu" if args.dry else "cuda"
    dtype = torch.float32 if args.dry else torch.bfloat16
    job = DRY_STEP if args.dry else PLAN_STEP
    prompt_tokens = args.prompt_tokens or (6 if args.dry else 128)
    out = Path(args.out) if args.out else HERE / "results_gpu.json"
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="losslab-gpu-check-") as tmp:
        folder = Path(tmp) / "model"
        built = build_model(folder, args.dry, device, dtype)
        build_s = time.perf_counter() - started
        if device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        service = LocalServiceClient(
            device=device,
            dtype="float32" if args.dry else "bfloat16",
            state_dir=Path(tmp) / "states",
        )
        step = plan_step(service, folder, job, prompt_tokens)
    gpu_name = torch.cuda.get_device_name() if device == "cuda" else "cpu (dry run)"
    record = {
        "what": "the plan's RL step on Qwen3.5-2B's architecture (random weights) through the "
        "local backend"
        + (" -- DRY RUN: tiny config on the CPU, not a measurement" if args.dry else ""),
        "dry": args.dry,
        "device": gpu_name,
        "dtype": str(dtype),
        "job": {
            **job,
            "prompt_tokens": prompt_tokens,
            "learning_rate": LEARNING_RATE,
            "loss": GRPO_CLIP,
        },
        "model_params": built["params"],
        "build_and_save_s": build_s,
        "step": {k: v for k, v in step.items() if k != "describe"},
        "peak_gpu_memory_gib": torch.cuda.max_memory_allocated() / 2**30
        if device == "cuda"
        else None,
        "kernels_selected": kernels_for(device),
        "kernels_ran": kernel_report(),
        "client": step["describe"],
        "projection": projection(built["config"], step, job, gpu_name),
        "wall_s": time.perf_counter() - started,
        "budget_s": BUDGET_S,
    }
    record["within_budget"] = record["wall_s"] <= BUDGET_S
    atomic_write_json(out, record, indent=1)
    print(
        json.dumps(
            {
                k: record[k]
                for k in (
                    "device",
                    "step",
                    "peak_gpu_memory_gib",
                    "kernels_ran",
                    "projection",
                    "wall_s",
                )
            },
            indent=1,
            default=str,
        )
    )


if __name__ == "__main__":
    main()
