"""Every model family the README names, through every backend call, on tiny random configs.

One cache kind per family (see `losslab.backends.local.tiny`): KV (Llama, Qwen3), hybrid linear
attention (Qwen3.5 dense and MoE, Qwen3-Next: Gated DeltaNet conv + recurrent states), sliding
window (Gemma-3: window 4, shorter than prompt + completion, so the window slides).
"""

from __future__ import annotations

import math

import pytest
import torch
from tinker import types

from losslab.backends.local import sampling
from losslab.backends.local.linear_attention import linear_attention_modules
from losslab.backends.local.logprobs import causal_lm
from losslab.backends.local.tiny import TINY_ARCHS
from losslab.backends.restoration import restoration_preflight

from .conftest import rl_batch
from .test_local_training import _ppo_custom
from .test_restoration import ARMS as arms

PROMPTS = ([257, 84, 82, 68, 81, 198], [257, 64, 198, 40, 41, 42, 43, 44, 198], [10, 20])
# Stopping on any of 60 byte ids ends most rows of request 1 early, so finished rows leave the
# batch mid-generation while the other requests' rows keep going (exercises row dropping).
EARLY_STOP = list(range(60, 120))


def _mi(ids):
    return types.ModelInput.from_ints(list(ids))


def _params():
    return [
        types.SamplingParams(max_tokens=7, seed=1),
        types.SamplingParams(max_tokens=7, seed=2, stop=EARLY_STOP),
        types.SamplingParams(max_tokens=5, temperature=0.8, top_p=0.9, seed=3),
    ]


def _trained(service, base):
    """A client one Adam step away from its base (LoRA B != 0), so LoRA changes the outputs."""
    tc = service.create_lora_training_client(base, rank=4, seed=0).result()
    tc.forward_backward(rl_batch(1), "importance_sampling").result()
    tc.optim_step(types.AdamParams(learning_rate=0.05)).result()
    return tc


def _sample_all(sampler, n=3):
    futures = [sampler.sample(_mi(p), n, sp) for p, sp in zip(PROMPTS, _params(), strict=True)]
    return [f.result() for f in futures]


def _max_diff(a, b):
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_sampling_matches_logprobs_and_is_seed_deterministic(service, tiny_dirs, arch, monkeypatch):
    tc = _trained(service, str(tiny_dirs[arch]))
    s = tc.save_weights_and_get_sampling_client().result()
    converted = []  # Gated-DeltaNet states the sampler stored value-major (after every reorder)
    to_value_major = sampling.value_major_states
    monkeypatch.setattr(
        sampling, "value_major_states", lambda c: converted.append(to_value_major(c))
    )
    batched = _sample_all(s)
    hybrid = bool(linear_attention_modules(causal_lm(tc._model)))
    assert (sum(converted) > 0) == hybrid  # so the comparisons below cover that layout
    lengths = [len(q.tokens) for q in batched[1].sequences]
    assert min(lengths) < 7, "no row stopped early: the row-dropping path went untested"
    for p, resp in zip(PROMPTS[:2], batched[:2], strict=True):  # T = 1 requests
        for seq in resp.sequences:
            scored = s.compute_logprobs(_mi(p + seq.tokens)).result()
            assert _max_diff(scored[len(p) :], seq.logprobs) <= 1e-5
    # queued-then-batched equals one request at a time (same seeds)
    for p, sp, resp in zip(PROMPTS, _params(), batched, strict=True):
        alone = s.sample(_mi(p), 3, sp).result()
        assert [q.tokens for q in alone.sequences] == [q.tokens for q in resp.sequences]
        for qa, qb in zip(alone.sequences, resp.sequences, strict=True):
            assert _max_diff(qa.logprobs, qb.logprobs) <= 1e-5
    # greedy: T = 0 gives the argmax path with T = 1 log-probs, equal for every sample
    greedy = s.sample(_mi(PROMPTS[1]), 2, types.SamplingParams(max_tokens=6, temperature=0.0))
    g0, g1 = greedy.result().sequences
    assert g0.tokens == g1.tokens
    scored = s.compute_logprobs(_mi(PROMPTS[1] + g0.tokens)).result()
    assert _max_diff(scored[len(PROMPTS[1]) :], g0.logprobs) <= 1e-5


@pytest.mark.parametrize("arch", ["llama", "qwen3_5", "gemma3"])
def test_plain_path_for_caches_without_row_selection(service, tiny_dirs, arch, monkeypatch):
    """A cache without `reorder_cache` gets no prefill sharing and no row dropping; the tokens
    and log-probs must be those of the shared-prefill path."""
    tc = _trained(service, str(tiny_dirs[arch]))
    s = tc.save_weights_and_get_sampling_client().result()
    shared = _sample_all(s)
    calls = []

    def refuse(cache):
        calls.append(type(cache).__name__)
        return False

    monkeypatch.setattr(sampling, "rows_selectable", refuse)
    plain = _sample_all(s)
    assert calls, "the plain path was not taken"
    for a, b in zip(shared, plain, strict=True):
        assert [q.tokens for q in a.sequences] == [q.tokens for q in b.sequences]
        assert [q.stop_reason for q in a.sequences] == [q.stop_reason for q in b.sequences]
        for qa, qb in zip(a.sequences, b.sequences, strict=True):
            assert _max_diff(qa.logprobs, qb.logprobs) <= 1e-5


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_training_state_and_restoration(service, tiny_dirs, arch, tmp_path):
    base = str(tiny_dirs[arch])
    a, b = _trained(service, base), _trained(service, base)
    data = rl_batch(0)
    fb = a.forward_backward(data, "ppo", {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2})
    b.forward_backward_custom(data, _ppo_custom).result()
    ga, gb = a.lora_grads(), b.lora_grads()
    norm = math.sqrt(sum(float((v**2).sum()) for v in ga.values()))
    assert norm > 1e-6  # gradients reach the LoRA weights of this family
    assert max(float((ga[k] - gb[k]).abs().max()) for k in ga) <= 1e-6 * max(1.0, norm)
    assert math.isfinite(fb.result().metrics["loss:sum"])
    before = a.save_weights_and_get_sampling_client().result()
    probe = _mi(PROMPTS[1])
    lp_before = before.compute_logprobs(probe).result()
    path = a.save_state(str(tmp_path / "state")).result().path
    a.optim_step(types.AdamParams(learning_rate=0.05)).result()
    stepped = a.save_weights_and_get_sampling_client().result().compute_logprobs(probe).result()
    assert _max_diff(stepped[1:], lp_before[1:]) > 1e-6  # optim_step changed the weights
    fresh = service.create_lora_training_client(base, rank=4, seed=0).result()
    fresh.load_state_with_optimizer(path).result()
    restored = fresh.save_weights_and_get_sampling_client().result()
    assert restored.compute_logprobs(probe).result() == lp_before
    report = restoration_preflight(service, base_model=base, rank=4, seed=0, arms=arms)
    assert report["passed"], report["problems"]
    assert report["logprobs"]["bitwise_equal"] is True


def test_qwen3_5_hub_layout_loads_its_language_model(service, tmp_path):
    """`Qwen/Qwen3.5-2B` on the hub is a `Qwen3_5ForConditionalGeneration` checkpoint (model
    type `qwen3_5`, text + vision configs). The local backend loads its language model
    (`Qwen3_5ForCausalLM`) with the checkpoint's own weights, and samples from it."""
    import transformers

    from losslab.backends.local.tiny import make_tiny_tokenizer, tiny_config

    tok = make_tiny_tokenizer()
    text = tiny_config("qwen3_5", len(tok), tok.convert_tokens_to_ids("<|im_end|>"))
    vision = transformers.Qwen3_5VisionConfig(
        depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32
    )
    config = transformers.Qwen3_5Config(
        text_config=text.to_dict(), vision_config=vision.to_dict(), tie_word_embeddings=True
    )
    torch.manual_seed(0)
    vlm = transformers.Qwen3_5ForConditionalGeneration(config)
    vlm.save_pretrained(str(tmp_path / "vlm"))
    tok.save_pretrained(str(tmp_path / "vlm"))
    tc = service.create_lora_training_client(str(tmp_path / "vlm"), rank=4, seed=0).result()
    lm = tc._model.get_base_model()
    assert type(lm).__name__ == "Qwen3_5ForCausalLM"
    want = vlm.model.language_model.layers[0].linear_attn.in_proj_qkv.weight
    got = lm.model.layers[0].linear_attn.in_proj_qkv.base_layer.weight
    assert torch.equal(want, got)  # the checkpoint's weights, not a fresh initialisation
    s = tc.save_weights_and_get_sampling_client().result()
    seq = s.sample(_mi(PROMPTS[0]), 1, types.SamplingParams(max_tokens=4, seed=0)).result()
    tokens = seq.sequences[0].tokens
    scored = s.compute_logprobs(_mi(PROMPTS[0] + tokens)).result()
    assert _max_diff(scored[len(PROMPTS[0]) :], seq.sequences[0].logprobs) <= 1e-5


@pytest.mark.parametrize("arch", ["qwen3_5_moe", "qwen3_next"])
def test_moe_routed_experts_get_lora_and_gradients(service, tiny_dirs, arch):
    """The fused routed-expert weights (3-D parameters, not nn.Linear) are adapted through
    PEFT's target_parameters, and a custom loss sends gradient into them."""
    tc = _trained(service, str(tiny_dirs[arch]))
    assert {"experts.down_proj", "experts.gate_up_proj"} <= set(tc.describe()["target_modules"])
    tc.forward_backward_custom(rl_batch(0), _ppo_custom).result()
    expert = {n: g for n, g in tc.lora_grads().items() if ".experts." in n}
    assert expert and max(float(g.abs().max()) for g in expert.values()) > 0
