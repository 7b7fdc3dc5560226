"""Target-token log-probs from hidden states without materialising full-vocabulary logits,
and the packed prefix-tree forward that runs a GRPO group's shared prompt once.

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
from losslab.backends.local.tree_attention import build_tree_layout, tree_attention

CHUNK_ROWS = 256  # 256 x 49,152 fp32 = 50 MB per logits chunk for SmolLM2 (2-3 live at once)


def vocab_major_logits(w_V_H: Tensor, h_C_H: Tensor) -> Tensor:
    return (w_V_H @ h_C_H.T).float()


def _chunk_jacobian(probs_V_C: Tensor, w_V_H: Tensor, y_C: Tensor) -> Tensor:
    """`d lp / d h = w_y - sum_v p_v w_v` per row, (C, H), from vocabulary-major probs."""
    w = w_V_H.float()
    return w[y_C] - (w.T @ probs_V_C).T


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
            # vocabulary-major logits (V, C): `W @ h.T` runs ~25% faster than `h @ W.T` on
            # CPU for V >> C (bench/profile_rl_step.py), and the softmax reduces over dim 0
            logits_V_C = vocab_major_logits(w_V_H, h_M_H[s : s + CHUNK_ROWS])
            lse_C = torch.logsumexp(logits_V_C, dim=0)
            y_C = y_M[s : s + CHUNK_ROWS]
            lse.append(lse_C)
            tgt.append(logits_V_C[y_C, torch.arange(y_C.shape[0], device=y_C.device)])
            eager_C = eager_M[s : s + CHUNK_ROWS]
            if not want_jacobian or not bool(eager_C.any()):
                continue
            if bool(eager_C.all()):  # the common case: softmax in place, no copy
                jac.append(_chunk_jacobian(logits_V_C.sub_(lse_C).exp_(), w_V_H, y_C))
            else:
                e = eager_C.nonzero().squeeze(-1)
                probs_V_E = (logits_V_C[:, e] - lse_C[e]).exp_()
                jac.append(_chunk_jacobian(probs_V_E, w_V_H, y_C[e]))
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
            probs_V_C = vocab_major_logits(w_V_H, h_M_H[idx]).sub_(lse_M[idx]).exp_()
            g_C = g_M[idx].to(probs_V_C.dtype)
            grad_h[idx] = (g_C[:, None] * _chunk_jacobian(probs_V_C, w_V_H, y_M[idx])).to(
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
    """True when a group's common prefix can be run once and its KV cache reused by each member
    with exactly the gradient of separate passes: every layer is full (global) attention whose
    cache is a plain K/V tensor per layer, and logits are `h @ W.T`.

    Families that fall back to one pass per sequence: linear-attention hybrids (Qwen3.5,
    Qwen3.5-MoE, Qwen3-Next: their recurrent state is not a K/V tensor the completions can
    attend to) and sliding-window layers (Gemma-3, Mistral with `sliding_window`: the window
    cache drops prefix positions a completion token may still see in the separate pass).
    """
    cfg = lm.config
    layer_types = getattr(cfg, "layer_types", None) or ["full_attention"]
    sliding = getattr(cfg, "sliding_window", None)
    if sliding is not None and getattr(cfg, "use_sliding_window", True):
        return False
    return all(t == "full_attention" for t in layer_types) and plain_unembedding(lm)


@dataclass(frozen=True)
class PrefixGroup:
    """Sequences `members` (indices into the batch) whose inputs share their first `shared`
    tokens; `shared = 0` means the member runs alone (one sequence, no reuse)."""

    members: tuple[int, ...]
    shared: int


def _common_prefix(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    n = 0
    for x, y in zip(a[:limit], b[:limit], strict=False):
        if x != y:
            break
        n += 1
    return n


def prefix_groups(inputs: Sequence[Sequence[int]], share: bool = True) -> list[PrefixGroup]:
    """Group sequences by a shared leading prefix (a GRPO group's prompt).

    Sequences are sorted so that common prefixes are adjacent, then swept once: a sequence joins
    the current group when the tokens saved, `members x prefix`, do not drop (so the common
    chat-template header of two different prompts does not merge their groups). Each member keeps
    at least one token of its own (`shared <= len - 1`). Groups of one run unshared.
    """
    if not share:
        return [PrefixGroup((i,), 0) for i in range(len(inputs))]
    order = sorted(range(len(inputs)), key=lambda i: tuple(inputs[i]))
    groups: list[PrefixGroup] = []
    members: list[int] = []
    shared = 0
    for i in order:
        if members:
            limit = min(shared, len(inputs[i]) - 1)
            lcp = _common_prefix(inputs[members[0]], inputs[i], limit)
            if (len(members) + 1) * lcp >= len(members) * shared and lcp > 0:
                members.append(i)
                shared = lcp
                continue
            groups.append(PrefixGroup(tuple(members), shared if len(members) > 1 else 0))
        members, shared = [i], len(inputs[i]) - 1
    if members:
        groups.append(PrefixGroup(tuple(members), shared if len(members) > 1 else 0))
    return groups


PACKED_ROW_TOKENS = 512  # attention over a packed row is dense (row^2); see `pack_rows`


@dataclass(frozen=True)
class Segment:
    """Group `group`'s prefix followed by the suffixes of `members`: one prefix tree."""

    group: int
    members: tuple[int, ...]


@dataclass(frozen=True)
class PackedRow:
    """One packed sequence: prefix-tree segments side by side (they do not see each other)."""

    segments: tuple[Segment, ...]


def _segment_length(seg: Segment, groups: Sequence[PrefixGroup], lengths: Sequence[int]) -> int:
    c = groups[seg.group].shared
    return c + sum(lengths[i] - c for i in seg.members)


def _row_length(row: PackedRow, groups: Sequence[PrefixGroup], lengths: Sequence[int]) -> int:
    return sum(_segment_length(seg, groups, lengths) for seg in row.segments)


def pack_rows(
    groups: Sequence[PrefixGroup], lengths: Sequence[int], row_tokens: int | None = None
) -> list[PackedRow]:
    """Shared groups as prefix-tree segments `[prefix, suffix_1, suffix_2, ...]` packed into
    rows of at most `row_tokens` tokens (more when one prefix plus one suffix is longer).

    A group longer than a row is cut into segments that each repeat its prefix. Segments are
    then dealt longest first to the least-filled row they fit in (opening a row only when none
    fits), over as few rows as the tokens need, so rows come out near equal and the padding
    to the longest row stays small (4 GRPO groups of 235/194/181/132 tokens: two rows of
    ~370, 2% padding, instead of four rows padded to 235, 21%). Attention inside a row is
    computed densely and masked, so its cost per token grows with the row: at 512 it stays
    ~10% of the linear layers' work on SmolLM2-sized models, which see one large matrix.
    """
    row_tokens = PACKED_ROW_TOKENS if row_tokens is None else row_tokens
    segments: list[Segment] = []
    for p, g in enumerate(groups):
        members: list[int] = []
        used = g.shared
        for i in g.members:
            suffix = lengths[i] - g.shared
            if members and used + suffix > row_tokens:
                segments.append(Segment(p, tuple(members)))
                members, used = [], g.shared
            members.append(i)
            used += suffix
        segments.append(Segment(p, tuple(members)))
    size = {seg: _segment_length(seg, groups, lengths) for seg in segments}
    n_rows = max(1, -(-sum(size.values()) // row_tokens))
    rows: list[list[Segment]] = [[] for _ in range(n_rows)]
    load = [0] * n_rows
    for seg in sorted(segments, key=lambda x: -size[x]):
        fits = [r for r in range(len(rows)) if load[r] + size[seg] <= row_tokens or not rows[r]]
        if not fits:
            rows.append([])
            load.append(0)
            fits = [len(rows) - 1]
        r = min(fits, key=lambda k: load[k])
        rows[r].append(seg)
        load[r] += size[seg]
    return [PackedRow(tuple(row)) for row in rows if row]


def tokens_run(groups: Sequence[PrefixGroup], lengths: Sequence[int]) -> int:
    """Real (unpadded) tokens one micro-batch of `groups` runs: whole sequences for unshared
    groups, each packed segment's prefix once plus its members' suffixes for shared ones."""
    if groups[0].shared == 0:
        return sum(lengths[g.members[0]] for g in groups)
    return sum(_row_length(r, groups, lengths) for r in pack_rows(groups, lengths))


def _padded_tokens(groups: Sequence[PrefixGroup], lengths: Sequence[int]) -> int:
    """Padded tokens one micro-batch of `groups` runs: unshared rows padded to the longest;
    shared groups as packed rows (`pack_rows`) padded to the longest row."""
    if groups[0].shared == 0:
        return len(groups) * max(lengths[g.members[0]] for g in groups)
    rows = pack_rows(groups, lengths)
    return len(rows) * max(_row_length(r, groups, lengths) for r in rows)


def plan_microbatches(
    inputs: Sequence[Sequence[int]], max_tokens_per_batch: int, share: bool = True
) -> list[list[PrefixGroup]]:
    """Prefix groups packed into micro-batches of at most `max_tokens_per_batch` padded tokens
    (at least one group each). Shared and unshared groups go in separate micro-batches, and each
    kind is bucketed by length (longest first), so rows of similar length are padded together."""
    lengths = [len(x) for x in inputs]
    groups = prefix_groups(inputs, share)
    groups.sort(
        key=lambda g: (g.shared == 0, -max(lengths[i] for i in g.members) + g.shared, -g.shared)
    )
    batches: list[list[PrefixGroup]] = []
    for g in groups:
        cur = batches[-1] if batches else None
        if (
            cur is not None
            and (cur[0].shared == 0) == (g.shared == 0)
            and _padded_tokens([*cur, g], lengths) <= max_tokens_per_batch
        ):
            cur.append(g)
        else:
            batches.append([g])
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


def _shared_pass(
    lm: torch.nn.Module, inputs, targets, groups: list[PrefixGroup], device: torch.device
) -> dict[int, Tensor]:
    """Every group as a prefix-tree segment `[prefix, suffix_1, ..., suffix_G]`, segments packed
    into rows (`pack_rows`), all run in ONE forward: the linear layers see one (rows x width)
    matrix, and attention (`tree_attention.prefix_tree_attention`) lets a prefix token see its
    prefix causally and a suffix token its group's whole prefix and its own earlier tokens,
    nothing of the other members or segments, computing only those blocks. Positions restart
    after the prefix (`c, c+1, ...` for every member), so each token's hidden state is the one
    of its separate pass; the prefix runs once per segment (with gradient, which autograd sums
    over the members attending to it: the unshared gradient).

    Log-probs at prefix positions are computed once per distinct (segment, position, target): the
    members share the hidden state there, so a prompt position costs one unembedding row per
    group, not one per member. Row padding is attended by no one and read by no one.
    """
    lengths = [len(x) for x in inputs]
    rows = pack_rows(groups, lengths)
    width = max(_row_length(r, groups, lengths) for r in rows)
    ids_R_N = torch.zeros((len(rows), width), dtype=torch.long)
    pos_R_N = torch.zeros((len(rows), width), dtype=torch.long)
    prefixes: list[range] = []  # flat positions of each segment's prefix
    suffixes: list[tuple[range, int]] = []  # flat positions of each member's suffix, segment
    prefix_rows: dict[tuple[int, int], int] = {}  # (flat position, target) -> lp row
    prefix_src: list[int] = []  # flat hidden index of each distinct prefix lp row
    prefix_tgt: list[int] = []
    suffix_src: list[int] = []
    suffix_tgt: list[Tensor] = []
    row_of: dict[int, list[int]] = {}  # each member's prefix lp rows
    suffix_start: dict[int, int] = {}  # where each member's suffix lp rows begin
    for r, row in enumerate(rows):
        at = 0
        for seg in row.segments:
            c = groups[seg.group].shared
            start = at  # the segment's prefix occupies [start, start + c)
            ids_R_N[r, at : at + c] = torch.as_tensor(inputs[seg.members[0]][:c])
            pos_R_N[r, at : at + c] = torch.arange(c)
            prefixes.append(range(r * width + at, r * width + at + c))
            at += c
            for i in seg.members:
                s = lengths[i] - c
                ids_R_N[r, at : at + s] = torch.as_tensor(inputs[i][c:])
                pos_R_N[r, at : at + s] = torch.arange(c, c + s)
                suffixes.append((range(r * width + at, r * width + at + s), len(prefixes) - 1))
                y = targets[i].to(torch.long)
                lp_rows = []
                for t, y_t in enumerate(y[:c].tolist()):
                    key = (r * width + start + t, y_t)
                    if key not in prefix_rows:
                        prefix_rows[key] = len(prefix_src)
                        prefix_src.append(key[0])
                        prefix_tgt.append(y_t)
                    lp_rows.append(prefix_rows[key])
                row_of[i] = lp_rows
                suffix_start[i] = len(suffix_src)
                suffix_src.extend(range(r * width + at, r * width + at + s))
                suffix_tgt.append(y[c:])
                at += s
    layout = build_tree_layout(prefixes, suffixes, len(rows) * width, device)
    with tree_attention(lm):
        hidden_R_N_H = lm.get_decoder()(
            input_ids=ids_R_N.to(device),
            position_ids=pos_R_N.to(device),
            use_cache=False,
            prefix_tree=layout,
        )[0]
    hidden_RN_H = hidden_R_N_H.reshape(len(rows) * width, -1)
    eager_M = torch.zeros(len(prefix_src) + len(suffix_src), dtype=torch.bool)
    eager_M[len(prefix_src) :] = True  # completion tokens: the rows an RL loss weights
    lp_all = _row_logprobs(
        lm,
        hidden_RN_H[torch.tensor(prefix_src + suffix_src, dtype=torch.long, device=device)],
        torch.cat([torch.tensor(prefix_tgt, dtype=torch.long), *suffix_tgt]).to(device),
        eager_M.to(device),
    )
    out_lp: dict[int, Tensor] = {}
    for i, lp_rows in row_of.items():
        start = len(prefix_src) + suffix_start[i]
        n_suffix = len(inputs[i]) - len(lp_rows)
        idx = torch.tensor(lp_rows + list(range(start, start + n_suffix)), device=device)
        out_lp[i] = lp_all[idx]
    return out_lp


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

    Sequences are grouped by shared prefix (`prefix_groups`; only where `can_share_prefix`
    holds for the model and `share_prefix` is True), bucketed by length and packed into
    micro-batches of at most `max_tokens_per_batch` padded tokens (`plan_microbatches`). The
    unembedding runs only on real positions, once per group at shared prefix positions.
    Gradient flows when grad mode is on and equals that of one pass per sequence. With `fuse`,
    LoRA projections and SiLU gated MLPs run fused (`fused.fused_training_modules`: the same
    values and gradients, half the MLP activation memory).
    """
    lm = causal_lm(model)
    share = share_prefix and can_share_prefix(lm)
    out: list[Tensor] = [torch.empty(0)] * len(inputs)
    with fused_training_modules(lm) if fuse else nullcontext():
        for batch in plan_microbatches(inputs, max_tokens_per_batch, share):
            if batch[0].shared:
                for i, lp in _shared_pass(lm, inputs, targets, batch, device).items():
                    out[i] = lp
            else:
                idx = [g.members[0] for g in batch]
                lp_B = _plain_pass(lm, inputs, targets, idx, device)
                for i, lp in zip(idx, lp_B, strict=True):
                    out[i] = lp
    return out
