"""The sampler's decode fast paths give what the plain path gives.

- merged LoRA Linears (`merged_lora_linears`): one matmul per projection with `W + s B A`;
- growing KV buffers (`GrowingKVLayer`): a decode step writes in place instead of `torch.cat`.

Each is compared with the path it replaces on every tiny family, on LoRA weights moved off the
base (one Adam step), with the merge threshold at 0 so every generation merges. Same tokens and
log-probs within 1e-5 (float round-off of a different summation order); and the LoRA modules
are back in place after generation.
"""

from __future__ import annotations

import pytest
import torch
from tinker import types

from losslab.backends.local import sampling, tiny
from losslab.backends.local.memory import release_free_memory

from .conftest import rl_batch

PROMPTS = ([257, 84, 82, 68, 81, 198], [257, 64, 198, 40, 41, 42, 43, 44, 198])


def _samples(service, base: str) -> list[tuple[list[int], list[float]]]:
    tc = service.create_lora_training_client(base, rank=4, seed=0).result()
    tc.forward_backward(rl_batch(1), "importance_sampling").result()
    tc.optim_step(types.AdamParams(learning_rate=0.05)).result()
    s = tc.save_weights_and_get_sampling_client().result()
    params = types.SamplingParams(max_tokens=9, seed=3, stop=[])
    futures = [s.sample(types.ModelInput.from_ints(p), 3, params) for p in PROMPTS]
    return [(list(q.tokens), list(q.logprobs)) for f in futures for q in f.result().sequences]


def _assert_same(a, b) -> None:
    assert [t for t, _ in a] == [t for t, _ in b]
    diff = max(
        abs(x - y)
        for (_, la), (_, lb) in zip(a, b, strict=True)
        for x, y in zip(la, lb, strict=True)
    )
    assert diff <= 1e-5


@pytest.mark.parametrize("arch", tiny.TINY_ARCHS)
def test_merged_lora_decoding_equals_the_lora_path(service, tiny_dirs, monkeypatch, arch):
    monkeypatch.setattr(sampling, "MERGE_MIN_TOKENS", 10**9)  # never merge
    plain = _samples(service, str(tiny_dirs[arch]))
    monkeypatch.setattr(sampling, "MERGE_MIN_TOKENS", 0)  # always merge (where it can)
    merged = _samples(service, str(tiny_dirs[arch]))
    _assert_same(merged, plain)


def test_a_merged_generation_packs_the_unembedding_for_itself_only(
    service, tiny_llama, monkeypatch
):
    """With the LoRA weights merged (and packed, on the CPU) the unembedding is packed once per
    generation and dropped after it, so no packed copy outlives sampling; the tokens and
    log-probs are those of the unpacked path (`$LOSSLAB_PACKED_LINEAR=0`)."""
    from transformers import AutoConfig

    from losslab.backends.local.packed import PACKED_ENV, packing_available

    if not packing_available(torch.zeros(1)):
        pytest.skip("this torch build has no oneDNN linear")
    config = AutoConfig.from_pretrained(tiny_llama)
    packed_shapes = []
    pack = sampling.pack
    monkeypatch.setattr(sampling, "pack", lambda w: packed_shapes.append(w.shape) or pack(w))
    monkeypatch.setattr(sampling, "MERGE_MIN_TOKENS", 0)
    merged = _samples(service, tiny_llama)
    # both requests were queued before the first `result()`: one batched generation, one pack
    assert packed_shapes == [(config.vocab_size, config.hidden_size)]
    monkeypatch.setenv(PACKED_ENV, "0")
    _assert_same(merged, _samples(service, tiny_llama))
    assert len(packed_shapes) == 1  # nothing packed with packing off


@pytest.mark.parametrize("arch", tiny.TINY_ARCHS)
def test_growing_kv_cache_equals_transformers_own_cache(service, tiny_dirs, monkeypatch, arch):
    grown = _samples(service, str(tiny_dirs[arch]))
    monkeypatch.setattr(sampling, "decode_cache", lambda lm, capacity: None)
    own = _samples(service, str(tiny_dirs[arch]))
    _assert_same(grown, own)


@pytest.mark.parametrize("packed", [True, False], ids=["onednn-packed", "dense"])
def test_merge_swaps_plain_linears_in_and_puts_lora_back(service, tiny_llama, monkeypatch, packed):
    """Merged projections: on the CPU `PackedLinear`s (oneDNN's layout), with packing turned
    off (`$LOSSLAB_PACKED_LINEAR=0`) plain Linears in the base weight's (out, in) layout; the
    same logits as the LoRA forward either way, and the LoRA modules back on exit."""
    from peft.tuners.lora import LoraLayer

    from losslab.backends.local.packed import PACKED_ENV, PackedLinear, packing_available

    if not packed:
        monkeypatch.setenv(PACKED_ENV, "0")
    elif not packing_available(torch.zeros(1)):
        pytest.skip("this torch build has no oneDNN linear")
    tc = service.create_lora_training_client(tiny_llama, rank=4, seed=0).result()
    lm = tc.save_weights_and_get_sampling_client().result()._lm
    before = {n: m for n, m in lm.named_modules() if isinstance(m, LoraLayer)}
    assert before
    x = torch.randint(3, 200, (2, 7))
    with torch.no_grad():
        ref = lm(input_ids=x).logits
        with sampling.merged_lora_linears(lm) as merged:
            assert merged
            inside = {n: m for n, m in lm.named_modules() if isinstance(m, LoraLayer)}
            assert not inside  # every LoRA Linear is a merged stand-in now
            q = lm.get_submodule(next(iter(before)))
            if packed:
                assert type(q) is PackedLinear
            else:
                assert type(q) is torch.nn.Linear and q.weight.stride() == (q.in_features, 1)
            fast = lm(input_ids=x).logits
    after = {n: m for n, m in lm.named_modules() if isinstance(m, LoraLayer)}
    assert after.keys() == before.keys() and all(after[n] is before[n] for n in before)
    assert float((fast - ref).abs().max()) <= 1e-5


def test_growing_kv_layer_reuses_its_buffer_and_rebuffers_after_row_selection():
    layer = sampling.GrowingKVLayer(capacity=6)
    k, v = torch.randn(3, 2, 4, 5), torch.randn(3, 2, 4, 5)
    keys, _ = layer.update(k, v)
    buf = layer._key_buf
    keys, values = layer.update(k[:, :, :1], v[:, :, :1])  # one decode step: same buffer
    assert layer._key_buf is buf and keys.shape[-2] == 5
    assert torch.equal(keys[:, :, :4], k) and torch.equal(values[:, :, 4:], v[:, :, :1])
    layer.reorder_cache(torch.tensor([2, 0]))  # rows 2 and 0 keep going
    keys, _ = layer.update(k[:2, :, :1], v[:2, :, :1])
    assert keys.shape == (2, 2, 6, 5) and layer._key_buf is not buf
    assert torch.equal(keys[0, :, :4], k[2]) and torch.equal(keys[1, :, 4], k[0, :, 0])
    keys, _ = layer.update(k[:2, :, :2], v[:2, :, :2])  # past capacity: a larger buffer
    assert keys.shape[-2] == 8


def test_release_free_memory_runs_where_glibc_is():
    import ctypes.util

    assert release_free_memory() == (ctypes.util.find_library("c") is not None)
