"""Target-token log-probs from hidden states without materialising full-vocabulary logits.

`log p(y_t | x_<=t) = h_t . w_{y_t} - logsumexp_v(h_t . w_v)` for the (frozen, possibly tied)
unembedding `W` (V x H). Computed in row chunks, so peak memory is `chunk x V` instead of
`tokens x V` (8 x 200 x 49,152 fp32 logits are 315 MB per copy on SmolLM2). The backward
recomputes each chunk's softmax and returns only `dL/dh_t = g_t (w_{y_t} - softmax_t @ W)`,
skipping rows whose incoming gradient is zero (prompt tokens under an RL loss). This is the
"fused linear cross-entropy" idea (e.g. Liger-Kernel's FusedLinearCrossEntropy), written in torch.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import DynamicCache

CHUNK_ROWS = 256  # 256 x 49,152 fp32 = 50 MB per logits chunk for SmolLM2 (2-3 live at once)


def _chunk_lse_and_target(h_M_H: Tensor, w_V_H: Tensor, y_M: Tensor) -> tuple[Tensor, Tensor]:
    lse, tgt = [], []
    for s in range(0, h_M_H.shape[0], CHUNK_ROWS):
        logits_C_V = h_M_H[s : s + CHUNK_ROWS] @ w_V_H.T
        lse.append(torch.logsumexp(logits_C_V.float(), dim=-1))
        tgt.append(logits_C_V.gather(-1, y_M[s : s + CHUNK_ROWS, None]).squeeze(-1).float())
    if not lse:
        empty = h_M_H.new_zeros((0,), dtype=torch.float32)
        return empty, empty
    return torch.cat(lse), torch.cat(tgt)


class _TargetLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h_M_H: Tensor, w_V_H: Tensor, y_M: Tensor) -> Tensor:  # type: ignore[override]
        lse_M, tgt_M = _chunk_lse_and_target(h_M_H, w_V_H, y_M)
        ctx.save_for_backward(h_M_H, w_V_H, y_M, lse_M)
        return tgt_M - lse_M

    @staticmethod
    def backward(ctx, g_M: Tensor):  # type: ignore[override]
        h_M_H, w_V_H, y_M, lse_M = ctx.saved_tensors
        grad_h = torch.zeros_like(h_M_H)
        rows = torch.nonzero(g_M != 0).squeeze(-1)  # only rows that carry gradient
        for s in range(0, rows.numel(), CHUNK_ROWS):
            idx = rows[s : s + CHUNK_ROWS]
            h_C_H = h_M_H[idx]
            probs_C_V = torch.exp((h_C_H @ w_V_H.T).float() - lse_M[idx, None])
            g_C = g_M[idx].to(probs_C_V.dtype)
            # d lp / d h = w_y - sum_v p_v w_v
            grad_C_H = w_V_H[y_M[idx]].float() - probs_C_V @ w_V_H.float()
            grad_h[idx] = (g_C[:, None] * grad_C_H).to(grad_h.dtype)
        return grad_h, None, None


def target_logprobs(h_M_H: Tensor, w_V_H: Tensor, y_M: Tensor) -> Tensor:
    """float32 log-probs (M,) of targets `y_M` given final hidden states (M, H) and unembedding
    (V, H). Differentiable in `h_M_H` only; a trainable `w_V_H` falls back to the plain path."""
    if w_V_H.requires_grad:
        logp_M_V = torch.log_softmax((h_M_H @ w_V_H.T).float(), dim=-1)
        return logp_M_V.gather(-1, y_M[:, None]).squeeze(-1)
    return _TargetLogprobs.apply(h_M_H, w_V_H, y_M)


def causal_lm(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers *ForCausalLM inside a PeftModel (LoRA layers already injected)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def _plain_unembedding(lm: torch.nn.Module) -> bool:
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
    return all(t == "full_attention" for t in layer_types) and _plain_unembedding(lm)


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


def _padded_tokens(groups: Sequence[PrefixGroup], lengths: Sequence[int]) -> int:
    """Padded tokens one micro-batch of `groups` runs: prefixes (P x C) + suffixes (D x L)."""
    members = [i for g in groups for i in g.members]
    suffix = max(lengths[i] - g.shared for g in groups for i in g.members)
    prefix = max(g.shared for g in groups)
    return (len(groups) * prefix if prefix else 0) + len(members) * suffix


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


def _row_logprobs(lm: torch.nn.Module, h_M_H: Tensor, y_M: Tensor) -> Tensor:
    return target_logprobs(h_M_H, lm.get_output_embeddings().weight, y_M)


def _cache_kwarg(module: torch.nn.Module) -> str:
    # transformers renamed `past_key_values` to `cache` (the old name is deprecated)
    params = inspect.signature(module.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


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
    if _plain_unembedding(lm):
        hidden_B_N_H = lm.get_decoder()(input_ids=ids_B_N, attention_mask=mask_B_N)[0]
        lp_M = _row_logprobs(lm, hidden_B_N_H[valid_B_N], tgt_B_N[valid_B_N])
    else:  # unusual heads (bias, softcap): full logits, still only on real positions
        logits_B_N_V = lm(input_ids=ids_B_N, attention_mask=mask_B_N).logits
        logp_M_V = torch.log_softmax(logits_B_N_V[valid_B_N].float(), dim=-1)
        lp_M = logp_M_V.gather(-1, tgt_B_N[valid_B_N][:, None]).squeeze(-1)
    return list(torch.split(lp_M, [len(inputs[i]) for i in idx]))


BUCKET_RATIO = 0.75  # a suffix shorter than this fraction of its bucket's longest starts a new one


def _length_buckets(lengths_desc: Sequence[int]) -> list[list[int]]:
    """Indices of `lengths_desc` (sorted longest first) cut into runs whose shortest is at least
    `BUCKET_RATIO` x their longest: padding stays under 25% for a few extra (smaller) forwards."""
    buckets: list[list[int]] = []
    for d, n in enumerate(lengths_desc):
        if buckets and n >= BUCKET_RATIO * lengths_desc[buckets[-1][0]]:
            buckets[-1].append(d)
        else:
            buckets.append([d])
    return buckets


def _shared_pass(
    lm: torch.nn.Module, inputs, targets, groups: list[PrefixGroup], device: torch.device
) -> dict[int, Tensor]:
    """Each group's prefix once (with gradient), its KV cache indexed out to the members, then
    forwards over the members' own suffixes (in length buckets) attending to that cache.

    Log-probs at prefix positions are computed once per distinct (group, position, target):
    members share the hidden state there, so a prompt position costs one unembedding row per
    group, not one per member. Autograd sums the members' gradients into the shared prefix
    (the index/`index_select` backward is a scatter-add), which is the unshared gradient.
    """
    dec = lm.get_decoder()
    cache_kw = _cache_kwarg(dec)
    n_groups, prefix = len(groups), max(g.shared for g in groups)
    ids_P_C = torch.zeros((n_groups, prefix), dtype=torch.long)
    mask_P_C = torch.zeros((n_groups, prefix), dtype=torch.long)
    for p, g in enumerate(groups):
        ids_P_C[p, : g.shared] = torch.as_tensor(inputs[g.members[0]][: g.shared])
        mask_P_C[p, : g.shared] = 1
    out = dec(
        input_ids=ids_P_C.to(device),
        attention_mask=mask_P_C.to(device),
        position_ids=torch.arange(prefix, device=device)[None].expand(n_groups, -1),
        use_cache=True,
    )
    hidden_PC_H = out[0].reshape(n_groups * prefix, -1)
    cache = getattr(out, "cache", None) or out.past_key_values
    kv = [(layer.keys, layer.values) for layer in cache.layers]
    mask_P_C = mask_P_C.to(device)

    # members longest suffix first, run in length buckets so short suffixes are not padded
    # to the longest one; each bucket attends to its own expansion of the prefix KV
    members = [(p, i) for p, g in enumerate(groups) for i in g.members]
    members.sort(key=lambda m: len(inputs[m[1]]) - groups[m[0]].shared, reverse=True)
    suffix_len = [len(inputs[i]) - groups[p].shared for p, i in members]
    hidden_parts: list[Tensor] = []
    suffix_offset: list[int] = []  # row of each member's first suffix position
    rows_so_far = 0
    for bucket in _length_buckets(suffix_len):
        width = suffix_len[bucket[0]]
        ids_B_L = torch.zeros((len(bucket), width), dtype=torch.long)
        mask_B_L = torch.zeros((len(bucket), width), dtype=torch.long)
        pos_B_L = torch.zeros((len(bucket), width), dtype=torch.long)
        for b, d in enumerate(bucket):
            p, i = members[d]
            c, n = groups[p].shared, len(inputs[i])
            ids_B_L[b, : n - c] = torch.as_tensor(inputs[i][c:])
            mask_B_L[b, : n - c] = 1
            pos_B_L[b] = torch.arange(c, c + width)
            suffix_offset.append(rows_so_far + b * width)
        group_B = torch.tensor([members[d][0] for d in bucket], device=device)
        bucket_cache = DynamicCache(config=dec.config)
        for layer, (k, v) in enumerate(kv):  # differentiable indexing: KV expanded to members
            bucket_cache.update(k[group_B], v[group_B], layer)
        out = dec(
            input_ids=ids_B_L.to(device),
            attention_mask=torch.cat([mask_P_C[group_B], mask_B_L.to(device)], dim=1),
            position_ids=pos_B_L.to(device),
            use_cache=True,
            **{cache_kw: bucket_cache},
        )
        hidden_parts.append(out[0].reshape(len(bucket) * width, -1))
        rows_so_far += len(bucket) * width
    hidden_DL_H = torch.cat(hidden_parts)

    # rows: distinct (group, prefix position, target) first, then every suffix position
    prefix_rows: dict[tuple[int, int, int], int] = {}
    prefix_src: list[int] = []
    prefix_tgt: list[int] = []
    suffix_src: list[int] = []
    suffix_tgt: list[Tensor] = []
    row_of: list[list[int]] = []  # each member's prefix rows
    suffix_start: list[int] = []  # where each member's suffix rows begin
    for d, (p, i) in enumerate(members):
        c, n = groups[p].shared, len(inputs[i])
        y = targets[i].to(torch.long)
        rows = []
        for t, y_t in enumerate(y[:c].tolist()):
            key = (p, t, y_t)
            if key not in prefix_rows:
                prefix_rows[key] = len(prefix_src)
                prefix_src.append(p * prefix + t)
                prefix_tgt.append(y_t)
            rows.append(prefix_rows[key])
        suffix_start.append(len(suffix_src))
        suffix_src.extend(suffix_offset[d] + t for t in range(n - c))
        suffix_tgt.append(y[c:])
        row_of.append(rows)
    lp_prefix = _row_logprobs(
        lm,
        hidden_PC_H[torch.tensor(prefix_src, dtype=torch.long, device=device)],
        torch.tensor(prefix_tgt, dtype=torch.long, device=device),
    )
    lp_suffix = _row_logprobs(
        lm,
        hidden_DL_H[torch.tensor(suffix_src, dtype=torch.long, device=device)],
        torch.cat(suffix_tgt).to(device),
    )
    lp_all = torch.cat([lp_prefix, lp_suffix])
    out_lp: dict[int, Tensor] = {}
    for rows, start, (p, i) in zip(row_of, suffix_start, members, strict=True):
        start += len(prefix_src)
        n_suffix = len(inputs[i]) - groups[p].shared
        idx = torch.tensor(rows + list(range(start, start + n_suffix)), device=device)
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
) -> list[Tensor]:
    """Per-sequence float32 log-probs `log p(targets[i][t] | inputs[i][:t+1])` (shape (N_i,)).

    Sequences are grouped by shared prefix (`prefix_groups`; only where `can_share_prefix`
    holds for the model and `share_prefix` is True), bucketed by length and packed into
    micro-batches of at most `max_tokens_per_batch` padded tokens (`plan_microbatches`). The
    unembedding runs only on real positions, once per group at shared prefix positions.
    Gradient flows when grad mode is on and equals that of one pass per sequence.
    """
    lm = causal_lm(model)
    share = share_prefix and can_share_prefix(lm)
    out: list[Tensor] = [torch.empty(0)] * len(inputs)
    for batch in plan_microbatches(inputs, max_tokens_per_batch, share):
        if batch[0].shared:
            for i, lp in _shared_pass(lm, inputs, targets, batch, device).items():
                out[i] = lp
        else:
            idx = [g.members[0] for g in batch]
            for i, lp in zip(idx, _plain_pass(lm, inputs, targets, idx, device), strict=True):
                out[i] = lp
    return out
