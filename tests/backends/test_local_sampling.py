"""Local sampling client: log-prob convention, batching = one-by-one, seeds, stops, snapshots."""

from __future__ import annotations

import pytest
import torch
from tinker import types

from .conftest import rl_batch

PROMPTS = ([257, 84, 82, 68, 81, 198], [257, 64, 198, 40, 41, 42, 43, 44, 198], [10, 20])


def _trained_sampler(service, base, lr=0.05):
    """A sampling client on LoRA weights that differ from the base (one Adam step)."""
    tc = service.create_lora_training_client(base, rank=4, seed=0).result()
    tc.forward_backward(rl_batch(1), "importance_sampling").result()
    tc.optim_step(types.AdamParams(learning_rate=lr)).result()
    return tc, tc.save_weights_and_get_sampling_client().result()


def _mi(ids):
    return types.ModelInput.from_ints(list(ids))


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_sampler_logprobs_equal_compute_logprobs_at_temperature_1(service, tiny_dirs, arch):
    _, s = _trained_sampler(service, str(tiny_dirs[arch]))
    futures = [
        s.sample(_mi(p), 2, types.SamplingParams(max_tokens=7, seed=i))
        for i, p in enumerate(PROMPTS)
    ]
    for p, fut in zip(PROMPTS, futures, strict=True):
        for seq in fut.result().sequences:
            assert len(seq.tokens) == len(seq.logprobs) == 7 and seq.stop_reason == "length"
            scored = s.compute_logprobs(_mi(p + seq.tokens)).result()
            assert scored[0] is None and len(scored) == len(p) + 7
            diff = max(abs(a - b) for a, b in zip(scored[len(p) :], seq.logprobs, strict=True))
            assert diff <= 1e-5


def test_logprobs_are_those_of_the_tempered_distribution(service, tiny_llama):
    """At T = 0.5 the returned log-prob is log_softmax(logits / 0.5)[token] (before top-k/top-p),
    recomputed here with the plain HF model on prompt + sampled tokens."""
    tc, s = _trained_sampler(service, tiny_llama)
    prompt = PROMPTS[1]
    seq = (
        s.sample(
            _mi(prompt), 1, types.SamplingParams(max_tokens=6, temperature=0.5, seed=3, top_k=50)
        )
        .result()
        .sequences[0]
    )
    lm = s._lm  # the snapshot's causal LM (LoRA injected)
    ids = torch.tensor([prompt + seq.tokens])
    with torch.no_grad():
        logits = lm(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    tgt = torch.tensor(seq.tokens)[:, None]
    tempered = torch.log_softmax(logits / 0.5, -1).gather(-1, tgt)[:, 0]
    plain = torch.log_softmax(logits, -1).gather(-1, tgt)[:, 0]
    got = torch.tensor(seq.logprobs)
    assert float((got - tempered).abs().max()) <= 1e-5
    assert float((got - plain).abs().max()) > 1e-3  # the two conventions are distinguishable


def test_queued_requests_batch_like_one_by_one(service, tiny_llama):
    # Two identically trained clients: their first snapshots share weights and client seed.
    _, s = _trained_sampler(service, tiny_llama)
    _, s2 = _trained_sampler(service, tiny_llama)
    params = [
        types.SamplingParams(max_tokens=9, temperature=1.0),
        types.SamplingParams(max_tokens=5, temperature=0.8, top_p=0.9, seed=11),
        types.SamplingParams(max_tokens=12, temperature=1.2, top_k=20),
    ]
    queued = [s.sample(_mi(p), n, sp) for p, n, sp in zip(PROMPTS, (3, 2, 4), params, strict=True)]
    assert not any(f.done() for f in queued)
    last = queued[2].result()  # resolving one runs the whole queue in one batched generation
    assert all(f.done() for f in queued)
    one_by_one = []
    for p, n, sp in zip(PROMPTS, (3, 2, 4), params, strict=True):
        one_by_one.append(s2.sample(_mi(p), n, sp).result())
    batched = [queued[0].result(), queued[1].result(), last]
    for a, b in zip(batched, one_by_one, strict=True):
        assert [q.tokens for q in a.sequences] == [q.tokens for q in b.sequences]
        for qa, qb in zip(a.sequences, b.sequences, strict=True):
            assert max(abs(x - y) for x, y in zip(qa.logprobs, qb.logprobs, strict=True)) <= 1e-5
    # different samples of one request differ (per-sample generators), and ids are unique
    assert len({tuple(q.tokens) for q in last.sequences}) == 4
    assert len({q.sequence_id for r in batched for q in r.sequences}) == 9


def test_seed_reproduces_and_unseeded_requests_advance(service, tiny_llama):
    _, s = _trained_sampler(service, tiny_llama)
    sp = types.SamplingParams(max_tokens=8, seed=5)
    a = s.sample(_mi(PROMPTS[0]), 2, sp).result()
    b = s.sample(_mi(PROMPTS[0]), 2, sp).result()
    assert [q.tokens for q in a.sequences] == [q.tokens for q in b.sequences]
    free = types.SamplingParams(max_tokens=8)
    c = s.sample(_mi(PROMPTS[0]), 1, free).result()
    d = s.sample(_mi(PROMPTS[0]), 1, free).result()
    assert c.sequences[0].tokens != d.sequences[0].tokens


def test_stop_token_ids_and_strings_are_included_and_stop(service, tiny_llama):
    tc, s = _trained_sampler(service, tiny_llama)
    tok = tc.get_tokenizer()
    sp = dict(max_tokens=30, seed=2)
    free = s.sample(_mi(PROMPTS[0]), 1, types.SamplingParams(stop=[], **sp)).result().sequences[0]
    assert free.stop_reason == "length" and len(free.tokens) == 30
    stop_tok = free.tokens[4]
    cut = free.tokens.index(stop_tok) + 1
    stopped = (
        s.sample(_mi(PROMPTS[0]), 1, types.SamplingParams(stop=[stop_tok], **sp))
        .result()
        .sequences[0]
    )
    assert stopped.stop_reason == "stop"
    assert stopped.tokens == free.tokens[:cut] and stopped.tokens[-1] == stop_tok
    # a string stop: the first printable ASCII character in the free completion (1 byte = 1 token)
    ascii_pos = next(i for i, t in enumerate(free.tokens) if tok.decode([t]).isalnum())
    char = tok.decode([free.tokens[ascii_pos]])
    first = next(i for i, t in enumerate(free.tokens) if tok.decode([t]) == char)
    by_str = (
        s.sample(_mi(PROMPTS[0]), 1, types.SamplingParams(stop=char, **sp)).result().sequences[0]
    )
    assert by_str.stop_reason == "stop" and by_str.tokens == free.tokens[: first + 1]


def test_top_k_1_and_tiny_top_p_are_greedy(service, tiny_llama):
    _, s = _trained_sampler(service, tiny_llama)
    greedy = s.sample(_mi(PROMPTS[1]), 1, types.SamplingParams(max_tokens=6, temperature=0.0))
    top1 = s.sample(_mi(PROMPTS[1]), 2, types.SamplingParams(max_tokens=6, top_k=1))
    top_p = s.sample(_mi(PROMPTS[1]), 2, types.SamplingParams(max_tokens=6, top_p=1e-6))
    g = greedy.result().sequences[0].tokens
    assert all(q.tokens == g for q in top1.result().sequences + top_p.result().sequences)
    scored = s.compute_logprobs(_mi(PROMPTS[1] + g)).result()  # greedy reports T = 1 log-probs
    diff = max(
        abs(a - b)
        for a, b in zip(
            scored[len(PROMPTS[1]) :], greedy.result().sequences[0].logprobs, strict=True
        )
    )
    assert diff <= 1e-5


def test_sampling_client_is_a_frozen_snapshot(service, tiny_llama):
    tc, s = _trained_sampler(service, tiny_llama)
    sp = types.SamplingParams(max_tokens=6, seed=9)
    before = s.compute_logprobs(_mi(PROMPTS[1])).result()
    sample_before = s.sample(_mi(PROMPTS[1]), 1, sp).result().sequences[0]
    for _ in range(2):
        tc.forward_backward(rl_batch(0), "ppo").result()
        tc.optim_step(types.AdamParams(learning_rate=0.1)).result()
    assert s.compute_logprobs(_mi(PROMPTS[1])).result() == before
    again = s.sample(_mi(PROMPTS[1]), 1, sp).result().sequences[0]
    assert again.tokens == sample_before.tokens and again.logprobs == sample_before.logprobs
    fresh = tc.save_weights_and_get_sampling_client().result()
    assert fresh.compute_logprobs(_mi(PROMPTS[1])).result() != before


def test_a_dropped_snapshot_is_reused_with_the_current_weights(service, tiny_llama):
    """Once a snapshot's sampling client is gone, the next snapshot reuses its module tree
    (`_snapshot_model`): it must hold the trained weights of now, exactly as a fresh deep copy
    does, while a snapshot whose client is alive is never touched."""
    tc, kept = _trained_sampler(service, tiny_llama)
    kept_lp = kept.compute_logprobs(_mi(PROMPTS[1])).result()
    dropped = tc.save_weights_and_get_sampling_client().result()
    dropped_model = dropped._model
    del dropped
    tc.forward_backward(rl_batch(0), "ppo").result()
    tc.optim_step(types.AdamParams(learning_rate=0.1)).result()
    reused = tc.save_weights_and_get_sampling_client().result()
    assert reused._model is dropped_model  # the pooled tree, not a new deep copy
    tc._snapshot_pool = None  # the next snapshot is a fresh deep copy of the same weights
    fresh = tc.save_weights_and_get_sampling_client().result()
    assert fresh._model is not dropped_model
    fresh_lp = fresh.compute_logprobs(_mi(PROMPTS[1])).result()
    assert reused.compute_logprobs(_mi(PROMPTS[1])).result() == fresh_lp != kept_lp
    sp = types.SamplingParams(max_tokens=6, seed=3)
    a, b = (c.sample(_mi(PROMPTS[0]), 2, sp).result() for c in (reused, fresh))
    assert [q.tokens for q in a.sequences] == [q.tokens for q in b.sequences]
    assert kept.compute_logprobs(_mi(PROMPTS[1])).result() == kept_lp  # a live one is frozen


def test_sampler_from_saved_weights_and_base_model(service, tiny_llama):
    tc, s = _trained_sampler(service, tiny_llama)
    with_prompt = s.sample(
        _mi(PROMPTS[1]), 1, types.SamplingParams(max_tokens=2), include_prompt_logprobs=True
    ).result()
    scored = s.compute_logprobs(_mi(PROMPTS[1])).result()
    assert with_prompt.prompt_logprobs[0] is None and scored[0] is None
    assert (
        max(abs(a - b) for a, b in zip(with_prompt.prompt_logprobs[1:], scored[1:], strict=True))
        <= 1e-6
    )
    path = tc.save_weights_for_sampler("w").result().path
    loaded = service.create_sampling_client(model_path=path).result()
    assert (
        loaded.compute_logprobs(_mi(PROMPTS[1])).result()
        == s.compute_logprobs(_mi(PROMPTS[1])).result()
    )
    base = service.create_sampling_client(base_model=tiny_llama).result()
    fresh = service.create_lora_training_client(tiny_llama, rank=4, seed=0).result()
    fresh_s = fresh.save_weights_and_get_sampling_client().result()
    assert (
        base.compute_logprobs(_mi(PROMPTS[1])).result()
        == fresh_s.compute_logprobs(_mi(PROMPTS[1])).result()
    )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(num_samples=0), "num_samples"),
        (dict(sampling_params=types.SamplingParams(temperature=-1)), "temperature"),
        (dict(sampling_params=types.SamplingParams(top_p=1.5)), "top_p"),
        (dict(sampling_params=types.SamplingParams(max_tokens=0)), "max_tokens"),
        (dict(prompt=types.ModelInput.from_ints([])), "empty"),
        (dict(prompt=[1, 2]), "ModelInput"),
        (dict(prompt=types.ModelInput.from_ints([10**6])), "outside the vocabulary"),
    ],
)
def test_bad_sampling_input_names_the_problem(service, tiny_llama, kwargs, match):
    s = service.create_sampling_client(base_model=tiny_llama).result()
    args = dict(
        prompt=_mi(PROMPTS[0]), num_samples=1, sampling_params=types.SamplingParams(max_tokens=2)
    )
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        s.sample(**args)


def test_futures_are_awaitable_and_concurrent_futures(service, tiny_llama):
    import asyncio

    tc = service.create_lora_training_client(tiny_llama, rank=4, seed=0).result()

    async def loop():
        fb = tc.forward_backward(rl_batch(0), "importance_sampling")
        opt = tc.optim_step(types.AdamParams(learning_rate=0.01))
        out = await fb
        step = await opt.result_async()
        sampler = await tc.save_weights_and_get_sampling_client()
        resp = await sampler.sample(_mi(PROMPTS[0]), 2, types.SamplingParams(max_tokens=3))
        return out, step, resp

    out, step, resp = asyncio.run(loop())
    assert "loss:sum" in out.metrics and step.metrics["step:max"] == 1.0
    assert [len(q.tokens) for q in resp.sequences] == [3, 3]
    s = tc.save_weights_and_get_sampling_client().result()
    cf = s.sample(_mi(PROMPTS[0]), 1, types.SamplingParams(max_tokens=2)).future()
    assert len(cf.result().sequences[0].tokens) == 2
