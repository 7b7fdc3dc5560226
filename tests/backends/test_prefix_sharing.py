"""Prefix sharing in training and scoring: values and LoRA gradients equal separate passes.

Every family `make_tiny_model_dir` builds is checked; families whose cache cannot be shared
(linear-attention hybrids, sliding-window layers) must report `can_share_prefix` False and
still give the same numbers (they take the one-pass-per-sequence path).
"""

from __future__ import annotations

import math

import pytest
import torch
from tinker import types

from losslab.backends.local import LocalServiceClient, tiny
from losslab.backends.local.logprobs import (
    PrefixGroup,
    can_share_prefix,
    causal_lm,
    plan_microbatches,
    prefix_groups,
)

ARCHS = tiny.TINY_ARCHS
SHAREABLE = {"llama", "qwen3"}  # full attention, plain K/V cache, plain unembedding
TOL = 1e-5


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
            full = prompt + completion
            data.append(
                types.Datum(
                    model_input=types.ModelInput.from_ints(full[:-1]),
                    loss_fn_inputs={
                        "target_tokens": full[1:],
                        "weights": torch.randn(len(full) - 1, generator=g).tolist(),
                    },
                )
            )
    return data


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


@pytest.mark.parametrize("arch", ARCHS)
def test_shared_prefix_values_and_gradients_equal_separate_passes(tiny_dirs, tmp_path, arch):
    base = str(tiny_dirs[arch])
    shared, separate = _client(base, True, tmp_path), _client(base, False, tmp_path)
    assert shared._share_prefix == (arch in SHAREABLE)
    assert not separate._share_prefix
    data = _grpo_batch()
    out_s = shared.forward_backward_custom(data, _weighted_loss).result()
    out_u = separate.forward_backward_custom(data, _weighted_loss).result()
    for a, b in zip(out_s.loss_fn_outputs, out_u.loss_fn_outputs, strict=True):
        diff = (a["logprobs"].to_torch() - b["logprobs"].to_torch()).abs().max()
        assert float(diff) <= TOL
    assert math.isclose(out_s.metrics["loss:sum"], out_u.metrics["loss:sum"], abs_tol=TOL)
    g_s, g_u = shared.lora_grads(), separate.lora_grads()
    assert max(float(v.abs().max()) for v in g_u.values()) > 1e-3  # not vacuous
    assert _max_rel(g_s, g_u) <= TOL


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
        assert _max_rel(grads[True, kind], grads[False, kind]) <= TOL
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


def test_prefix_groups_find_the_prompt_groups_not_the_common_header():
    header = [1, 2, 3, 4]
    a, b = header + [10, 11, 12, 13, 14, 15], header + [20, 21, 22, 23, 24, 25]
    inputs = [a + [5, 6], a + [5, 7, 8], a + [9], b + [5], b + [6, 6], [7, 7, 7]]
    groups = prefix_groups(inputs)
    assert sorted(groups, key=lambda g: min(g.members)) == [
        PrefixGroup((0, 1, 2), len(a)),  # the prompt plus nothing of the completions
        PrefixGroup((3, 4), len(b)),
        PrefixGroup((5,), 0),  # alone: runs unshared
    ]
    # a member keeps at least one token of its own
    assert prefix_groups([[1, 2, 3], [1, 2, 3]]) == [PrefixGroup((0, 1), 2)]
    assert prefix_groups(inputs, share=False) == [PrefixGroup((i,), 0) for i in range(6)]


def test_plan_microbatches_respects_the_budget_and_buckets_by_length():
    prompt = list(range(100, 150))
    inputs = [prompt + [k] * n for k, n in enumerate((3, 30, 4, 31))]
    inputs += [[7] * 40, [8] * 5, [9] * 41]  # singletons
    plan = plan_microbatches(inputs, max_tokens_per_batch=200)
    kinds = [{g.shared == 0 for g in batch} for batch in plan]
    assert all(len(k) == 1 for k in kinds)  # shared and unshared never mixed
    flat = sorted(i for batch in plan for g in batch for i in g.members)
    assert flat == list(range(len(inputs)))
    unshared = [g.members[0] for batch in plan for g in batch if g.shared == 0]
    assert unshared == [6, 4, 5]  # longest first
    for batch in plan:
        members = [i for g in batch for i in g.members]
        if len(batch) > 1:
            assert len(batch) * max(len(inputs[i]) for i in members) <= 200


@pytest.mark.parametrize("arch", ARCHS)
def test_can_share_prefix_follows_the_cache_kind(tiny_dirs, arch):
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(str(tiny_dirs[arch]))
    assert can_share_prefix(causal_lm(lm)) == (arch in SHAREABLE)


def test_pack_rows_balances_rows_and_splits_long_groups():
    """Segments are dealt longest first to the least-filled row: the bench's four groups of
    235/194/181/132 tokens (prefix 53) go two to a row; a group longer than a row is cut into
    segments that each repeat its prefix; every member lands in exactly one segment."""
    from losslab.backends.local.logprobs import _row_length, pack_rows

    suffixes = [[23, 22, 22, 23, 22, 23, 22, 25], [18] * 7 + [15], [16] * 8, [10] * 7 + [9]]
    lengths, groups, at = [], [], 0
    for sfx in suffixes:
        groups.append(PrefixGroup(tuple(range(at, at + len(sfx))), 53))
        lengths += [53 + n for n in sfx]
        at += len(sfx)
    sizes = [53 + sum(sfx) for sfx in suffixes]
    assert sizes == [235, 194, 181, 132]
    rows = pack_rows(groups, lengths, row_tokens=512)
    assert sorted(sorted(_row_length(r, groups, lengths) for r in rows)) == [367, 375]
    assert sorted(i for r in rows for seg in r.segments for i in seg.members) == list(range(at))
    # rows of 120 tokens: group 0 is cut in member order, each segment repeating the prefix:
    # 53+23+22+22 = 120 | 53+23+22 = 98 (+23 > 120) | 53+23+22 = 98 (+25 > 120) | 53+25
    rows = pack_rows(groups, lengths, row_tokens=120)
    seg0 = [seg for r in rows for seg in r.segments if seg.group == 0]
    assert [len(seg.members) for seg in seg0] == [3, 2, 2, 1]
    assert all(_row_length(r, groups, lengths) <= 120 for r in rows)


@pytest.mark.parametrize("row_tokens", [12, 512])
def test_split_and_packed_segments_keep_values_and_gradients(
    tiny_dirs, tmp_path, monkeypatch, row_tokens
):
    """Rows so short that groups are cut into several segments (prefix repeated), or several
    groups share a row: values and gradients still equal separate passes."""
    from losslab.backends.local import logprobs

    monkeypatch.setattr(logprobs, "PACKED_ROW_TOKENS", row_tokens)
    base = str(tiny_dirs["llama"])
    shared, separate = _client(base, True, tmp_path), _client(base, False, tmp_path)
    data = _grpo_batch(3)
    lengths = [len(d.model_input.to_ints()) for d in data]
    groups = prefix_groups([d.model_input.to_ints() for d in data])
    rows = logprobs.pack_rows([g for g in groups if g.shared], lengths)
    segments = [seg for r in rows for seg in r.segments]
    if row_tokens == 12:
        assert len(segments) > len(groups)  # some group really was cut
    else:
        assert any(len(r.segments) > 1 for r in rows)  # some row really holds two groups
    out_s = shared.forward_backward_custom(data, _weighted_loss).result()
    out_u = separate.forward_backward_custom(data, _weighted_loss).result()
    for a, b in zip(out_s.loss_fn_outputs, out_u.loss_fn_outputs, strict=True):
        assert float((a["logprobs"].to_torch() - b["logprobs"].to_torch()).abs().max()) <= TOL
    assert _max_rel(shared.lora_grads(), separate.lora_grads()) <= TOL
