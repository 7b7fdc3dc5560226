"""Attention over a packed prefix trie (`logprobs._trie_pass`) that computes only the blocks a
token can see.

A packed row holds a prefix trie: each sequence's tokens after its common prefix with the one
before it (a GRPO group's completions after their prompt, a prompt after a header it shares
with other prompts). Such a run of new tokens sees the flat positions of its prefix and
itself causally. A dense masked attention over the row spends almost all of its work on
masked pairs: four GRPO groups (53-token prompt, 8 completions of ~19 tokens) need ~22k of the
~208k (query, key) pairs of a 456-token row per head. Here each run is an attention unit, its
queries over `[its prefix's keys, its own keys]` (the prefix fully visible, its own keys
causal), and units of similar length run as one batched SDPA call over gathered queries and
keys. Padded keys are masked, padded queries write to a discarded row, and GQA runs natively
(`enable_gqa`), so K/V are gathered per KV head. On SmolLM2-135M this is ~11 ms per layer
forward and backward instead of ~28 ms for the dense masked rows, with the same values and
gradients (tests/backends/test_tree_attention.py, test_prefix_sharing.py).

The function is registered with transformers' `AttentionInterface` as `ATTENTION_NAME`; a pass
selects it with `tree_attention(lm)` and hands the layout to every layer through the decoder's
keyword arguments (`prefix_tree=`), which transformers forwards to the attention function.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

ATTENTION_NAME = "losslab_prefix_tree"


@dataclass(frozen=True)
class UnitBatch:
    """`U` attention units of one kind, padded to `S` queries and `K` keys.

    `q_gather`/`kv_gather` index the row-flattened queries and keys (padding points at 0 and
    is masked); `q_scatter` says where each query's output goes (padding: the discard row);
    `mask` is True where a query may attend."""

    q_gather_U_S: Tensor
    q_scatter_U_S: Tensor
    kv_gather_U_K: Tensor
    mask_U_1_S_K: Tensor


@dataclass(frozen=True)
class TreeLayout:
    """The attention units of one packed pass, batched by query length, and, for a model with
    Gated-DeltaNet layers, the trie's segments (`linear_attention.LinearTree`)."""

    units: tuple[UnitBatch, ...]
    linear: Any = None


def _unit_batch(
    queries: Sequence[range], contexts: Sequence[Sequence[int]], n_flat: int, device
) -> UnitBatch:
    """Units whose queries `queries[u]` see all of `contexts[u]` and their own earlier queries."""
    n_units = len(queries)
    s_max = max(len(q) for q in queries)
    c_max = max(len(c) for c in contexts)
    q_gather = torch.zeros((n_units, s_max), dtype=torch.long)
    q_scatter = torch.full((n_units, s_max), n_flat, dtype=torch.long)
    kv_gather = torch.zeros((n_units, c_max + s_max), dtype=torch.long)
    mask = torch.zeros((n_units, 1, s_max, c_max + s_max), dtype=torch.bool)
    causal = torch.ones((s_max, s_max), dtype=torch.bool).tril()
    for u, (q, c) in enumerate(zip(queries, contexts, strict=True)):
        q_t = torch.tensor(q, dtype=torch.long)
        q_gather[u, : len(q)] = q_t
        q_scatter[u, : len(q)] = q_t
        kv_gather[u, : len(c)] = torch.tensor(c, dtype=torch.long)
        kv_gather[u, c_max : c_max + len(q)] = q_t
        mask[u, 0, :, : len(c)] = True
        # own queries causally; a padded query row sees every real key (never an empty softmax)
        mask[u, 0, :, c_max : c_max + len(q)] = causal[:, : len(q)]
        mask[u, 0, len(q) :, c_max : c_max + len(q)] = True
    return UnitBatch(
        q_gather.to(device), q_scatter.to(device), kv_gather.to(device), mask.to(device)
    )


def build_tree_layout(
    units: Sequence[tuple[range, Sequence[int]]], n_flat: int, device, linear: Any = None
) -> TreeLayout:
    """Attention units `(queries, context)`: flat query positions (a run of new tokens) that
    see every flat position in `context` and causally each other. Units are batched by query
    length (powers of two), so padding stays under half of each batch's queries."""
    buckets: dict[int, list[tuple[range, Sequence[int]]]] = {}
    for q, c in units:
        buckets.setdefault((len(q) - 1).bit_length(), []).append((q, c))
    batches = tuple(
        _unit_batch([q for q, _ in b], [c for _, c in b], n_flat, device)
        for _, b in sorted(buckets.items())
    )
    return TreeLayout(batches, linear)


def prefix_tree_attention(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    prefix_tree: TreeLayout | None = None,
    **kwargs,
) -> tuple[Tensor, None]:
    """transformers attention-interface function: query (R, Hq, N, D), key/value (R, Hkv, N, D)
    -> output (R, N, Hq, D). Only valid inside `tree_attention` with a `prefix_tree` layout."""
    if prefix_tree is None:
        raise RuntimeError(
            f"{type(module).__name__} did not pass the prefix-tree layout to its attention "
            "function; this model family cannot run packed prefix sharing"
        )
    unsupported = [k for k in ("sliding_window", "softcap", "s_aux") if kwargs.get(k) is not None]
    if unsupported:  # `can_share_prefix` keeps such families on the plain path
        raise RuntimeError(
            f"{type(module).__name__} asks its attention for {unsupported}, which the "
            "prefix-tree attention does not implement"
        )
    rows, heads, width, dim = query.shape
    kv_heads = key.shape[1]
    n_flat = rows * width
    q_F = query.transpose(1, 2).reshape(n_flat, heads, dim)
    k_F = key.transpose(1, 2).reshape(n_flat, kv_heads, dim)
    v_F = value.transpose(1, 2).reshape(n_flat, kv_heads, dim)
    out_F = query.new_zeros((n_flat + 1, heads, dim))  # the last row takes padded queries
    for unit in prefix_tree.units:
        n_units, s_max = unit.q_gather_U_S.shape
        k_max = unit.kv_gather_U_K.shape[1]
        kv_idx = unit.kv_gather_U_K.reshape(-1)
        q = q_F[unit.q_gather_U_S.reshape(-1)].view(n_units, s_max, heads, dim).transpose(1, 2)
        k = k_F[kv_idx].view(n_units, k_max, kv_heads, dim).transpose(1, 2)
        v = v_F[kv_idx].view(n_units, k_max, kv_heads, dim).transpose(1, 2)
        o = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=unit.mask_U_1_S_K,
            dropout_p=dropout,
            scale=scaling,
            enable_gqa=heads != kv_heads,
        )
        out_F = out_F.index_copy(
            0, unit.q_scatter_U_S.reshape(-1), o.transpose(1, 2).reshape(-1, heads, dim)
        )
    return out_F[:n_flat].view(rows, width, heads, dim), None


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, prefix_tree_attention)


_register()


@contextmanager
def tree_attention(lm: torch.nn.Module) -> Iterator[None]:
    """Inside the block `lm`'s attention layers call `prefix_tree_attention` (its config's
    attention implementation is switched, then restored). For the training client's own model
    under its lock only: a sampling snapshot has its own config (a deep copy)."""
    config = lm.config
    previous = config._attn_implementation
    config._attn_implementation = ATTENTION_NAME
    try:
        yield
    finally:
        config._attn_implementation = previous
