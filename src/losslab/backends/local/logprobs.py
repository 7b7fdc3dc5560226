"""Target-token log-probs from hidden states without materialising full-vocabulary logits,
and the prefix-trie forward that runs every shared leading run of tokens (a GRPO group's
prompt, a header common to several prompts) once.

`log p(y_t | x_<=t) = h_t . w_{y_t} - logsumexp_v(h_t . w_v)` for the (frozen, possibly tied)
unembedding `W` (V x H). Computed in row chunks, so peak memory is `chunk x V` instead of
`tokens x V` (8 x 200 x 49,152 fp32 logits are 315 MB per copy on SmolLM2), vocabulary-major
(`W @ h.T`, faster on CPU). Rows expected to carry gradient (completion tokens) get their
Jacobian `w_y - softmax @ W` while the chunk's logits are live, so their backward is a scale;
other rows (prompt positions) recompute in the backward, only where the gradient is non-zero.
This is the "fused linear cross-entropy" idea (e.g. Liger-Kernel's FusedLinearCrossEntropy),
written in torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor

from losslab.backends.local.fused import fused_training_modules
from losslab.backends.local.linear_attention import (
    build_linear_tree,
    conv_kernel_size,
    install_for,
    linear_attention_modules,
)
from losslab.backends.local.packed import packed_linear
from losslab.backends.local.tree_attention import build_tree_layout, tree_attention

# 256 x 49,152 fp32 = 50 MB per logits chunk for SmolLM2 (one live at a time: _chunk_forward)
CHUNK_ROWS = 256

DEFAULT_MAX_TOKENS_PER_BATCH = {"cpu": 4096, "cuda": 32768}
"""Trie tokens per training micro-batch by device type (`LocalServiceClient`'s default): the
activation memory bound. A custom-loss minibatch over it runs the two-phase form (one more
forward), which the cost projection (`stats.cost.training_path`) counts."""


VOCAB_BLOCK_ROWS = 2048
"""Vocabulary rows per GEMM of `vocab_major_logits` on the CPU. One (49,152 x 576) x (576 x C)
GEMM ran at 103-156 GFLOP/s on 2 threads (C = 256, a training chunk: 103 inside the bench's
step, 156 alone); the same product as 24 GEMMs of 2,048 vocabulary rows, each writing its slice
of one output, at 170-175 (2026-12-06, a microbenchmark over 512-4,096 rows, 3 repeats; inside
the step 0.67 s instead of 1.13 s for its 8 chunks, `torch.profiler`). Each block's (2,048 x
576) weight slice, 4.5 MB, stays in cache while its columns run. GPUs take one GEMM."""


def vocab_major_logits(w_V_H: Tensor, h_C_H: Tensor) -> Tensor:
    """`(W @ h.T).float()`, (V, C): vocabulary-major logits (on the CPU faster than `h @ W.T`
    for V >> C, and the softmax reduces over dim 0), in blocks of `VOCAB_BLOCK_ROWS` rows."""
    vocab = w_V_H.shape[0]
    recorded = torch.is_grad_enabled() and (w_V_H.requires_grad or h_C_H.requires_grad)
    if w_V_H.device.type != "cpu" or vocab <= VOCAB_BLOCK_ROWS or recorded:  # out= has no grad
        return (w_V_H @ h_C_H.T).float()
    h_H_C = h_C_H.T
    logits_V_C = torch.empty((vocab, h_C_H.shape[0]), dtype=w_V_H.dtype, device=w_V_H.device)
    for s in range(0, vocab, VOCAB_BLOCK_ROWS):
        torch.mm(w_V_H[s : s + VOCAB_BLOCK_ROWS], h_H_C, out=logits_V_C[s : s + VOCAB_BLOCK_ROWS])
    return logits_V_C.float()


def unembedding_logits(w_V_H: Tensor, h_C_H: Tensor, packed_V_H: Tensor | None = None) -> Tensor:
    """(C, V) float32 logits `h W^T` of a frozen unembedding `W`, recording no gradient (for
    sampling, and for `_TargetLogprobs`, which forms its own): from `packed_V_H`, `W` packed
    for oneDNN (`packed.pack`; the sampler packs it per generation: a decode step's 64 rows in
    18 ms against 37), else vocabulary-major (`vocab_major_logits`) as its (C, V) transpose,
    so callers reduce over the last dim either way. (Training does not pack: a packed copy
    alive at the pass's activation peak would raise the peak RSS by the unembedding's size.)"""
    if packed_V_H is not None:
        return packed_linear(h_C_H, packed_V_H).float()
    return vocab_major_logits(w_V_H, h_C_H).T


def _chunk_jacobian(probs_C_V: Tensor, w_V_H: Tensor, y_C: Tensor, scale_C=None) -> Tensor:
    """`d lp / d h = w_y - sum_v p_v w_v` per row, (C, H), from (C, V) probs; with `scale_C`,
    `probs_C_V` is unnormalised (`exp(logit - max)`) and `p = probs / scale`."""
    w = w_V_H.float()
    # (H, V) @ (V, C): one GEMM whatever the probs' layout (a vocabulary-major one is the
    # contiguous right operand, a row-major one its transpose)
    mixed_C_H = (w.T @ probs_C_V.T).T
    if scale_C is not None:
        mixed_C_H = mixed_C_H / scale_C[:, None]
    return w[y_C] - mixed_C_H


def _chunk_forward(
    h_C_H: Tensor, w_V_H: Tensor, y_C: Tensor, eager_C: Tensor | None
) -> tuple[Tensor, Tensor, Tensor | None]:
    """One chunk of `_TargetLogprobs.forward`: the targets' logits, the logsumexp, and the
    Jacobians of the rows flagged in `eager_C` (None when none is, or none is wanted). A
    function of its own so that the chunk's (C, V) logits are freed when it returns, before
    the next chunk allocates its own: in the loop's body the next buffer came before the last
    one was released, two 50 MB buffers at the training pass's memory peak, and heap
    fragments around them (0.19 GiB of resident set in the first minibatch of the Qwen3.5
    bench step, 2026-12-06)."""
    logits_C_V = unembedding_logits(w_V_H, h_C_H)
    tgt_C = logits_C_V[torch.arange(y_C.shape[0], device=y_C.device), y_C]
    # the logsumexp in place: exp(logit - max) overwrites the logits (no second (C, V)
    # buffer, two passes fewer than logsumexp + a softmax), and the Jacobian divides its
    # (C, H) mixture by the sum instead of normalising (C, V) probs
    max_C = logits_C_V.amax(dim=-1)
    unnormalised_C_V = logits_C_V.sub_(max_C[:, None]).exp_()
    sum_C = unnormalised_C_V.sum(dim=-1)
    lse_C = max_C + sum_C.log()
    if eager_C is None or not bool(eager_C.any()):
        return tgt_C, lse_C, None
    jac_C_H = _chunk_jacobian(unnormalised_C_V, w_V_H, y_C, sum_C)
    # a mixed chunk (at most one: `target_logprobs` puts the eager rows first) keeps its eager
    # rows' (C, H) Jacobians: gathering their (E, V) probs instead copied ~45 MB per chunk,
    # more than the Jacobian of the few other rows costs
    return tgt_C, lse_C, jac_C_H if bool(eager_C.all()) else jac_C_H[eager_C]


class _TargetLogprobs(torch.autograd.Function):
    """Forward: per chunk of rows, logits -> logsumexp and the target's logit. Rows flagged
    `eager_M` (those almost sure to carry gradient, a completion's tokens) also get their
    Jacobian `d lp / d h` (H floats a row) while the chunk's logits are live, so their backward
    is one scale; the other rows (prompt positions, usually zero gradient) recompute their
    softmax in the backward, and only where the incoming gradient is non-zero."""

    @staticmethod
    def forward(ctx, h_M_H: Tensor, w_V_H: Tensor, y_M: Tensor, eager_M: Tensor) -> Tensor:  # type: ignore[override]
        want_jacobian = ctx.needs_input_grad[0]
        lse, tgt, jac = [], [], []
        for s in range(0, h_M_H.shape[0], CHUNK_ROWS):
            rows = slice(s, s + CHUNK_ROWS)
            tgt_C, lse_C, jac_E_H = _chunk_forward(
                h_M_H[rows], w_V_H, y_M[rows], eager_M[rows] if want_jacobian else None
            )
            tgt.append(tgt_C)
            lse.append(lse_C)
            if jac_E_H is not None:
                jac.append(jac_E_H)
        if not lse:
            empty = h_M_H.new_zeros((0,), dtype=torch.float32)
            ctx.save_for_backward(h_M_H, w_V_H, y_M, empty, eager_M, h_M_H.new_zeros((0, 0)))
            return empty
        lse_M = torch.cat(lse)
        jac_E_H = torch.cat(jac) if jac else h_M_H.new_zeros((0, h_M_H.shape[1]))
        ctx.save_for_backward(h_M_H, w_V_H, y_M, lse_M, eager_M, jac_E_H)
        return torch.cat(tgt) - lse_M

    @staticmethod
    def backward(ctx, g_M: Tensor):  # type: ignore[override]
        h_M_H, w_V_H, y_M, lse_M, eager_M, jac_E_H = ctx.saved_tensors
        grad_h = torch.zeros_like(h_M_H)
        # backward runs only when the forward wanted the Jacobian, so every eager row has one
        e = eager_M.nonzero().squeeze(-1)
        if e.numel():
            grad_h[e] = (g_M[e].to(jac_E_H.dtype)[:, None] * jac_E_H).to(grad_h.dtype)
        rows = torch.nonzero((g_M != 0) & ~eager_M).squeeze(-1)  # the rest: only with gradient
        for s in range(0, rows.numel(), CHUNK_ROWS):
            idx = rows[s : s + CHUNK_ROWS]
            probs_C_V = unembedding_logits(w_V_H, h_M_H[idx]).sub_(lse_M[idx][:, None]).exp_()
            g_C = g_M[idx].to(probs_C_V.dtype)
            grad_h[idx] = (g_C[:, None] * _chunk_jacobian(probs_C_V, w_V_H, y_M[idx])).to(
                grad_h.dtype
            )
        return grad_h, None, None, None


def target_logprobs(
    h_M_H: Tensor, w_V_H: Tensor, y_M: Tensor, eager_M: Tensor | None = None
) -> Tensor:
    """float32 log-probs (M,) of targets `y_M` given final hidden states (M, H) and unembedding
    (V, H). Differentiable in `h_M_H` only; a trainable `w_V_H` falls back to the plain path.
    `eager_M` (bool, (M,)) flags the rows expected to carry gradient: their Jacobian is formed
    in the forward (saves recomputing their logits); every other row recomputes on demand."""
    if w_V_H.requires_grad:
        logp_M_V = torch.log_softmax((h_M_H @ w_V_H.T).float(), dim=-1)
        return logp_M_V.gather(-1, y_M[:, None]).squeeze(-1)
    if eager_M is None:
        eager_M = torch.zeros(y_M.shape, dtype=torch.bool, device=y_M.device)
    if bool(eager_M.any()) and not bool(eager_M.all()):
        # eager rows first (stable), so chunks are all-eager or all-lazy but one: the trie's
        # flat order interleaves prompt rows (lazy) with completion rows (eager)
        order_M = torch.argsort((~eager_M).to(torch.int8), stable=True)
        lp_sorted_M = _TargetLogprobs.apply(h_M_H[order_M], w_V_H, y_M[order_M], eager_M[order_M])
        return lp_sorted_M[torch.argsort(order_M)]
    return _TargetLogprobs.apply(h_M_H, w_V_H, y_M, eager_M)


def causal_lm(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers *ForCausalLM inside a PeftModel (LoRA layers already injected)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def plain_unembedding(lm: torch.nn.Module) -> bool:
    """True when logits are exactly `h @ W.T` (Llama, Qwen3, ...): no bias, softcap or scale."""
    cfg = lm.config
    head = lm.get_output_embeddings()
    return (
        isinstance(head, torch.nn.Linear)
        and head.bias is None
        and not getattr(cfg, "final_logit_softcapping", None)
        and getattr(cfg, "logit_scale", None) in (None, 1.0)
    )


# ----------------------------------------------------------------------------- prefix sharing


def can_share_prefix(lm: torch.nn.Module) -> bool:
    """True when a group's common prefix can be run once and reused by each member with
    exactly the gradient of separate passes: every layer is full (global) attention, whose
    members attend to the prefix's K/V (`tree_attention`), or Gated-DeltaNet linear attention
    of a family `linear_attention.install_for` dispatches, whose members continue from the
    prefix's recurrent and conv states (`linear_attention.tree_gated_delta_rule`); and logits
    are `h @ W.T`.

    Families that fall back to one pass per sequence: sliding-window layers (Gemma-3, Mistral
    with `sliding_window`: the window cache drops prefix positions a completion token may
    still see in the separate pass) and any other layer kind.
    """
    cfg = lm.config
    layer_types = set(getattr(cfg, "layer_types", None) or ["full_attention"])
    sliding = getattr(cfg, "sliding_window", None)
    if sliding is not None and getattr(cfg, "use_sliding_window", True):
        return False
    if not layer_types <= {"full_attention", "linear_attention"}:
        return False
    if "linear_attention" in layer_types and not install_for(lm):
        return False
    return plain_unembedding(lm)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@dataclass(frozen=True)
class MicroBatch:
    """Sequences `members` (batch indices) run in one forward, and the `tokens` it runs.

    `packed`: the members' prefix trie in one flat row, every leading token run shared by
    several members computed once (`_trie_pass`; `tokens` = the trie's size). Otherwise
    right-padded rows, one per member (`_plain_pass`; `tokens` = rows x the longest)."""

    members: tuple[int, ...]
    packed: bool
    tokens: int


def plan_microbatches(
    inputs: Sequence[Sequence[int]], max_tokens_per_batch: int, share: bool = True
) -> list[MicroBatch]:
    """Micro-batches of at most `max_tokens_per_batch` tokens (at least one sequence each).

    Shared: sequences in lexicographic order, so each one's longest common prefix with any
    earlier sequence is its common prefix with the one before it, and it adds only the tokens
    after that prefix: a GRPO group's prompt runs once, and so does a header common to several
    prompts (a system turn, an instruction). Unshared: longest first, so rows of similar length
    are padded together."""
    lengths = [len(x) for x in inputs]
    batches: list[MicroBatch] = []
    members: list[int] = []
    tokens = 0
    if share:
        for i in sorted(range(len(inputs)), key=lambda k: tuple(inputs[k])):
            new = lengths[i] - (_common_prefix(inputs[members[-1]], inputs[i]) if members else 0)
            if members and tokens + new > max_tokens_per_batch:
                batches.append(MicroBatch(tuple(members), True, tokens))
                members, tokens, new = [], 0, lengths[i]
            members.append(i)
            tokens += new
        if members:
            batches.append(MicroBatch(tuple(members), True, tokens))
        return batches
    for i in sorted(range(len(inputs)), key=lambda k: -lengths[k]):
        longest = lengths[members[0]] if members else lengths[i]
        if members and (len(members) + 1) * longest > max_tokens_per_batch:
            batches.append(MicroBatch(tuple(members), False, len(members) * longest))
            members = []
        members.append(i)
    if members:
        batches.append(MicroBatch(tuple(members), False, len(members) * lengths[members[0]]))
    return batches


# ----------------------------------------------------------------------------- log-probs


def _row_logprobs(
    lm: torch.nn.Module, h_M_H: Tensor, y_M: Tensor, eager_M: Tensor | None = None
) -> Tensor:
    return target_logprobs(h_M_H, lm.get_output_embeddings().weight, y_M, eager_M)


def _plain_pass(
    lm: torch.nn.Module, inputs, targets, idx: list[int], device: torch.device
) -> list[Tensor]:
    """One right-padded forward over whole sequences; the unembedding only on real positions."""
    longest = max(len(inputs[i]) for i in idx)
    ids_B_N = torch.zeros((len(idx), longest), dtype=torch.long)
    mask_B_N = torch.zeros((len(idx), longest), dtype=torch.long)
    tgt_B_N = torch.zeros((len(idx), longest), dtype=torch.long)
    for b, i in enumerate(idx):
        n = len(inputs[i])
        ids_B_N[b, :n] = torch.as_tensor(inputs[i], dtype=torch.long)
        mask_B_N[b, :n] = 1
        tgt_B_N[b, :n] = targets[i].to(torch.long)
    ids_B_N, mask_B_N, tgt_B_N = ids_B_N.to(device), mask_B_N.to(device), tgt_B_N.to(device)
    valid_B_N = mask_B_N.bool()
    if plain_unembedding(lm):
        hidden_B_N_H = lm.get_decoder()(input_ids=ids_B_N, attention_mask=mask_B_N)[0]
        lp_M = _row_logprobs(lm, hidden_B_N_H[valid_B_N], tgt_B_N[valid_B_N])
    else:  # unusual heads (bias, softcap): full logits, still only on real positions
        logits_B_N_V = lm(input_ids=ids_B_N, attention_mask=mask_B_N).logits
        logp_M_V = torch.log_softmax(logits_B_N_V[valid_B_N].float(), dim=-1)
        lp_M = logp_M_V.gather(-1, tgt_B_N[valid_B_N][:, None]).squeeze(-1)
    return list(torch.split(lp_M, [len(inputs[i]) for i in idx]))


@dataclass(frozen=True)
class TrieRow:
    """A prefix trie laid out as one flat row (`trie_row`)."""

    ids: list[int]  # the flat row's tokens
    pos: list[int]  # each flat token's position in its sequences
    paths: dict[int, list[int]]  # each member's flat position at each depth
    units: list[tuple[range, list[int]]]  # (a run of new flat positions, its flat context)
    shared: list[int]  # each member's common prefix with the member before it


def trie_row(inputs: Sequence[Sequence[int]], members: Sequence[int]) -> TrieRow:
    """The prefix trie of `members` (in lexicographic order) as one flat row: each member adds
    the tokens after its common prefix with the member before it, a run that continues the
    path of that prefix."""
    row = TrieRow([], [], {}, [], [])
    prev: int | None = None
    for i in members:
        seq = inputs[i]
        lcp = _common_prefix(inputs[prev], seq) if prev is not None else 0
        context = row.paths[prev][:lcp] if prev is not None else []
        new = range(len(row.ids), len(row.ids) + len(seq) - lcp)
        row.ids.extend(seq[lcp:])
        row.pos.extend(range(lcp, len(seq)))
        row.paths[i] = context + list(new)
        if len(new):
            row.units.append((new, context))
        row.shared.append(lcp)
        prev = i
    return row


def _trie_pass(
    lm: torch.nn.Module, inputs, targets, members: Sequence[int], device: torch.device
) -> dict[int, Tensor]:
    """The prefix trie of `members` (in lexicographic order) as ONE flat row, in ONE forward.

    Each member adds the tokens after its common prefix with the member before it; those
    tokens attend (`tree_attention.prefix_tree_attention`) to the flat positions of that prefix
    and causally to themselves, nothing else; in linear-attention layers they continue from
    the prefix's recurrent and conv states (`linear_attention.LinearTree`). Positions continue
    from the prefix's length, so every token's hidden state is the one of its separate pass,
    and a prefix shared by several members runs once, with gradient (autograd sums over the
    members continuing from it: the unshared gradient). The linear layers see one (tokens x
    width) matrix without padding.

    Log-probs are computed once per distinct (flat position, target): members share the hidden
    state along a common prefix, so a prompt position costs one unembedding row, not one per
    member. Rows past the point where a member branches off its neighbours (its completion, in
    an RL batch) get their Jacobian in the forward (`_TargetLogprobs`).
    """
    row = trie_row(inputs, members)
    ids, pos, paths, units, shared = row.ids, row.pos, row.paths, row.units, row.shared
    rows: dict[tuple[int, int], int] = {}  # (flat position, target) -> log-prob row
    src: list[int] = []
    tgt: list[int] = []
    eager: list[bool] = []
    rows_of: dict[int, list[int]] = {}
    for k, i in enumerate(members):
        branch = max(shared[k], shared[k + 1] if k + 1 < len(members) else 0)
        member_rows = []
        for t, y_t in enumerate(targets[i].to(torch.long).tolist()):
            key = (paths[i][t], y_t)
            if key not in rows:
                rows[key] = len(src)
                src.append(key[0])
                tgt.append(y_t)
                eager.append(t >= branch)
            member_rows.append(rows[key])
        rows_of[i] = member_rows
    linear = None
    if linear_attention_modules(lm):  # the trie's segments, for the Gated-DeltaNet layers
        linear = build_linear_tree(units, len(ids), conv_kernel_size(lm), device)
    layout = build_tree_layout(units, len(ids), device, linear=linear)
    with tree_attention(lm):
        hidden_1_T_H = lm.get_decoder()(
            input_ids=torch.tensor([ids], dtype=torch.long, device=device),
            position_ids=torch.tensor([pos], dtype=torch.long, device=device),
            use_cache=False,
            prefix_tree=layout,
        )[0]
    lp_all = _row_logprobs(
        lm,
        hidden_1_T_H[0, torch.tensor(src, dtype=torch.long, device=device)],
        torch.tensor(tgt, dtype=torch.long, device=device),
        torch.tensor(eager, dtype=torch.bool, device=device),
    )
    return {i: lp_all[torch.tensor(r, device=device)] for i, r in rows_of.items()}


def sequence_logprobs(
    model: torch.nn.Module,
    inputs: list[list[int]],
    targets: list[Tensor],
    *,
    device: torch.device,
    max_tokens_per_batch: int = 8192,
    share_prefix: bool = True,
    fuse: bool = True,
) -> list[Tensor]:
    """Per-sequence float32 log-probs `log p(targets[i][t] | inputs[i][:t+1])` (shape (N_i,)).

    Where `can_share_prefix` holds for the model and `share_prefix` is True, each micro-batch
    runs as one prefix trie (`_trie_pass`: shared leading tokens once, no padding); otherwise
    as right-padded rows bucketed by length (`_plain_pass`); micro-batches hold at most
    `max_tokens_per_batch` tokens (`plan_microbatches`). The unembedding runs only on real
    positions, once per distinct (position, target) of the trie.
    Gradient flows when grad mode is on and equals that of one pass per sequence. With `fuse`,
    LoRA projections and SiLU gated MLPs run fused (`fused.fused_training_modules`: the same
    values and gradients, half the MLP activation memory).
    """
    lm = causal_lm(model)
    share = share_prefix and can_share_prefix(lm)
    out: dict[int, Tensor] = {}
    with fused_training_modules(lm) if fuse else nullcontext():
        for mb in plan_microbatches(inputs, max_tokens_per_batch, share):
            if mb.packed:
                out.update(_trie_pass(lm, inputs, targets, mb.members, device))
            else:
                lp_B = _plain_pass(lm, inputs, targets, list(mb.members), device)
                out.update(zip(mb.members, lp_B, strict=True))
    return [out[i] for i in range(len(inputs))]
