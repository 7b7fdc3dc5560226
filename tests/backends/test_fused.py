"""Fused LoRA projections and gated MLPs (`backends/local/fused.py`).

The autograd Functions are checked against finite differences in float64 (`gradcheck`), then
every tiny family's training pass is checked against PEFT's own forward (`fuse=False`): values
to 1e-5, LoRA gradients to `GRAD_TOL` (3e-5). The memory claim is counted, not timed: the fused
MLP keeps two (tokens x intermediate) tensors for the backward where autograd keeps four.
"""

from __future__ import annotations

import pytest
import torch

from losslab.backends.local import tiny
from losslab.backends.local.fused import (
    FusedGatedMLP,
    FusedGatedRMSNorm,
    FusedLinear,
    _GatedDown,
    _GatedRMSNorm,
    _is_gated_rmsnorm,
    _is_silu_gated_mlp,
    _LoraLinear,
    fused_training_modules,
    linear_parts,
)
from losslab.backends.local.logprobs import causal_lm, sequence_logprobs

from .test_prefix_sharing import _client, _grpo_batch, _max_rel

TOL = 1e-5
# Gradients: the fused backward forms its rank-r products in another orientation than PEFT's
# autograd (`_rank_r_product`), so the two float32 passes round differently. Measured on the
# tiny families (2026-12-06): PEFT's own float32 LoRA gradients differ from a float64 pass of
# the same model by up to 8.6e-6 (relative to the largest gradient) on qwen3_5, where the
# Gated-DeltaNet layers amplify round-off; the two float32 orders differ by up to 1.0e-5 there
# and by <= 5.3e-6 on every other family. `test_rank_r_products_are_exact` pins the orientation
# itself against float64.
GRAD_TOL = 3e-5


def _f64(*shape, grad=True, seed=0):
    g = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_(grad)


@pytest.mark.parametrize("with_lora", [True, False])
@pytest.mark.parametrize("with_bias", [True, False])
def test_lora_linear_gradients_match_finite_differences(with_lora, with_bias):
    x, w = _f64(2, 5, 6), _f64(4, 6, grad=False)
    bias = _f64(4, grad=False) if with_bias else None
    if with_lora:
        a, b = _f64(3, 6, seed=1), _f64(4, 3, seed=2)
        assert torch.autograd.gradcheck(
            lambda x, a, b: _LoraLinear.apply(x, w, bias, a, b, 0.7), (x, a, b)
        )
        ref = torch.nn.functional.linear(x, w, bias) + 0.7 * (x @ a.T) @ b.T
        assert torch.allclose(_LoraLinear.apply(x, w, bias, a, b, 0.7), ref)
    else:
        assert torch.autograd.gradcheck(
            lambda x: _LoraLinear.apply(x, w, bias, None, None, 0.0), (x,)
        )


@pytest.mark.parametrize("with_lora", [True, False])
def test_gated_down_gradients_match_finite_differences(with_lora):
    g, u, w = _f64(2, 5, 6), _f64(2, 5, 6, seed=3), _f64(4, 6, grad=False)
    if with_lora:
        a, b = _f64(3, 6, seed=1), _f64(4, 3, seed=2)
        assert torch.autograd.gradcheck(
            lambda g, u, a, b: _GatedDown.apply(g, u, w, None, a, b, 0.7), (g, u, a, b)
        )
        h = torch.nn.functional.silu(g) * u
        ref = h @ w.T + 0.7 * (h @ a.T) @ b.T
        assert torch.allclose(_GatedDown.apply(g, u, w, None, a, b, 0.7), ref)
    else:
        assert torch.autograd.gradcheck(
            lambda g, u: _GatedDown.apply(g, u, w, None, None, None, 0.0), (g, u)
        )


def test_rank_r_products_are_exact():
    """The fused backward's float32 LoRA gradients (rank-r products formed as transposes) are
    within float32 round-off of float64: a 1,099-term sum, ~1e-6 of the largest entry (random
    data; autograd's own float32 orientation measured 1.0e-6 here, the fused one 2.5e-7)."""
    torch.manual_seed(0)
    x, w = torch.randn(1099, 576), torch.randn(1536, 576)
    a, b, gy = torch.randn(8, 576), torch.randn(1536, 8), torch.randn(1099, 1536)
    a64, b64 = a.double().requires_grad_(), b.double().requires_grad_()
    y64 = x.double() @ w.double().T + 0.5 * (x.double() @ a64.T) @ b64.T
    ref_a, ref_b = torch.autograd.grad(y64, (a64, b64), gy.double())
    a32, b32 = a.clone().requires_grad_(), b.clone().requires_grad_()
    y32 = _LoraLinear.apply(x, w, None, a32, b32, 0.5)
    got_a, got_b = torch.autograd.grad(y32, (a32, b32), gy)
    for got, ref in ((got_a, ref_a), (got_b, ref_b)):
        assert float((got.double() - ref).abs().max() / ref.abs().max()) < 1e-5


def _pass(tc, data, fuse: bool):
    """Log-probs and LoRA gradients of `sum(weights * logprobs)` through `sequence_logprobs`."""
    for p in tc._params:
        p.grad = None
    inputs = [d.model_input.to_ints() for d in data]
    targets = [d.loss_fn_inputs["target_tokens"].to_torch() for d in data]
    lp = sequence_logprobs(tc._model, inputs, targets, device=torch.device("cpu"), fuse=fuse)
    weights = [d.loss_fn_inputs["weights"].to_torch() for d in data]
    sum((x * w).sum() for x, w in zip(lp, weights, strict=True)).backward()
    return torch.cat([x.detach() for x in lp]), tc.lora_grads()


@pytest.mark.parametrize("arch", tiny.TINY_ARCHS)
def test_fused_pass_equals_peft_forward_on_every_family(tiny_dirs, tmp_path, arch):
    tc = _client(str(tiny_dirs[arch]), True, tmp_path)
    lm = causal_lm(tc._model)
    types_before = [type(m) for m in lm.modules()]
    with fused_training_modules(lm) as n_swapped:
        kinds = {type(m) for m in lm.modules()}
    # every family has LoRA attention projections; all but Gemma3 (GELU-tanh) have SiLU gated
    # MLPs, dense ones or a MoE's shared expert
    expected = {FusedLinear} if arch == "gemma3" else {FusedGatedMLP, FusedLinear}
    if arch in ("qwen3_5", "qwen3_5_moe", "qwen3_next"):  # Gated-DeltaNet output norms
        expected.add(FusedGatedRMSNorm)
    assert n_swapped > 0 and expected <= kinds
    assert [type(m) for m in lm.modules()] == types_before  # put back on exit
    data = _grpo_batch()
    lp_peft, g_peft = _pass(tc, data, fuse=False)
    lp_fused, g_fused = _pass(tc, data, fuse=True)
    assert float((lp_fused - lp_peft).abs().max()) <= TOL
    assert max(float(v.abs().max()) for v in g_peft.values()) > 1e-3  # not vacuous
    assert _max_rel(g_fused, g_peft) <= GRAD_TOL


def _saved_activation_bytes(fn, tokens: int, width: int) -> int:
    """Bytes of distinct storages saved for backward shaped (..., tokens, width)."""
    seen: dict[int, int] = {}

    def pack(t):
        if t.shape and t.shape[-1] == width and t.numel() == tokens * width:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def test_fused_mlp_keeps_two_intermediate_tensors_instead_of_four(tiny_dirs, tmp_path):
    tc = _client(str(tiny_dirs["llama"]), True, tmp_path)
    lm = causal_lm(tc._model)
    mlp = lm.model.layers[0].mlp
    assert _is_silu_gated_mlp(mlp)
    width = lm.config.intermediate_size
    x = torch.randn(3, 7, lm.config.hidden_size, requires_grad=True)
    peft = _saved_activation_bytes(lambda: mlp(x), 3 * 7, width)
    with fused_training_modules(lm):
        fused = _saved_activation_bytes(lambda: lm.model.layers[0].mlp(x), 3 * 7, width)
    one = 3 * 7 * width * 4  # a float32 (tokens x intermediate) tensor
    # autograd: gate(x), up(x), silu(gate(x)) and the product; fused: gate(x) and up(x)
    assert (peft, fused) == (4 * one, 2 * one)


def test_other_layers_keep_their_own_forward(tiny_dirs, tmp_path):
    """LoRA dropout (a random mask per call) and a non-SiLU or differently wired MLP are not
    fused: `linear_parts` declines them and the pass still matches PEFT."""
    tc = _client(str(tiny_dirs["llama"]), True, tmp_path)
    lm = causal_lm(tc._model)
    q_proj = lm.model.layers[0].self_attn.q_proj
    assert linear_parts(q_proj) is not None
    adapter = q_proj.active_adapters[0]
    q_proj.lora_dropout[adapter] = torch.nn.Dropout(0.1)
    assert linear_parts(q_proj) is None

    class AddedMLP(torch.nn.Module):  # the same attributes, another expression
        def __init__(self, mlp):
            super().__init__()
            self.gate_proj, self.up_proj, self.down_proj = mlp.gate_proj, mlp.up_proj, mlp.down_proj
            self.act_fn = mlp.act_fn

        def forward(self, x):
            down_proj = self.down_proj(self.act_fn(self.gate_proj(x)) + self.up_proj(x))
            return down_proj

    assert not _is_silu_gated_mlp(AddedMLP(lm.model.layers[0].mlp))
    gelu = lm.model.layers[1].mlp
    gelu.act_fn = torch.nn.GELU()
    assert not _is_silu_gated_mlp(gelu)
    with fused_training_modules(lm):
        assert lm.model.layers[0].self_attn.q_proj is q_proj
        assert lm.model.layers[1].mlp is gelu
    q_proj.lora_dropout[adapter] = torch.nn.Identity()  # deterministic again, to compare
    data = _grpo_batch()
    lp_peft, g_peft = _pass(tc, data, fuse=False)
    lp_fused, g_fused = _pass(tc, data, fuse=True)
    assert float((lp_fused - lp_peft).abs().max()) <= TOL
    assert _max_rel(g_fused, g_peft) <= GRAD_TOL


def test_gated_rmsnorm_gradients_match_finite_differences():
    x, z = _f64(2, 5, 6), _f64(2, 5, 6, seed=4)
    weight = _f64(6, grad=False, seed=5)
    assert torch.autograd.gradcheck(lambda x, z: _GatedRMSNorm.apply(x, z, weight, 1e-6), (x, z))


def _gated_norm(tiny_dirs, tmp_path):
    tc = _client(str(tiny_dirs["qwen3_5"]), True, tmp_path)
    lm = causal_lm(tc._model)
    names = [n for n, m in lm.named_modules() if _is_gated_rmsnorm(m)]
    assert names, "the tiny Qwen3.5 has Gated-DeltaNet layers, each with an output norm"
    return lm, names[0]


def test_fused_gated_rmsnorm_gives_the_modules_values_and_keeps_half_its_tensors(
    tiny_dirs, tmp_path
):
    """The same float32 values as transformers' `Qwen3_5RMSNormGated` (its operations in its
    order: equal, not close); for the backward it keeps x and z, where autograd keeps x, the
    weighted norm, silu(z) and z (counted, not timed)."""
    lm, name = _gated_norm(tiny_dirs, tmp_path)
    norm = lm.get_submodule(name)
    rows, width = 11, norm.weight.shape[0]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, width, generator=g, requires_grad=True)
    z = torch.randn(rows, width, generator=g, requires_grad=True)
    fused = FusedGatedRMSNorm(norm)
    assert torch.equal(fused(x, z), norm(x, z))
    kept = _saved_activation_bytes(lambda: norm(x, z), rows, width)
    kept_fused = _saved_activation_bytes(lambda: fused(x, z), rows, width)
    one = rows * width * 4  # a float32 (rows x width) tensor
    assert (kept, kept_fused) == (4 * one, 2 * one)
    x64, z64 = x.detach().double(), z.detach().double()  # another dtype: the module's forward
    assert torch.equal(fused(x64, z64), norm(x64, z64))


def test_a_trainable_or_rewired_gated_norm_is_not_fused(tiny_dirs, tmp_path):
    lm, name = _gated_norm(tiny_dirs, tmp_path)
    norm = lm.get_submodule(name)
    norm.weight.requires_grad_(True)  # its weight gradient is not formed by the fused backward
    assert not _is_gated_rmsnorm(norm)
    norm.weight.requires_grad_(False)
    norm.activation = "sigmoid"
    assert not _is_gated_rmsnorm(norm)
