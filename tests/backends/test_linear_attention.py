"""Gated-DeltaNet paths of the local backend (`local/linear_attention.py`) against
transformers' reference functions: the CPU chunked and recurrent delta rules and the conv
decode step (values, final states and gradients), and the prefix-tree conv and delta rule
against one reference run per sequence of the trie. Model-level equalities (every tiny hybrid
family, shared vs separate passes) are in test_prefix_sharing.py."""

from __future__ import annotations

import pytest
import torch

from losslab.backends.local import linear_attention as la
from losslab.backends.local.logprobs import trie_row

TOL = 1e-5
REF = la.reference_functions("qwen3_5")


def _inputs(batch: int, length: int, k_heads: int, v_heads: int, dim: int, seed: int = 0):
    """q, k (B, T, Hk, D), v (B, T, Hv, D), log-decay g <= 0 and beta in (0, 1) (B, T, Hv), an
    initial state (B, Hv, D, D); all requiring grad."""
    g = torch.Generator().manual_seed(seed)
    xs = [
        torch.randn(batch, length, k_heads, dim, generator=g),
        torch.randn(batch, length, k_heads, dim, generator=g),
        torch.randn(batch, length, v_heads, dim, generator=g),
        -torch.rand(batch, length, v_heads, generator=g),
        torch.rand(batch, length, v_heads, generator=g),
        0.1 * torch.randn(batch, v_heads, dim, dim, generator=g),
    ]
    return [x.requires_grad_() for x in xs]


def _run(rule, xs, **kw):
    q, k, v, g, beta, s0 = xs
    return rule(
        q,
        k,
        v,
        g=g,
        beta=beta,
        initial_state=s0,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
        **kw,
    )


def _values_and_grads(rule, xs, **kw):
    """Output, final state and the gradients of a fixed random functional of both."""
    for x in xs:
        x.grad = None
    out, state = _run(rule, xs, **kw)
    g = torch.Generator().manual_seed(7)
    w_out, w_state = torch.randn(out.shape, generator=g), torch.randn(state.shape, generator=g)
    ((out * w_out).sum() + (state * w_state).sum()).backward()
    return out.detach(), state.detach(), [x.grad.clone() for x in xs]


def _close(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().abs().max()) / max(1.0, float(b.detach().abs().max()))


# (batch, length, key heads, value heads, head dim, chunk): several chunks with a ragged last
# one, grouped value heads (Hv = 2 Hk, repeated as the reference does), one short sequence
SHAPES = [(2, 37, 2, 4, 8, 16), (1, 130, 3, 3, 16, 64), (3, 5, 1, 2, 8, 64)]


@pytest.mark.parametrize("shape", SHAPES)
def test_chunk_rule_equals_the_reference(shape):
    *dims, chunk = shape
    xs = _inputs(*dims)
    ref = _values_and_grads(REF["torch_chunk_gated_delta_rule"], xs, chunk_size=chunk)
    ours = _values_and_grads(la.chunk_gated_delta_rule, xs, chunk_size=chunk)
    assert _close(ours[0], ref[0]) <= TOL and _close(ours[1], ref[1]) <= TOL
    for a, b in zip(ours[2], ref[2], strict=True):
        assert float(b.abs().max()) > 0  # every input gets a gradient (initial state too)
        assert _close(a, b) <= TOL


# the cache's state as transformers stores it, and as the sampler does (`value_major_states`:
# the same (B, H, Dk, Dv) values in the memory of a contiguous (B, H, Dv, Dk))
LAYOUTS = {"contiguous": torch.Tensor.clone, "value-major": la.value_major}


# rows' states: GRPO-like equal runs, one state shared by all, unequal runs out of order
STATE_ROWS = [[0, 0, 0, 1, 1, 1], [0] * 6, [2, 2, 0, 1, 1, 1], [1, 0, 0, 0, 1, 2]]


@pytest.mark.parametrize("rows", STATE_ROWS)
@pytest.mark.parametrize("length, chunk", [(16, 16), (37, 16)])  # one chunk; three, ragged
def test_chunk_rule_forked_states_equal_gathered_copies(rows, length, chunk):
    """`state_rows` (each row continues a shared state: the trie's completions) gives the
    values and gradients of passing each row its own gathered copy, bit for bit on one chunk
    (the shared-state GEMM computes the same dot products); within round-off on several."""
    xs = _inputs(6, length, 2, 4, 8)[:5]
    shared = 0.1 * torch.randn(3, 4, 8, 8, generator=torch.Generator().manual_seed(3))
    index = torch.tensor(rows)

    def run(forked: bool):
        leaf = shared.clone().requires_grad_()
        kw = (
            dict(initial_state=leaf, state_rows=index) if forked else {"initial_state": leaf[index]}
        )
        out, state = la.chunk_gated_delta_rule(
            *xs, chunk_size=chunk, output_final_state=True, use_qk_l2norm_in_kernel=True, **kw
        )
        weights = torch.Generator().manual_seed(7)
        w_out, w_state = (torch.randn(t.shape, generator=weights) for t in (out, state))
        grads = torch.autograd.grad((out * w_out).sum() + (state * w_state).sum(), [*xs, leaf])
        return out.detach(), state.detach(), grads

    gathered, forked = run(False), run(True)
    tol = 0.0 if length == chunk else TOL
    assert _close(forked[0], gathered[0]) <= tol and _close(forked[1], gathered[1]) <= tol
    assert float(gathered[2][-1].abs().max()) > 0  # the shared states get a gradient
    for a, b in zip(forked[2], gathered[2], strict=True):
        assert _close(a, b) <= TOL


@pytest.mark.parametrize("layout", LAYOUTS)
def test_recurrent_step_equals_the_reference_and_updates_the_cache_state_in_place(layout):
    """Without autograd the cache's own tensor is updated in place and keeps its layout (so
    the next decode step takes the same path); with autograd the initial state is left alone
    and the values and gradients (the initial state's too) equal the reference's."""
    xs = _inputs(4, 3, 2, 4, 8)  # three tokens, one at a time as the decode loop would
    store = LAYOUTS[layout]
    with torch.no_grad():
        q, k, v, g, beta, s0 = (x.detach() for x in xs)
        ref_out, ref_state = REF["torch_recurrent_gated_delta_rule"](
            q, k, v, g=g, beta=beta, initial_state=s0.clone(), output_final_state=True,
            use_qk_l2norm_in_kernel=True,
        )  # fmt: skip
        cache_state = store(s0)
        assert torch.equal(cache_state, s0)
        assert la.is_value_major(cache_state) != cache_state.is_contiguous()
        out, state = la.recurrent_gated_delta_rule(
            q, k, v, g, beta, cache_state, output_final_state=True, use_qk_l2norm_in_kernel=True
        )
    assert _close(out, ref_out) <= TOL and _close(state, ref_state) <= TOL
    assert state.data_ptr() == cache_state.data_ptr()  # the cache's own tensor, updated
    assert state.stride() == cache_state.stride()
    ref = _values_and_grads(REF["torch_recurrent_gated_delta_rule"], xs)
    xs = [*xs[:5], store(xs[5].detach()).requires_grad_()]
    before = xs[5].detach().clone()
    ours = _values_and_grads(la.recurrent_gated_delta_rule, xs)
    assert torch.equal(xs[5].detach(), before)
    for a, b in zip((ours[0], ours[1], *ours[2]), (ref[0], ref[1], *ref[2]), strict=True):
        assert _close(a, b) <= TOL


def test_value_major_states_converts_each_float32_state_of_a_cache_once():
    from types import SimpleNamespace

    s = torch.randn(2, 3, 4, 5)
    # transformers' LinearAttentionLayer: {state index: tensor or None}
    states = {0: s.clone(), 1: s.clone().to(torch.float64), 2: None}
    layer = SimpleNamespace(recurrent_states=states)
    cache = SimpleNamespace(layers=[layer, SimpleNamespace(keys=torch.zeros(1))])
    assert la.value_major_states(cache) == 1  # float32 only: other dtypes are left alone
    assert la.is_value_major(layer.recurrent_states[0])
    assert torch.equal(layer.recurrent_states[0], s)
    assert la.value_major_states(cache) == 0  # already value-major
    assert la.value_major_states(SimpleNamespace()) == 0  # a cache without layers


def test_conv_decode_step_equals_the_reference():
    g = torch.Generator().manual_seed(3)
    x, state = torch.randn(5, 12, 1, generator=g), torch.randn(5, 12, 4, generator=g)
    weight, bias = torch.randn(12, 4, generator=g), torch.randn(12, generator=g)
    ref_state, our_state = state.clone(), state.clone()
    ref = REF["causal_conv1d_update"](x, ref_state, weight, bias, "silu")
    ours = la.causal_conv1d_update(x, our_state, weight, bias, "silu")
    assert _close(ours, ref) <= TOL
    assert torch.equal(our_state, ref_state)  # both shift the state by the new token


def _trie_sequences() -> list[list[int]]:
    """Branches after 0, 1, 2, 3 and 6 shared tokens, so segments shorter than the conv's
    K - 1 = 3 lie between a token and the tokens its conv reads, and the trie is 4 deep."""
    return sorted(
        [
            [1, 2, 3, 4, 5, 6, 7, 8],
            [1, 2, 3, 4, 5, 6, 9],
            [1, 2, 3, 10, 11],
            [1, 2, 3, 10, 12, 13, 14],
            [1, 2, 15],
            [1, 16, 17, 18],
            [19, 20],
        ]
    )


def test_tree_conv_and_delta_rule_equal_one_reference_run_per_sequence():
    seqs = _trie_sequences()
    row = trie_row(seqs, range(len(seqs)))
    n_flat, kernel = len(row.ids), 4
    tree = la.build_linear_tree(row.units, n_flat, kernel, "cpu")
    assert len(tree.levels) >= 4
    # per flat token features; a sequence sees the features at its path's flat positions
    q, k, v, g, beta, _ = _inputs(1, n_flat, 2, 4, 8, seed=5)
    gen = torch.Generator().manual_seed(6)
    conv_in = torch.randn(1, 6, n_flat, generator=gen).requires_grad_()
    weight = torch.randn(6, kernel, generator=gen)
    flat = (q, k, v, g, beta, conv_in)

    tree_out = la.tree_gated_delta_rule(
        q, k, v, g, beta, tree, True, la.recomputed(la.gathered(la.chunk_gated_delta_rule))
    )  # (1, T, Hv, D); checkpointed per level, as the dispatcher runs it
    tree_conv = la.tree_causal_conv1d(conv_in, weight, None, "silu", tree)  # (1, C, T)
    w_out = torch.randn(tree_out.shape, generator=gen)
    w_conv = torch.randn(tree_conv.shape, generator=gen)
    ((tree_out * w_out).sum() + (tree_conv * w_conv).sum()).backward()
    tree_grads = [x.grad.clone() for x in flat]
    for x in flat:
        x.grad = None

    # reference: each sequence on its own; a flat position's loss weight counts once (the
    # trie's output is one value per flat position), its gradient sums over the sequences
    covered = torch.zeros(n_flat, dtype=torch.bool)
    total = torch.zeros(())
    for i in range(len(seqs)):
        path = torch.tensor(row.paths[i])
        new = ~covered[path]  # positions this sequence is the first to reach
        covered[path] = True
        o, _ = REF["torch_chunk_gated_delta_rule"](
            q[:, path], k[:, path], v[:, path], g=g[:, path], beta=beta[:, path],
            use_qk_l2norm_in_kernel=True,
        )  # fmt: skip
        c = REF["causal_conv1d_fn"](conv_in[:, :, path], weight, None, activation="silu")
        assert _close(o[0], tree_out[0, path]) <= TOL
        assert _close(c[0], tree_conv[0][:, path]) <= TOL
        total = total + (o[0, new] * w_out[0, path][new]).sum()
        total = total + (c[0][:, new] * w_conv[0][:, path][:, new]).sum()
    assert bool(covered.all())
    total.backward()
    for a, x in zip(tree_grads, flat, strict=True):
        assert float(x.grad.abs().max()) > 0
        assert _close(a, x.grad) <= TOL


def test_dispatch_uses_the_cpu_paths_and_falls_back_to_the_reference():
    from transformers.models.qwen3_5 import modeling_qwen3_5 as modeling

    assert la.install("qwen3_5")
    assert modeling.torch_chunk_gated_delta_rule.__wrapped__ is REF["torch_chunk_gated_delta_rule"]
    assert la.kernels_for("cpu")["chunk_gated_delta_rule"] == "losslab-torch"
    before = la.kernel_report().get("chunk_gated_delta_rule", {}).get("losslab-torch", 0)
    q, k, v, g, beta, _ = (x.detach() for x in _inputs(1, 6, 2, 2, 8))
    modeling.torch_chunk_gated_delta_rule(q, k, v, g=g, beta=beta)
    assert la.kernel_report()["chunk_gated_delta_rule"]["losslab-torch"] == before + 1
    # packed varlen batches (cu_seqlens) go to transformers' own function, which refuses
    # them without flash-linear-attention, as it does without losslab
    with pytest.raises(ValueError, match="flash-linear-attention"):
        modeling.torch_chunk_gated_delta_rule(
            q, k, v, g=g, beta=beta, cu_seqlens=torch.tensor([0, 3, 6])
        )


def test_unit_lower_inverse_inverts_the_unit_triangle_of_the_strict_lower_part():
    """`T^-1` with T = I + strictly_lower(system): T @ T^-1 = I (the definition), whatever the
    diagonal and upper part of `system` hold (the chunk rule leaves them unmasked), and equal
    to a float64 triangular solve, batched over (B, H, N)."""
    g = torch.Generator().manual_seed(0)
    # the chunk rule's system: beta k_i . k_j with unit keys, beta in (0, 1), decays <= 1 below
    # the diagonal; above it, noise (the rule does not mask it)
    k = torch.nn.functional.normalize(torch.randn(2, 3, 4, 16, 8, generator=g), dim=-1)
    beta = torch.rand(2, 3, 4, 16, 1, generator=g)
    decay = torch.rand(2, 3, 4, 16, 16, generator=g)
    system = ((k * beta) @ k.transpose(-1, -2)) * decay
    system = system + torch.randn(16, 16, generator=g).triu()
    triangle = torch.eye(16) + system.tril(-1)
    inverse = la.unit_lower_inverse(system)
    assert _close(triangle @ inverse, torch.eye(16).expand_as(triangle)) <= 1e-5
    exact = torch.linalg.solve_triangular(
        triangle.double(), torch.eye(16, dtype=torch.float64).expand_as(triangle), upper=False
    )
    assert _close(inverse.double(), exact) <= 1e-5
    assert torch.equal(inverse.triu(1), torch.zeros_like(inverse))  # lower triangular


@pytest.mark.parametrize("with_bias", [False, True])
def test_frozen_causal_conv_equals_the_padded_conv_and_its_gradient_finite_differences(with_bias):
    """`_FrozenCausalConv` (no input kept for the backward) against the expression it replaces,
    `conv1d(pad(x))`, and its input gradient against finite differences (float64 gradcheck)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, 5, 9, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(5, 4, generator=g, dtype=torch.float64)
    bias = torch.randn(5, generator=g, dtype=torch.float64) if with_bias else None
    expected = torch.nn.functional.conv1d(
        torch.nn.functional.pad(x, (3, 0)), weight[:, None, :], bias, groups=5
    )
    assert torch.equal(la._FrozenCausalConv.apply(x, weight, bias), expected)
    assert torch.autograd.gradcheck(lambda x: la._FrozenCausalConv.apply(x, weight, bias), (x,))
