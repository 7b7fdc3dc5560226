"""Prefix-tree attention (`backends/local/tree_attention.py`) against dense masked attention.

The reference is written from the sequences alone: a dense (1, 1, N, N) mask in which a flat
position sees the positions before it on its sequences' paths, run through PyTorch's SDPA
with K/V repeated per query head. Values and gradients must agree (float64, to round-off) on
a three-level trie (a header shared by two prompts, their completions), an unrelated
sequence, GQA and row padding. The model-level equality with separate passes is in
test_prefix_sharing.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from losslab.backends.local.tree_attention import build_tree_layout, prefix_tree_attention

N_FLAT = 24
# a three-level trie in one flat row, written as the sequences it holds (flat positions along
# each path): a header [0..3], two prompts on it, completions on the prompts, one unrelated
# sequence; positions 21..23 are padding
PATHS = [
    [0, 1, 2, 3, 4, 5, 6],  # header, prompt A [4, 5], completion [6]
    [0, 1, 2, 3, 4, 5, 7, 8, 9],  # header, prompt A, completion [7, 8, 9]
    [0, 1, 2, 3, 10, 11, 12, 13],  # header, prompt B [10, 11, 12], completion [13]
    [0, 1, 2, 3, 10, 11, 12, 14, 15],  # prompt B, completion [14, 15]
    [16, 17, 18, 19, 20],  # unrelated
]


def _units_and_dense_mask():
    """Units as `_trie_pass` builds them (each sequence's new tokens over its prefix's flat
    positions) and, independently, the dense mask: a flat position sees every position before
    it on any path through it."""
    units, seen = [], set()
    for path in PATHS:
        new = [p for p in path if p not in seen]
        units.append((range(new[0], new[-1] + 1), path[: path.index(new[0])]))
        seen.update(path)
    allowed = torch.eye(N_FLAT, dtype=torch.bool)  # padding: itself only
    for path in PATHS:
        for t, q in enumerate(path):
            allowed[q, path[: t + 1]] = True
    real = torch.zeros(N_FLAT, dtype=torch.bool)
    real[:21] = True
    return build_tree_layout(units, N_FLAT, "cpu"), allowed[None, None], real[None]


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2)])
def test_tree_attention_equals_dense_masked_attention(heads, kv_heads):
    layout, mask, real = _units_and_dense_mask()
    assert len(layout.units) > 1  # units of different lengths: several batches
    g = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(1, h, N_FLAT, 8, generator=g, dtype=torch.float64).requires_grad_()
        for h in (heads, kv_heads, kv_heads)
    )
    rep = heads // kv_heads
    dense = F.scaled_dot_product_attention(
        q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), attn_mask=mask, scale=0.3
    ).transpose(1, 2)  # (rows, N, heads, D), the attention-interface layout
    tree, _ = prefix_tree_attention(
        torch.nn.Module(), q, k, v, None, scaling=0.3, prefix_tree=layout
    )
    assert tree.shape == dense.shape
    assert torch.allclose(tree[real], dense[real], atol=1e-12)
    assert float(tree[~real].abs().max()) == 0.0  # padding is attended by no one
    weight = torch.randn(dense.shape, generator=g, dtype=torch.float64) * real[..., None, None]
    grads_dense = torch.autograd.grad((dense * weight).sum(), (q, k, v))
    grads_tree = torch.autograd.grad((tree * weight).sum(), (q, k, v))
    for a, b in zip(grads_tree, grads_dense, strict=True):
        assert float(b.abs().max()) > 1e-3  # not vacuous
        assert torch.allclose(a, b, atol=1e-12)


def test_attention_without_a_layout_or_with_a_window_is_refused():
    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(RuntimeError, match="prefix-tree layout"):
        prefix_tree_attention(torch.nn.Linear(1, 1), q, q, q, None)
    layout = build_tree_layout([(range(0, 3), [])], 3, "cpu")
    with pytest.raises(RuntimeError, match="sliding_window"):
        prefix_tree_attention(
            torch.nn.Linear(1, 1), q, q, q, None, prefix_tree=layout, sliding_window=2
        )
