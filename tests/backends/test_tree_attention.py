"""Prefix-tree attention (`backends/local/tree_attention.py`) against dense masked attention.

The reference is written from the segment description alone: a dense (rows, 1, N, N) mask in
which a prefix token sees its prefix causally and a suffix token its segment's prefix and its
own earlier tokens, run through PyTorch's SDPA with K/V repeated per query head. Values and
gradients must agree (float64, to round-off) on rows holding several segments, suffixes of
different lengths, GQA and row padding. The model-level equality with separate passes is in
test_prefix_sharing.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from losslab.backends.local.tree_attention import build_tree_layout, prefix_tree_attention

WIDTH = 20
# (row, prefix length, suffix lengths) per segment; row 1 ends in 3 padding positions
SEGMENTS = [(0, 4, [3, 1, 5]), (0, 2, [1, 1]), (1, 6, [4, 2]), (1, 1, [3, 1])]


def _layout_and_dense_mask():
    prefixes, suffixes = [], []
    allowed = torch.eye(WIDTH, dtype=torch.bool).repeat(2, 1, 1)  # padding: itself only
    at = [0, 0]
    for row, c, lengths in SEGMENTS:
        start = at[row]
        prefixes.append(range(row * WIDTH + start, row * WIDTH + start + c))
        allowed[row, start : start + c, start : start + c] = torch.ones(c, c).tril().bool()
        at[row] += c
        for s in lengths:
            a = at[row]
            suffixes.append((range(row * WIDTH + a, row * WIDTH + a + s), len(prefixes) - 1))
            allowed[row, a : a + s, start : start + c] = True
            allowed[row, a : a + s, a : a + s] = torch.ones(s, s).tril().bool()
            at[row] += s
    assert at == [17, 17]  # both rows end in padding
    real = torch.zeros(2, WIDTH, dtype=torch.bool)
    real[:, :17] = True
    return build_tree_layout(prefixes, suffixes, 2 * WIDTH, "cpu"), allowed[:, None], real


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2)])
def test_tree_attention_equals_dense_masked_attention(heads, kv_heads):
    layout, mask, real = _layout_and_dense_mask()
    g = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(2, h, WIDTH, 8, generator=g, dtype=torch.float64).requires_grad_()
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


def test_attention_without_a_layout_is_refused():
    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(RuntimeError, match="prefix-tree layout"):
        prefix_tree_attention(torch.nn.Linear(1, 1), q, q, q, None)
