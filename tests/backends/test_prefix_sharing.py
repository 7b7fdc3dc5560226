"""Prefix sharing in training and scoring: values and LoRA gradients equal separate passes.

Every family `make_tiny_model_dir` builds is checked: full attention (Llama, Qwen3) and the
Gated-DeltaNet hybrids (Qwen3.5 dense and MoE, Qwen3-Next: the recurrent state forked at every
branch of the trie) share; sliding-window layers (Gemma-3) must report `can_share_prefix` False
and still give the same numbers (they take the one-pass-per-sequence path).
"""

from __future__ import annotations

import math

import pytest
import torch
from tinker import types

from losslab.backends.local import LocalServiceClient, tiny
from losslab.backends.local.logprobs import (
    MicroBatch,
    can_share_prefix,
    causal_lm,
    plan_microbatches,
)

ARCHS = tiny.TINY_ARCHS
SHAREABLE = {"llama", "qwen3", "qwen3_5", "qwen3_5_moe", "qwen3_next"}  # full or linear attention
TOL = 1e-5
TWO_PHASE_GRAD_TOL = 2e-5
"""The two-phase micro-batched hybrid case sums a prompt's gradient over its completions in
another order than separate passes (through the forked Gated-DeltaNet states) and again across
micro-batches: on an AMD EPYC (2026-12-02) fp32 rounding put Qwen3.5's gap at 1.09e-5 of the
largest entry (2.4e-3 on a 219 entry of layer 0's in_proj_qkv lora_B), on the machine the
test was written on under 1e-5. A sharing bug (a completion's gradient missing from the
prompt) is of the order of the gradient itself, far above either."""


def _grpo_batch(seed: int = 0) -> list[types.Datum]:
    """Three prompts x four completions of different lengths, as the RL loop builds them
    (model_input = prompt + completion[:-1]), with per-token weights on every position, the
    prompt's too, so the gradient through the shared prefix's own log-probs is checked as well."""
    g = torch.Generator().manual_seed(seed)
    data = []
    for p in range(3):
        prompt = torch.randint(3, 250, (9 + 2 * p,), generator=g).tolist()
        for j in range(4):
            completion = torch.randint(3, 250, (2 + 3 * j - p % 2,), generator=g).tolist()
            data.append(_weighted_datum(prompt + completion, g))
    return data


def _weighted_datum(full: list[int], g: torch.Generator) -> types.Datum:
    """model_input = full[:-1], next-token targets, a random weight on every position."""
    return types.Datum(
        model_input=types.ModelInput.from_ints(full[:-1]),
        loss_fn_inputs={
            "target_tokens": full[1:],
            "weights": torch.randn(len(full) - 1, generator=g).tolist(),
        },
    )


def _weighted_loss(data, logprobs_list):
    total = torch.zeros(())
    for d, lp in zip(data, logprobs_list, strict=True):
        total = total - (lp * d.loss_fn_inputs["weights"].to_torch()).sum()
    return total, {}


def _client(base: str, share: bool, tmp_path):
    service = LocalServiceClient(device="cpu", state_dir=tmp_path / "s", share_prefix=share)
    tc = service.create_lora_training_client(base, rank=4, seed=0).result()
    with torch.no_grad():  # non-zero LoRA B, so every LoRA matrix gets a gradient
        g = torch.Generator().manual_seed(1)
        for p in tc._params:
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return tc


def _max_rel(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    scale = max(1.0, max(float(v.abs().max()) for v in b.values()))
    return max(float((a[k] - b[k]).abs().max()) for k in a) / scale


def _assert_same_values_and_gradients(shared, separate, data) -> None:
    """Log-probs, the loss and the LoRA gradients of one `forward_backward_custom` on each
    client agree (values to TOL; gradients to TOL relative to max(1, their largest entry))."""
    out_s = shared.forward_backward_custom(data, _weighted_loss).result()
    out_u = separate.forward_backward_custom(data, _weighted_loss).result()
    for a, b in zip(out_s.loss_fn_outputs, out_u.loss_fn_outputs, strict=True):
        assert float((a["logprobs"].to_torch() - b["logprobs"].to_torch()).abs().max()) <= TOL
    # the loss is -sum(w * lp) over the batch: each lp within TOL bounds it by TOL * sum|w|
    weight_mass = sum(float(d.loss_fn_inputs["weights"].to_torch().abs().sum()) for d in data)
    loss_s, loss_u = out_s.metrics["loss:sum"], out_u.metrics["loss:sum"]
    assert math.isclose(loss_s, loss_u, abs_tol=TOL * weight_mass)
    g_s, g_u = shared.lora_grads(), separate.lora_grads()
    assert max(float(v.abs().max()) for v in g_u.values()) > 1e-3  # not vacuous
    assert _max_rel(g_s, g_u) <= TOL


@pytest.mark.parametrize("arch", ARCHS)
def test_shared_prefix_values_and_gradients_equal_separate_passes(tiny_dirs, tmp_path, arch):
    base = str(tiny_dirs[arch])
    shared, separate = _client(base, True, tmp_path), _client(base, False, tmp_path)
    assert shared._share_prefix == (arch in SHAREABLE)
    assert not separate._share_prefix
    _assert_same_values_and_gradients(shared, separate, _grpo_batch())


@pytest.mark.parametrize("arch", sorted(SHAREABLE & set(ARCHS)))
def test_two_phase_and_builtin_paths_share_with_the_same_gradient(tiny_dirs, tmp_path, arch):
    """Over the memory budget the custom loss runs two-phase per micro-batch of whole groups;
    the built-in loss path micro-batches the same way; both equal separate passes."""
    base = str(tiny_dirs[arch])
    data = _grpo_batch(1)
    grads = {}
    for share in (True, False):
        service = LocalServiceClient(
            device="cpu", state_dir=tmp_path / "s", share_prefix=share, max_tokens_per_batch=40
        )
        tc = service.create_lora_training_client(base, rank=4, seed=0).result()
        with torch.no_grad():
            g = torch.Generator().manual_seed(1)
            for p in tc._params:
                p.add_(0.05 * torch.randn(p.shape, generator=g))
        assert len(tc._microbatches(data)) > 1  # really the micro-batched form
        tc.forward_backward_custom(data, _weighted_loss).result()
        grads[share, "custom"] = tc.lora_grads()
        tc.optim_step(types.AdamParams(learning_rate=0.0)).result()
        tc.forward_backward(data, "cross_entropy").result()
        grads[share, "builtin"] = tc.lora_grads()
    for kind in ("custom", "builtin"):
        assert _max_rel(grads[True, kind], grads[False, kind]) <= TWO_PHASE_GRAD_TOL
    # cross_entropy(weights) = custom -sum(w * lp): the two loss paths agree too
    assert _max_rel(grads[True, "custom"], grads[True, "builtin"]) <= TOL


def test_sampler_logprobs_equal_shared_training_logprobs(tiny_dirs, tmp_path):
    """compute_logprobs (one sequence) and the shared training forward give the same values."""
    tc = _client(str(tiny_dirs["llama"]), True, tmp_path)
    data = _grpo_batch(2)
    out = tc.forward(data, "cross_entropy").result()
    sampler = tc.save_weights_and_get_sampling_client().result()
    for d, o in zip(data, out.loss_fn_outputs, strict=True):
        full = d.model_input.to_ints() + [d.loss_fn_inputs["target_tokens"].to_torch()[-1].item()]
        lp = sampler.compute_logprobs(types.ModelInput.from_ints(full)).result()[1:]
        assert float((torch.tensor(lp) - o["logprobs"].to_torch()).abs().max()) <= TOL


def test_plan_runs_each_shared_leading_run_once():
    """Trie tokens, counted by hand: a header common to two prompts, each prompt's group."""
    header = [1, 2, 3, 4]
    a, b = header + [10, 11, 12, 13, 14, 15], header + [20, 21, 22, 23, 24, 25]
    inputs = [a + [5, 6], a + [5, 7, 8], a + [9], b + [5], b + [6, 6], [7, 7, 7]]
    (mb,) = plan_microbatches(inputs, max_tokens_per_batch=1000)
    assert mb.packed and sorted(mb.members) == list(range(6))
    # header 4; a's rest 6, its completions [5, 6], then [7, 8] after the shared [5], then [9]:
    # 2 + 2 + 1; b's rest 6, its completions 1 + 2; the unrelated [7, 7, 7] 3
    assert mb.tokens == 4 + 6 + (2 + 2 + 1) + 6 + (1 + 2) + 3
    # a sorted order puts each sequence after the one it shares most with
    assert [inputs[i] for i in mb.members] == sorted(inputs)


def test_plan_microbatches_respects_the_budget():
    prompt = list(range(100, 150))
    inputs = [prompt + [k] * n for k, n in enumerate((3, 30, 4, 31))]
    inputs += [[7] * 40, [8] * 5, [9] * 41]
    plan = plan_microbatches(inputs, max_tokens_per_batch=120)
    assert sorted(i for mb in plan for i in mb.members) == list(range(len(inputs)))
    assert all(mb.tokens <= 120 for mb in plan)
    # lexicographic order: the three unrelated sequences first (40 + 5 + 41 = 86; the group's
    # first member would overflow), then the prompt's group, 50 + 3 + 30 + 4 + 31 = 118
    assert plan == [MicroBatch((4, 5, 6), True, 86), MicroBatch((0, 1, 2, 3), True, 118)]
    # unshared (families that cannot pack): padded rows, longest first (81, 80 | 54, 53, 41 |
    # 40, 5), each batch's rows x its longest row within 200
    plain = plan_microbatches(inputs, max_tokens_per_batch=200, share=False)
    assert plain == [
        MicroBatch((3, 1), False, 2 * 81),
        MicroBatch((2, 0, 6), False, 3 * 54),
        MicroBatch((4, 5), False, 2 * 40),
    ]


@pytest.mark.parametrize("arch", ARCHS)
def test_can_share_prefix_follows_the_cache_kind(tiny_dirs, arch):
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(str(tiny_dirs[arch]))
    assert can_share_prefix(causal_lm(lm)) == (arch in SHAREABLE)


@pytest.mark.parametrize("budget", [8192, 60])
@pytest.mark.parametrize("arch", ["llama", "qwen3_next"])
def test_nested_and_split_tries_keep_values_and_gradients(tiny_dirs, tmp_path, budget, arch):
    """Prompts that share a header (a trie three levels deep), and a budget so small that
    groups are split across micro-batches (two-phase form): values and gradients still equal
    separate passes, with full attention and with linear attention.

    The linear-attention case runs on Qwen3-Next: on these datums the tiny Qwen3.5's LoRA
    gradients are ill-conditioned (max |g| = 376, layer 0's `in_proj_qkv` through the
    L2-normalised q/k), and float32 round-off alone puts the separate pass 3.9e-6 and the
    shared one 1.4e-5 from the same computation in float64, where the two agree to 1.8e-7
    (measured 2026-12-02). `test_shared_prefix_values_and_gradients_equal_separate_passes` and
    `test_completions_forking_after_a_few_shared_tokens` hold every hybrid family to 1e-5."""
    base = str(tiny_dirs[arch])
    shared, separate = _client(base, True, tmp_path), _client(base, False, tmp_path)
    header = [5, 6, 7, 8, 9]
    data = []
    for d in _grpo_batch(3):  # the header prepended: inputs, next-token targets, weights
        tokens = d.model_input.to_ints()
        targets = d.loss_fn_inputs["target_tokens"].to_torch().tolist()
        weights = d.loss_fn_inputs["weights"].to_torch().tolist()
        data.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(header + tokens),
                loss_fn_inputs={
                    "target_tokens": header[1:] + tokens[:1] + targets,
                    "weights": [0.3] * len(header) + weights,
                },
            )
        )
    inputs = [d.model_input.to_ints() for d in data]
    plan = plan_microbatches(inputs, budget)
    shared._service.max_tokens_per_batch = budget
    if budget == 60:
        assert len(plan) > 1 and len(shared._microbatches(data)) > 1
    else:
        # one trie: the header (5) once; each prompt (9, 11, 13 tokens) once; each completion
        # c adds c - 1 input tokens: (1+4+7+10) + (0+3+6+9) + (1+4+7+10) (`_grpo_batch`)
        (mb,) = plan
        assert mb.tokens == 5 + (9 + 22) + (11 + 18) + (13 + 22)
    _assert_same_values_and_gradients(shared, separate, data)


HYBRIDS = [a for a in ("qwen3_5", "qwen3_5_moe", "qwen3_next") if a in ARCHS]


@pytest.mark.parametrize("arch", HYBRIDS)
def test_completions_forking_after_a_few_shared_tokens(tiny_dirs, tmp_path, arch):
    """Completions of one prompt that share their first 1-3 tokens: the linear-attention
    state forks at each branch point (a trie 5 segments deep, segments shorter than the conv's
    reach), and values and gradients equal separate passes."""
    from losslab.backends.local.linear_attention import build_linear_tree
    from losslab.backends.local.logprobs import trie_row

    prompt = [40, 41, 42, 43, 44, 45, 46]
    completions = [[50], [50, 51, 52, 53], [50, 51, 60], [50, 51, 52, 70, 71], [80, 81, 82]]
    g = torch.Generator().manual_seed(4)
    data = [_weighted_datum(prompt + c + [90], g) for c in completions]
    inputs = [d.model_input.to_ints() for d in data]
    (mb,) = plan_microbatches(inputs, 8192)
    row = trie_row(inputs, mb.members)
    # prompt | 50 | 51 | 52 | 53 / 70 71, and 60 after 51, 80 81 82 after the prompt
    assert len(build_linear_tree(row.units, len(row.ids), 4, "cpu").levels) == 5
    base = str(tiny_dirs[arch])
    shared, separate = _client(base, True, tmp_path), _client(base, False, tmp_path)
    _assert_same_values_and_gradients(shared, separate, data)
