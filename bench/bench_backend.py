"""Local-backend benchmarks on SmolLM2-135M-Instruct, as ratios measured in ONE process.

    .venv/bin/python bench/bench_backend.py [--threads 1] [--reps 5] [--out bench/results_backend.json]

1. custom-loss step / built-in step: `forward_backward_custom` with PPO re-implemented in
   torch (losslab.losses `ppo` through `as_tinker_loss_fn`) vs the built-in
   `forward_backward(..., "ppo")`, each followed by `optim_step`. Goal <= 1.05.
2. sampling tokens/s of `LocalSamplingClient.sample` vs plain `model.generate` (same model
   object, same batch, T = 1, top_k = 0, top_p = 1, a fixed number of new tokens). Goal >= 1.0.
3. LoRA training step (built-in ppo + optim_step) seconds per 1k tokens.
4. (extra) a GRPO-style group, one prompt x 8 samples: ours prefills the prompt once and
   repeats its KV cache; `generate(num_return_sequences=8)` expands the prompt before prefill.

Runs alternate between the two arms of each ratio (A, B, A, B, ...) after one warm-up each, and
report medians, so slow drifts of the shared machine hit both arms alike.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch
from tinker import types

from losslab.atomic import atomic_write_json
from losslab.backends.local import LocalServiceClient
from losslab.losses import as_tinker_loss_fn, get_loss

QUESTIONS = [
    f"What is {a} + {b}? Answer with just the number."
    for a, b in ((2, 3), (4, 1), (7, 2), (5, 5), (9, 3), (6, 8), (1, 7), (8, 8))
]


def _prompt(tok, question: str) -> list[int]:
    enc = tok.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True
    )
    return list(enc["input_ids"] if hasattr(enc, "keys") else enc)


def _datums(tok, sampler, completion_tokens: int) -> tuple[list[types.Datum], int]:
    """Eight RL datums (prompt + sampled completion of fixed length) with +-1 advantages."""
    data, tokens = [], 0
    futures = [
        sampler.sample(
            types.ModelInput.from_ints(_prompt(tok, q)),
            1,
            types.SamplingParams(max_tokens=completion_tokens, stop=[], seed=i),
        )
        for i, q in enumerate(QUESTIONS)
    ]
    for i, (q, fut) in enumerate(zip(QUESTIONS, futures, strict=True)):
        seq = fut.result().sequences[0]
        prompt = _prompt(tok, q)
        full = prompt + seq.tokens
        ob, n = len(prompt) - 1, len(full) - 1
        adv = 1.0 if i % 2 == 0 else -1.0
        data.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(full[:-1]),
                loss_fn_inputs={
                    "target_tokens": full[1:],
                    "logprobs": [0.0] * ob + [lp - 0.05 for lp in seq.logprobs],
                    "advantages": [0.0] * ob + [adv] * (n - ob),
                },
            )
        )
        tokens += n
    return data, tokens


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    dt = time.perf_counter() - t0
    print(f"  {fn.__name__}: {dt:.2f} s", file=sys.stderr, flush=True)
    return dt


def _alternate(a, b, reps: int) -> tuple[list[float], list[float]]:
    _time(a), _time(b)  # warm-up
    ta, tb = [], []
    for _ in range(reps):
        ta.append(_time(a))
        tb.append(_time(b))
    return ta, tb


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)  # 2+ OpenMP threads thrash on a loaded host
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--completion-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--out", default="bench/results_backend.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    service = LocalServiceClient(device="cpu", state_dir=tempfile.mkdtemp(prefix="losslab-bench-"))
    t0 = time.perf_counter()
    builtin_tc = service.create_lora_training_client("smollm2-135m", rank=8, seed=0).result()
    custom_tc = service.create_lora_training_client("smollm2-135m", rank=8, seed=0).result()
    load_s = time.perf_counter() - t0
    tok = builtin_tc.get_tokenizer()
    sampler = builtin_tc.save_weights_and_get_sampling_client().result()
    data, n_tokens = _datums(tok, sampler, args.completion_tokens)
    print(f"loaded in {load_s:.1f} s; {len(data)} datums, {n_tokens} tokens", file=sys.stderr)
    adam = types.AdamParams(learning_rate=1e-5, beta1=0.9, beta2=0.95, eps=1e-8)
    custom_loss = as_tinker_loss_fn(get_loss("ppo", reduction="sum"))

    def builtin_step():
        builtin_tc.forward_backward(data, "ppo").result()
        builtin_tc.optim_step(adam).result()

    def custom_step():
        custom_tc.forward_backward_custom(data, custom_loss).result()
        custom_tc.optim_step(adam).result()

    t_builtin, t_custom = _alternate(builtin_step, custom_step, args.reps)

    # Sampling: 8 different prompts, one sample each, fixed length (no early stop) on both sides.
    lm = sampler._lm  # the same LoRA-injected module object the sampler runs
    prompts = [_prompt(tok, q) for q in QUESTIONS]
    width = max(len(p) for p in prompts)
    pad = tok.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    new = args.new_tokens

    def ours():
        futs = [
            sampler.sample(
                types.ModelInput.from_ints(p),
                1,
                types.SamplingParams(max_tokens=new, stop=[], seed=i),
            )
            for i, p in enumerate(prompts)
        ]
        assert all(len(f.result().sequences[0].tokens) == new for f in futs)

    def hf_generate():
        with torch.no_grad():
            out = lm.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=new,
                min_new_tokens=new,
                pad_token_id=pad,
            )
        assert out.shape[1] == width + new

    t_ours, t_hf = _alternate(ours, hf_generate, args.reps)

    # GRPO-style group: one prompt, 8 samples (ours prefills the prompt once; HF expands first).
    group = prompts[0]
    gids, gmask = torch.tensor([group]), torch.ones((1, len(group)), dtype=torch.long)

    def ours_group():
        fut = sampler.sample(
            types.ModelInput.from_ints(group),
            8,
            types.SamplingParams(max_tokens=new, stop=[], seed=0),
        )
        assert all(len(q.tokens) == new for q in fut.result().sequences)

    def hf_group():
        with torch.no_grad():
            out = lm.generate(
                input_ids=gids,
                attention_mask=gmask,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=new,
                min_new_tokens=new,
                num_return_sequences=8,
                pad_token_id=pad,
            )
        assert out.shape == (8, len(group) + new)

    t_ours_g, t_hf_g = _alternate(ours_group, hf_group, args.reps)
    med = statistics.median
    results = {
        "model": "HuggingFaceTB/SmolLM2-135M-Instruct (fp32, CPU)",
        "threads": args.threads,
        "reps": args.reps,
        "cpu_count": os.cpu_count(),
        "load_two_clients_s": load_s,
        "train_batch": {"datums": len(data), "tokens": n_tokens, "lora_rank": 8},
        "builtin_step_s": t_builtin,
        "custom_step_s": t_custom,
        "ratio_custom_over_builtin": med(t_custom) / med(t_builtin),
        "lora_step_s_per_1k_tokens": med(t_builtin) / n_tokens * 1000,
        "sampling": {
            "batch": len(prompts),
            "new_tokens": new,
            "ours_s": t_ours,
            "hf_generate_s": t_hf,
        },
        "sampling_tokens_per_s_ours": len(prompts) * new / med(t_ours),
        "sampling_tokens_per_s_hf": len(prompts) * new / med(t_hf),
        "ratio_sampling_throughput_ours_over_hf": med(t_hf) / med(t_ours),
        "group_sampling": {
            "prompts": 1,
            "samples": 8,
            "new_tokens": new,
            "ours_s": t_ours_g,
            "hf_generate_s": t_hf_g,
        },
        "ratio_group_sampling_throughput_ours_over_hf": med(t_hf_g) / med(t_ours_g),
    }
    atomic_write_json(args.out, results, indent=1)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
