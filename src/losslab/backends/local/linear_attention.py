"""Gated-DeltaNet linear attention for the local backend: prefix sharing through the recurrent
state, and CPU paths faster than transformers' reference ones.

transformers' hybrid families (Qwen3.5 dense and MoE, Qwen3-Next) run each Gated-DeltaNet
layer as projections, a causal depthwise conv (`causal_conv1d_fn`; one token at a time while
decoding, `causal_conv1d_update`) and the gated delta rule (`torch_chunk_gated_delta_rule`; one
token, `torch_recurrent_gated_delta_rule`). The layer's forward looks these four names up in
its modeling module at each call and hands them its keyword arguments, so `install()` puts a
dispatcher in their place once per module (as `tree_attention` registers its attention
function) and keeps transformers' function as the fallback:

- **Prefix tree** (`prefix_tree=` in the keyword arguments, from `logprobs._trie_pass`): the
  flat row holds a trie (a group's prompt once, each completion after it). The conv of a token
  reads the K - 1 tokens before it *on its own path* (`LinearTree.conv_gather_T_K`), and the
  delta rule runs per segment of the trie, level by level, each segment starting from the
  recurrent state its parent segment ended with (the chunked rule takes an initial state).
  The prompt's state forks into every completion, and autograd sums the completions'
  gradients into it: values and gradients of separate passes.
- **CPU** (`chunk_gated_delta_rule`, `recurrent_gated_delta_rule`, `causal_conv1d_update`):
  the reference chunked rule writes each chunk's output into a preallocated tensor and reads
  per-chunk slices, so its backward materialises a zero tensor of the whole output for every
  chunk (`select_backward` + `fill_`, quadratic in the chunks); here the chunks are `unbind`
  views and the outputs one `stack`, the two triangular solves one, and the decode step
  updates the recurrent state in place (one batched matmul and a rank-one `addcmul_`) instead
  of allocating it five times; the sampler stores the states value-major
  (`value_major_states`), the layout in which that matmul runs at the memory's speed.
- **CUDA**: `flash-linear-attention`'s `chunk_gated_delta_rule` / `fused_recurrent_gated_delta_rule`
  and `causal-conv1d`'s kernels when installed (the `gpu` extra), also per tree level.

`kernel_report()` says which implementation ran how often (the training client's
`describe()` and the run's executed config record it).
"""

from __future__ import annotations

import functools
import importlib
import os
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import Tensor

FAMILIES = ("qwen3_5", "qwen3_5_moe", "qwen3_next")
"""transformers model types whose Gated-DeltaNet layers `install()` dispatches."""

FUNCTIONS = (
    "torch_chunk_gated_delta_rule",
    "torch_recurrent_gated_delta_rule",
    "causal_conv1d_fn",
    "causal_conv1d_update",
)

_calls: Counter[tuple[str, str]] = Counter()
_calls_lock = threading.Lock()


def _count(function: str, implementation: str) -> None:
    with _calls_lock:
        _calls[function, implementation] += 1


def kernel_report() -> dict[str, dict[str, int]]:
    """{function: {implementation: calls}} of every linear-attention call in this process."""
    with _calls_lock:
        out: dict[str, dict[str, int]] = {}
        for (function, impl), n in sorted(_calls.items()):
            out.setdefault(function, {})[impl] = n
        return out


REFERENCE_ENV = "LOSSLAB_LINEAR_ATTENTION"


def reference_forced() -> bool:
    """True when `$LOSSLAB_LINEAR_ATTENTION=reference`: every call outside a prefix-tree pass
    runs transformers' own function (to measure against it, or to rule these paths out)."""
    return os.environ.get(REFERENCE_ENV, "") == "reference"


# ----------------------------------------------------------------------------- CUDA kernels


@functools.cache
def _fla() -> dict[str, Callable] | None:
    """flash-linear-attention's gated delta rule kernels, or None when not installed."""
    try:
        module = importlib.import_module("fla.ops.gated_delta_rule")
        return {
            "chunk": module.chunk_gated_delta_rule,
            "recurrent": module.fused_recurrent_gated_delta_rule,
        }
    except Exception:  # not installed, or built for another torch / CUDA
        return None


@functools.cache
def _causal_conv1d() -> dict[str, Callable] | None:
    """Tri Dao's causal-conv1d kernels, or None when not installed."""
    try:
        module = importlib.import_module("causal_conv1d")
        return {"fn": module.causal_conv1d_fn, "update": module.causal_conv1d_update}
    except Exception:
        return None


def kernels_for(device: torch.device | str) -> dict[str, str]:
    """The implementation each function dispatches to on `device` (plain and tree passes)."""
    cuda = torch.device(device).type == "cuda" and not reference_forced()
    fla = "flash-linear-attention" if cuda and _fla() is not None else "losslab-torch"
    conv = "causal-conv1d" if cuda and _causal_conv1d() is not None else "transformers-torch"
    if reference_forced():
        plain = ("chunk_gated_delta_rule", "recurrent_gated_delta_rule", "causal_conv1d_fn")
        return {f: "transformers" for f in (*plain, "causal_conv1d_update")} | {
            "prefix_tree": "losslab tree conv + per-level losslab-torch delta rule"
        }
    return {
        "chunk_gated_delta_rule": fla,
        "recurrent_gated_delta_rule": fla,
        "causal_conv1d_fn": conv,
        "causal_conv1d_update": "causal-conv1d" if conv == "causal-conv1d" else "losslab-torch",
        "prefix_tree": f"losslab tree conv + per-level {fla} delta rule",
    }


# ----------------------------------------------------------------------------- CPU gated delta rule


def _l2norm(x: Tensor, eps: float = 1e-6) -> Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def _heads_first(q, k, v, g, beta, l2norm: bool) -> tuple[Tensor, ...]:
    """(B, T, H, D) inputs -> float32 (B, H, T, D), key heads repeated for grouped value heads,
    q/k L2-normalised when asked and q scaled by 1/sqrt(D), as the reference does."""
    num_k, num_v = k.shape[2], v.shape[2]
    if num_k != num_v:
        q = q.repeat_interleave(num_v // num_k, dim=2)
        k = k.repeat_interleave(num_v // num_k, dim=2)
    q, k, v, beta, g = (
        x.transpose(1, 2).to(torch.float32, memory_format=torch.contiguous_format)
        for x in (q, k, v, beta, g)
    )
    if l2norm:
        q, k = _l2norm(q), _l2norm(k)
    return q * q.shape[-1] ** -0.5, k, v, g, beta


def unit_lower_inverse(system: Tensor) -> Tensor:
    """`T^-1` for the unit lower-triangular `T` whose strictly lower part is `system`'s (the
    diagonal and upper part are ignored), batched over leading dims: (..., C, C).

    Solved against the identity (C right-hand sides) and applied to the chunk's [v; k] with one
    batched GEMM, instead of a triangular solve with all (Dv + Dk) right-hand sides: LAPACK
    solves each (C, C) system on its own, so the solve cost ~8x more than the GEMM. Measured on
    the bench's completion level (96 systems of 32 with 256 right-hand sides, 2 threads,
    2026-12-06): forward 0.79 vs 2.27 ms, forward + backward 4.2 vs 6.5 ms; the result is the
    solve's to fp32 round-off (relative 5e-8 against a float64 solve)."""
    eye = torch.eye(system.shape[-1], dtype=system.dtype, device=system.device)
    return torch.linalg.solve_triangular(
        system, eye.expand_as(system), upper=False, unitriangular=True
    )


def chunk_gated_delta_rule(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    g: Tensor,
    beta: Tensor,
    chunk_size: int = 64,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    state_rows: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """The chunked gated delta rule, the reference's arguments and values (`query`/`key`
    (B, T, Hk, Dk), `value` (B, T, Hv, Dv), `g`/`beta` (B, T, Hv); output (B, T, Hv, Dv) and
    the final state (B, Hv, Dk, Dv)), with a backward that is linear in the chunks.

    `state_rows` (B,): row b starts from `initial_state[state_rows[b]]` (P, Hv, Dk, Dv), the
    trie's forked states (a GRPO group's completions all continue their prompt's state).
    The first chunk's products with the state then run once per shared state over all its
    rows (`_state_product`) instead of on B gathered copies.

    Per chunk of C tokens with cumulative log-decay `c`, `Gamma_ij = exp(c_i - c_j)` (j <= i):
    `U = T^-1 (beta v)`, `W = T^-1 (beta k exp(c))` with `T = I + strictly_lower((beta k k^T)
    Gamma)`; then sequentially over chunks `v' = U - W S`, `o = (q exp(c)) S + ((q k^T)
    Gamma) v'`, `S <- S exp(c_C) + (k exp(c_C - c))^T v'`."""
    out_dtype = query.dtype
    length = key.shape[1]
    q, k, v, g, beta = _heads_first(query, key, value, g, beta, use_qk_l2norm_in_kernel)
    batch, heads, _, dk = k.shape
    dv = v.shape[-1]
    pad = (chunk_size - length % chunk_size) % chunk_size
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        g, beta = (F.pad(x, (0, pad)) for x in (g, beta))
    n = (length + pad) // chunk_size
    q, k, v = (x.view(batch, heads, n, chunk_size, -1) for x in (q, k, v))
    c = g.view(batch, heads, n, chunk_size).cumsum(-1)
    beta = beta.view(batch, heads, n, chunk_size, 1)
    above = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).triu(1)
    gamma = (c[..., :, None] - c[..., None, :]).masked_fill(above, float("-inf")).exp()
    k_beta = k * beta
    system = (k_beta @ k.transpose(-1, -2)) * gamma  # the diagonal is ignored (unitriangular)
    rhs = torch.cat([v * beta, k_beta * c.exp()[..., None]], dim=-1)
    u, w = (unit_lower_inverse(system) @ rhs).split([dv, dk], dim=-1)
    intra = (q @ k.transpose(-1, -2)) * gamma
    q_decayed = q * c.exp()[..., None]
    last = c[..., -1:]
    k_decayed = k * (last - c).exp()[..., None]
    chunk_decay = last.exp()[..., None]  # (B, H, N, 1, 1)
    if initial_state is None:
        state = q.new_zeros((batch, heads, dk, dv))
    else:  # (P, H, Dk, Dv), one per shared state, with `state_rows`
        state = initial_state.to(torch.float32)
    runs = None if initial_state is None or state_rows is None else _runs_of(state_rows)
    outs = []
    for i, (u_n, w_n, a_n, qd_n, kd_n, d_n) in enumerate(
        zip(
            u.unbind(2),
            w.unbind(2),
            intra.unbind(2),
            q_decayed.unbind(2),
            k_decayed.unbind(2),
            chunk_decay.unbind(2),
            strict=True,
        )
    ):
        shared = runs if i == 0 else None  # after the first chunk each row has its own state
        v_new = u_n - _state_product(w_n, state, shared)
        outs.append(_state_product(qd_n, state, shared) + a_n @ v_new)
        if i < n - 1 or output_final_state:  # the last update only makes the final state
            own = state if shared is None else state[state_rows]
            state = own * d_n + kd_n.transpose(-1, -2) @ v_new
    out = torch.stack(outs, dim=2).view(batch, heads, n * chunk_size, dv)[:, :, :length]
    out = out.transpose(1, 2).to(out_dtype, memory_format=torch.contiguous_format)
    return out, state if output_final_state else None


def _runs_of(state_rows: Tensor) -> list[tuple[int, int, int]]:
    """`(state, first row, end row)` for each run of consecutive rows with the same state."""
    runs: list[tuple[int, int, int]] = []
    for row, state in enumerate(state_rows.tolist()):
        if runs and runs[-1][0] == state:
            runs[-1] = (state, runs[-1][1], row + 1)
        else:
            runs.append((state, row, row + 1))
    return runs


def _state_product(
    x_B_H_C_D: Tensor, state: Tensor, runs: list[tuple[int, int, int]] | None
) -> Tensor:
    """`x @ state` with each row's own (B, H, D, E) state when `runs` is None; else `x[b] @
    state[p(b)]` per row b over (P, H, D, E) shared states, as (H, n C, D) @ (H, D, E) products
    over each run of n rows sharing a state (one batched GEMM when the runs are equally long,
    as a trie level's GRPO groups are). On the bench's completion level (4 prompts x 8
    completions, C = 32, D = E = 128, 2 threads, 2026-12-06) the rule's forward + backward took
    18 ms instead of 27 with the per-row (B H, C, D) @ (B H, D, E) bmm (M = 32), which also
    needs B gathered copies of the states and their scatter-add backward. Equal to that bmm bit
    for bit on the tested shapes (`test_chunk_rule_forked_states_equal_gathered_copies`)."""
    if runs is None:
        return x_B_H_C_D @ state
    batch, heads, chunk, dk = x_B_H_C_D.shape
    sizes = {end - first for _, first, end in runs}
    if len(sizes) == 1:  # R runs of n rows: one (R H, n C, D) @ (R H, D, E) bmm
        n = sizes.pop()
        which = [p for p, _, _ in runs]
        states = state if which == list(range(len(state))) else state[which]
        x_RH_M_D = x_B_H_C_D.view(len(runs), n, heads, chunk, dk).transpose(1, 2)
        y = x_RH_M_D.reshape(len(runs) * heads, n * chunk, dk) @ states.flatten(0, 1)
        return (
            y.view(len(runs), heads, n, chunk, -1).transpose(1, 2).reshape(batch, heads, chunk, -1)
        )
    parts = []
    for p, first, end in runs:
        x_H_M_D = x_B_H_C_D[first:end].transpose(0, 1).reshape(heads, -1, dk)
        y_H_M_E = x_H_M_D @ state[p]
        parts.append(y_H_M_E.view(heads, end - first, chunk, -1).transpose(0, 1))
    return torch.cat(parts)


def is_value_major(state: Tensor) -> bool:
    """True when a (B, H, Dk, Dv) recurrent state is stored value-major: the memory of a
    contiguous (B, H, Dv, Dk) tensor (`value_major`)."""
    return state.dim() == 4 and state.transpose(-1, -2).is_contiguous()


def value_major(state: Tensor) -> Tensor:
    """The same (B, H, Dk, Dv) values stored value-major (one copy). The decode step reads
    `[k; q] S` as `S^T [k; q]^T`, a batched matrix-vector product over contiguous rows of `S^T`:
    0.51 vs 1.17 ms a layer at 64 rows on the bench model, where the (2, Dk) x (Dk, Dv) form
    ran far below the memory's speed (`bench/results_vs_trl_qwen3_5.json`'s VM, 2026-12-03)."""
    return state.transpose(-1, -2).contiguous().transpose(-1, -2)


def value_major_states(cache: Any) -> int:
    """Store every float32 CPU recurrent state of a transformers hybrid cache value-major, in
    place of the cache's own tensors (after a prefill or a `reorder_cache`, whose
    `index_select` makes them contiguous again); returns how many were converted. Caches
    without `layers[i].recurrent_states` (transformers' dict of states) are left alone, and so
    are CUDA states: the flash-linear-attention kernels take the contiguous layout."""
    converted = 0
    for layer in getattr(cache, "layers", ()):
        states = getattr(layer, "recurrent_states", None)  # {state index: tensor or None}
        if not isinstance(states, dict):
            continue
        for i, state in states.items():
            if (
                isinstance(state, Tensor)
                and state.device.type == "cpu"
                and state.dtype == torch.float32
                and state.dim() == 4
                and not is_value_major(state)
            ):
                states[i] = value_major(state)
                converted += 1
    return converted


def recurrent_gated_delta_rule(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    g: Tensor,
    beta: Tensor,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """The gated delta rule one token at a time (the decode step), the reference's values.

    Per token: `S' = S exp(g) + k^T delta` with `delta = (v - k S exp(g)) beta`, and
    `o = q S' = exp(g) (q S) + (q . k) delta`, so one batched matmul `[k; q] S` reads the
    (B H, Dk, Dv) state once and the update writes it once (a scale and a rank-one `addcmul_`):
    decoding is bound by these state passes (12.6 MB a layer at 64 rows on the bench model).
    Without autograd a float32 `initial_state` (the cache's own tensor) is updated in place
    and returned, so the cache's `copy_` of it is a no-op; with autograd it is left untouched.
    A value-major state (`value_major_states`, the sampler's layout) runs as `S^T [k; q]^T`."""
    out_dtype = query.dtype
    q, k, v, g, beta = _heads_first(query, key, value, g, beta, use_qk_l2norm_in_kernel)
    batch, heads, length, dk = k.shape
    dv = v.shape[-1]
    in_place = (
        initial_state is not None
        and not torch.is_grad_enabled()
        and initial_state.dtype == torch.float32
        and (initial_state.is_contiguous() or is_value_major(initial_state))
    )
    if initial_state is None:
        state = q.new_zeros((batch, heads, dk, dv))
    else:
        state = initial_state if in_place else initial_state.to(torch.float32).clone()
    by_value = is_value_major(state) and not state.is_contiguous()
    # (B H, Dv, Dk) rows of S^T when value-major, else (B H, Dk, Dv) rows of S
    s_M = state.transpose(-1, -2) if by_value else state
    s_M = s_M.reshape(batch * heads, *s_M.shape[-2:])
    out = q.new_empty((batch, heads, length, dv))
    decay = g.exp()
    for t in range(length):
        q_t = q[:, :, t].reshape(batch * heads, 1, dk)
        k_t = k[:, :, t].reshape(batch * heads, 1, dk)
        v_t = v[:, :, t].reshape(batch * heads, 1, dv)
        d_t = decay[:, :, t].reshape(batch * heads, 1, 1)
        b_t = beta[:, :, t].reshape(batch * heads, 1, 1)
        kq_M_2_K = torch.cat([k_t, q_t], dim=1)
        if by_value:  # (B H, Dv, Dk) @ (B H, Dk, 2) -> (B H, 2, Dv)
            k_s, q_s = torch.bmm(s_M, kq_M_2_K.transpose(1, 2)).transpose(1, 2).split(1, dim=1)
        else:
            k_s, q_s = torch.bmm(kq_M_2_K, s_M).split(1, dim=1)
        delta = (v_t - k_s * d_t) * b_t  # (B H, 1, Dv)
        # the rank-one update k^T delta, in the stored orientation
        outer = (delta.transpose(1, 2), k_t) if by_value else (k_t.transpose(1, 2), delta)
        if in_place:
            s_M.mul_(d_t).addcmul_(*outer)
        else:
            s_M = torch.addcmul(s_M * d_t, *outer)
        q_k = (q_t * k_t).sum(-1, keepdim=True)
        out[:, :, t] = (q_s * d_t + q_k * delta).view(batch, heads, dv)
    if by_value:
        state = s_M.view(batch, heads, dv, dk).transpose(-1, -2)
    else:
        state = s_M.view(batch, heads, dk, dv)
    out = out.transpose(1, 2).to(out_dtype, memory_format=torch.contiguous_format)
    return out, state if output_final_state else None


def causal_conv1d_update(
    hidden_states: Tensor,
    conv_state: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    activation: str | None = None,
) -> Tensor:
    """One decode step of the causal depthwise conv, the reference's values: the (B, C, K)
    state shifts by one in place and the output is `sum_j w_j state_j` (+ bias, activation)."""
    kernel = conv_state.shape[-1]
    shifted = torch.cat([conv_state[..., 1:], hidden_states.to(conv_state.dtype)], dim=-1)
    conv_state.copy_(shifted)
    out = (shifted[..., -weight.shape[-1] :].to(weight.dtype) * weight).sum(-1, keepdim=True)
    if kernel < weight.shape[-1]:  # a state shorter than the kernel: the reference pads nothing
        raise ValueError(f"conv state of {kernel} positions < kernel {weight.shape[-1]}")
    if bias is not None:
        out = out + bias[:, None]
    if activation is not None:
        out = _activation(activation)(out)
    return out.to(hidden_states.dtype)


def _activation(name: str) -> Callable[[Tensor], Tensor]:
    from transformers.activations import ACT2FN

    return ACT2FN[name]


# ----------------------------------------------------------------------------- prefix tree


MAX_CHUNK = 64  # the reference's chunk size: longer segments run as several chunks


@dataclass(frozen=True)
class TreeLevel:
    """The trie segments at one depth, in batches of similar length: each batch's
    `gather_S_L` holds its segments' flat positions, padded with the flat length (a zero row
    on input, the discard row on output), and runs with chunk size `chunks[i]` (the batch's
    length rounded up to a power of two, at most `MAX_CHUNK`). `parent_S` gives each segment's
    parent among the previous level's segments in batch order (None at the roots, which start
    from a zero state)."""

    gathers: tuple[Tensor, ...]
    chunks: tuple[int, ...]
    parent_S: Tensor | None


@dataclass(frozen=True)
class LinearTree:
    """What a linear-attention layer needs to run a packed prefix trie: for each flat position
    the flat positions of the `K - 1` tokens before it on its own path and itself
    (`conv_gather_T_K`, the flat length where the path is shorter), and the segments level by
    level. Most positions' paths are the flat positions just before them, so the conv runs
    densely over the flat row and only the `conv_fix_F` positions whose path leaves the flat
    order within the kernel (a segment's first K - 1 tokens under a parent that does not end
    right before it) are recomputed from their gathers `conv_fix_gather_F_K`."""

    conv_gather_T_K: Tensor
    levels: tuple[TreeLevel, ...]
    conv_fix_F: Tensor
    conv_fix_gather_F_K: Tensor


def build_linear_tree(
    units: Sequence[tuple[range, Sequence[int]]], n_flat: int, kernel: int, device
) -> LinearTree:
    """The linear-attention layout of the trie whose attention units are `units` (new flat
    positions, flat context: `tree_attention.build_tree_layout`'s input).

    Each unit continues the path that ends at its context's last position. A unit is cut where
    another unit branches off it (after that position), so every branch point ends a segment;
    a segment's parent is the segment its path continues, and its depth the number of
    segments before it on its path."""
    pred = torch.full((n_flat + 1,), n_flat, dtype=torch.long)  # n_flat: no predecessor
    cuts: set[int] = set()
    for new, context in units:
        if len(new):
            pred[new.start + 1 : new.stop] = torch.arange(new.start, new.stop - 1)
            pred[new.start] = context[-1] if context else n_flat
        if context:
            cuts.add(context[-1] + 1)
    columns = [torch.arange(n_flat + 1)]
    for _ in range(kernel - 1):
        columns.append(pred[columns[-1]])
    conv_gather = torch.stack(columns[::-1], dim=1)[:n_flat]
    # the flat row's own causal window (n_flat before its start: the dense conv's zero pad)
    window = torch.arange(n_flat)[:, None] - torch.arange(kernel - 1, -1, -1)[None]
    window = torch.where(window < 0, n_flat, window)
    fix = (conv_gather != window).any(dim=1).nonzero()[:, 0]
    segments: list[tuple[int, int, int]] = []  # (start, stop, parent segment or -1)
    ending_at: dict[int, int] = {}
    for new, context in units:
        bounds = [new.start, *sorted(c for c in cuts if new.start < c < new.stop), new.stop]
        parent = ending_at[context[-1]] if context else -1
        for start, stop in zip(bounds[:-1], bounds[1:], strict=True):
            segments.append((start, stop, parent))
            parent = len(segments) - 1
            ending_at[stop - 1] = parent
    depth: list[int] = []
    for _, _, parent in segments:
        depth.append(0 if parent < 0 else depth[parent] + 1)
    slot: dict[int, int] = {}  # segment -> its index within its level (batch order)
    levels = []
    for d in range(max(depth, default=-1) + 1):
        buckets: dict[int, list[int]] = {}  # by length, powers of two: padding under half
        for s in range(len(segments)):
            if depth[s] == d:
                length = segments[s][1] - segments[s][0]
                buckets.setdefault((length - 1).bit_length(), []).append(s)
        gathers, chunks, order = [], [], []
        for _, members in sorted(buckets.items()):
            width = max(segments[s][1] - segments[s][0] for s in members)
            gather = torch.full((len(members), width), n_flat, dtype=torch.long)
            for i, s in enumerate(members):
                start, stop, _ = segments[s]
                gather[i, : stop - start] = torch.arange(start, stop)
                slot[s] = len(order) + i
            order.extend(members)
            gathers.append(gather.to(device))
            chunks.append(min(MAX_CHUNK, 1 << (width - 1).bit_length()))
        parents = None
        if d:
            parents = torch.tensor([slot[segments[s][2]] for s in order], device=device)
        levels.append(TreeLevel(tuple(gathers), tuple(chunks), parents))
    return LinearTree(
        conv_gather.to(device), tuple(levels), fix.to(device), conv_gather[fix].to(device)
    )


def _with_zero_row(x_T: Tensor) -> Tensor:
    return torch.cat([x_T, x_T.new_zeros((1, *x_T.shape[1:]))])


def _dense_causal_conv(x_1_C_T: Tensor, weight_C_K: Tensor, bias: Tensor | None) -> Tensor:
    """The causal depthwise conv over the flat row: left-pad by K - 1, then `conv1d`."""
    channels, kernel = weight_C_K.shape
    padded = F.pad(x_1_C_T, (kernel - 1, 0))
    return F.conv1d(padded, weight_C_K[:, None, :], bias, groups=channels)


class _FrozenCausalConv(torch.autograd.Function):
    """The dense causal depthwise conv `out_t = sum_j w_j x_(t - K + 1 + j)` (+ bias) with a
    frozen weight (the Gated-DeltaNet conv is never adapted), so the backward needs no input:
    `dx_s = sum_m g_(s + m) w_(K - 1 - m)`, the same conv of the right-padded gradient with the
    flipped kernel. autograd's conv keeps its (C, T + K - 1) padded input for a weight gradient
    no one asks for: on the Qwen3.5 bench step 87 MiB a minibatch (18 layers x 1152 x 1099)."""

    @staticmethod
    def forward(ctx, x_1_C_T, weight_C_K, bias):  # type: ignore[override]
        ctx.save_for_backward(weight_C_K)
        return _dense_causal_conv(x_1_C_T, weight_C_K, bias)

    @staticmethod
    def backward(ctx, g_1_C_T):  # type: ignore[override]
        (weight_C_K,) = ctx.saved_tensors
        channels, kernel = weight_C_K.shape
        padded = F.pad(g_1_C_T, (0, kernel - 1))
        grad_x = F.conv1d(padded, weight_C_K.flip(-1)[:, None, :], groups=channels)
        return grad_x, None, None


def tree_causal_conv1d(
    x_1_C_T: Tensor, weight_C_K: Tensor, bias: Tensor | None, activation: str | None, tree
) -> Tensor:
    """The causal depthwise conv along each token's own path of the trie: (1, C, T) ->
    (1, C, T), `out_t = sum_j w_j x_{path(t, j)}` (+ bias, activation). One dense depthwise
    `conv1d` over the flat row (right wherever the path is the flat order), then the few
    positions where it is not (`LinearTree.conv_fix_F`) from their gathered paths: one conv
    and a small gather instead of K gathers of the whole (T, C) row, forward and backward."""
    channels, kernel = weight_C_K.shape
    in_dtype, x_1_C_T = x_1_C_T.dtype, x_1_C_T.to(weight_C_K.dtype)
    if weight_C_K.requires_grad or (bias is not None and bias.requires_grad):
        dense_1_C_T = _dense_causal_conv(x_1_C_T, weight_C_K, bias)
    else:
        dense_1_C_T = _FrozenCausalConv.apply(x_1_C_T, weight_C_K, bias)
    fix_F = tree.conv_fix_F
    if fix_F.numel():
        x_T1_C = _with_zero_row(x_1_C_T[0].transpose(0, 1))
        paths_F_K_C = x_T1_C.index_select(0, tree.conv_fix_gather_F_K.reshape(-1))
        fixed_F_C = (paths_F_K_C.view(-1, kernel, channels) * weight_C_K.T).sum(dim=1)
        if bias is not None:
            fixed_F_C = fixed_F_C + bias
        dense_1_C_T = dense_1_C_T.index_copy(2, fix_F, fixed_F_C.T[None])
    if activation is not None:
        dense_1_C_T = _activation(activation)(dense_1_C_T)
    return dense_1_C_T.to(in_dtype)


def tree_gated_delta_rule(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    g: Tensor,
    beta: Tensor,
    tree: LinearTree,
    use_qk_l2norm_in_kernel: bool,
    rule: Callable[..., tuple[Tensor, Tensor | None]],
) -> Tensor:
    """The gated delta rule over the trie's segments, one `rule(..., chunk_size=)` call per
    batch of a level: the segments (gathered and right-padded with zeros, which leave the state
    unchanged: zero key, zero log-decay) start from their parents' final states.
    (1, T, H, D) -> (1, T, Hv, Dv). `rule` gets the flat (T + 1)-row inputs and the batch's
    gather, so a checkpointed rule (`recomputed`) keeps the flat tensors, not padded copies."""
    n_flat = query.shape[1]
    flat = tuple(_with_zero_row(x[0]) for x in (query, key, value, g, beta))
    out = value.new_zeros((n_flat + 1, *value.shape[2:]))
    states: Tensor | None = None
    for depth, level in enumerate(tree.levels):
        last = depth == len(tree.levels) - 1  # no level continues from its final states
        finals, start = [], 0
        for idx, chunk in zip(level.gathers, level.chunks, strict=True):
            forked = {}  # the parents' final states, each row's by index (not gathered here)
            if level.parent_S is not None:
                rows = level.parent_S[start : start + idx.shape[0]]
                forked = dict(initial_state=states, state_rows=rows)
            o, final = rule(
                *flat,
                gather=idx,
                chunk_size=chunk,
                output_final_state=not last,
                use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                **forked,
            )
            out = out.index_copy(0, idx.reshape(-1), o.reshape(-1, *o.shape[2:]).to(out.dtype))
            finals.append(final)
            start += idx.shape[0]
        if not last:
            states = finals[0] if len(finals) == 1 else torch.cat(finals)
    return out[:n_flat][None]


def gathered(rule: Callable[..., tuple[Tensor, Tensor | None]]) -> Callable:
    """`rule` on rows `gather` (S, L) of flat (T + 1, H, D) inputs: (S, L, H, D) segments."""

    def run(q, k, v, g, beta, *, gather: Tensor, **kwargs):
        return rule(q[gather], k[gather], v[gather], g[gather], beta[gather], **kwargs)

    return run


def recomputed(rule: Callable[..., tuple[Tensor, Tensor | None]]) -> Callable:
    """`rule` under activation checkpointing when autograd records it: the backward reruns
    the chunk's forward instead of keeping its intermediates (the decay matrices, the solved
    [U W], the decayed q and k: several times its inputs), for about one more forward of the
    delta rule (a few % of a layer's FLOPs)."""

    def run(*args, **kwargs):
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, Tensor)]
        if not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)):
            return rule(*args, **kwargs)
        return torch.utils.checkpoint.checkpoint(rule, *args, use_reentrant=False, **kwargs)

    return run


# ----------------------------------------------------------------------------- dispatch


def _tree_of(prefix_tree: Any) -> LinearTree:
    tree = getattr(prefix_tree, "linear", None)
    if tree is None:
        raise RuntimeError(
            "a prefix-tree pass reached a linear-attention layer without its linear layout; "
            "build the layout with the model's conv kernel size (logprobs._trie_pass)"
        )
    return tree


def _rule_dispatch(reference: Callable, function: str, fla_key: str, ours: Callable) -> Callable:
    """A delta-rule dispatcher with transformers' signature: the prefix tree (chunked rule
    only), transformers' `reference` for packed varlen batches (`cu_seqlens`: only it and fla
    keep them apart), fla on CUDA when installed, else `ours`."""
    chunked = fla_key == "chunk"

    def rule(
        query,
        key,
        value,
        g,
        beta,
        chunk_size: int = 64,
        initial_state=None,
        output_final_state: bool = False,
        use_qk_l2norm_in_kernel: bool = False,
        cu_seqlens=None,
        prefix_tree=None,
        **kwargs,
    ):
        fla = _fla() if query.is_cuda and not reference_forced() else None
        state = dict(
            initial_state=initial_state,
            output_final_state=output_final_state,
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        )
        if prefix_tree is not None and chunked:
            _count(function, f"prefix-tree/{'flash-linear-attention' if fla else 'losslab-torch'}")
            tree = _tree_of(prefix_tree)
            per_level = (
                gathered(_without_chunk_size(fla[fla_key])) if fla else recomputed(gathered(ours))
            )
            out = tree_gated_delta_rule(
                query, key, value, g, beta, tree, use_qk_l2norm_in_kernel, per_level
            )
            return out, None
        own = recomputed(functools.partial(ours, chunk_size=chunk_size) if chunked else ours)
        if cu_seqlens is not None or reference_forced():
            _count(function, "transformers")
            return reference(
                query, key, value, g=g, beta=beta, chunk_size=chunk_size, cu_seqlens=cu_seqlens,
                **state, **kwargs,
            )  # fmt: skip
        if fla:
            _count(function, "flash-linear-attention")
            return fla[fla_key](query, key, value, g=g, beta=beta, **state)
        _count(function, "losslab-torch")
        return own(query, key, value, g, beta, **state)

    return rule


def _without_chunk_size(kernel: Callable) -> Callable:
    """fla's chunked kernel picks its own chunk size and takes one initial state per row (the
    trie's `state_rows` gathered here)."""

    def run(*args, chunk_size: int = MAX_CHUNK, state_rows: Tensor | None = None, **kwargs):
        if state_rows is not None:
            kwargs["initial_state"] = kwargs["initial_state"][state_rows]
        return kernel(*args, **kwargs)

    return run


def _chunk_dispatch(reference: Callable) -> Callable:
    return _rule_dispatch(reference, "chunk_gated_delta_rule", "chunk", chunk_gated_delta_rule)


def _recurrent_dispatch(reference: Callable) -> Callable:
    # a one-token step with a cache is never part of a trie pass (no cache there)
    return _rule_dispatch(
        reference, "recurrent_gated_delta_rule", "recurrent", recurrent_gated_delta_rule
    )


def _conv_dispatch(reference: Callable) -> Callable:
    def conv(hidden_states, weight, bias=None, activation=None, prefix_tree=None, **kwargs):
        if prefix_tree is not None:
            _count("causal_conv1d_fn", "prefix-tree/losslab-torch")
            return tree_causal_conv1d(
                hidden_states, weight, bias, activation, _tree_of(prefix_tree)
            )
        kernels = _causal_conv1d() if hidden_states.is_cuda and not reference_forced() else None
        if kernels and not kwargs.get("seq_idx"):
            _count("causal_conv1d_fn", "causal-conv1d")
            return kernels["fn"](hidden_states, weight, bias, activation=activation)
        _count("causal_conv1d_fn", "transformers")
        return reference(hidden_states, weight, bias, activation=activation, **kwargs)

    return conv


def _conv_update_dispatch(reference: Callable) -> Callable:
    def conv_update(hidden_states, conv_state, weight, bias=None, activation=None):
        forced = reference_forced()
        kernels = _causal_conv1d() if hidden_states.is_cuda and not forced else None
        if kernels:
            _count("causal_conv1d_update", "causal-conv1d")
            return kernels["update"](hidden_states, conv_state, weight, bias, activation)
        one_step = hidden_states.shape[-1] == 1 and conv_state.shape[-1] >= weight.shape[-1]
        if one_step and not forced:
            _count("causal_conv1d_update", "losslab-torch")
            return causal_conv1d_update(hidden_states, conv_state, weight, bias, activation)
        _count("causal_conv1d_update", "transformers")
        return reference(hidden_states, conv_state, weight, bias, activation)

    return conv_update


_DISPATCHERS: dict[str, Callable[[Callable], Callable]] = {
    "torch_chunk_gated_delta_rule": _chunk_dispatch,
    "torch_recurrent_gated_delta_rule": _recurrent_dispatch,
    "causal_conv1d_fn": _conv_dispatch,
    "causal_conv1d_update": _conv_update_dispatch,
}
_installed: dict[str, dict[str, Callable]] = {}  # modeling module -> its reference functions
_install_lock = threading.Lock()


def install(family: str) -> bool:
    """Put the dispatchers in place of the four linear-attention functions of transformers'
    `modeling_<family>` (once; later calls are no-ops). False when that module lacks one of
    them (another transformers version): the family then keeps transformers' own path and
    `install_for` says no."""
    name = f"transformers.models.{family}.modeling_{family}"
    with _install_lock:
        if name in _installed:
            return True
        try:
            module = importlib.import_module(name)
        except ImportError:
            return False
        if not all(callable(getattr(module, f, None)) for f in FUNCTIONS):
            return False
        references = {f: getattr(module, f) for f in FUNCTIONS}
        for f, make in _DISPATCHERS.items():
            dispatcher = make(references[f])
            dispatcher.__wrapped__ = references[f]  # type: ignore[attr-defined]
            setattr(module, f, dispatcher)
        _installed[name] = references
        return True


def reference_functions(family: str) -> dict[str, Callable]:
    """transformers' own functions of `modeling_<family>` (the fallback; for tests)."""
    install(family)
    return dict(_installed[f"transformers.models.{family}.modeling_{family}"])


def linear_attention_modules(lm: torch.nn.Module) -> list[torch.nn.Module]:
    """The Gated-DeltaNet modules of `lm` (modules with a `conv1d` and an `A_log`)."""
    return [m for m in lm.modules() if hasattr(m, "A_log") and hasattr(m, "conv1d")]


def install_for(lm: torch.nn.Module) -> bool:
    """`install()` the family of each linear-attention layer of `lm` (the clients call it when
    they get a model). True when every such layer is dispatched (so a trie pass reaches
    `tree_causal_conv1d` and `tree_gated_delta_rule`), or `lm` has none."""
    ok = True
    for module_name in {type(m).__module__ for m in linear_attention_modules(lm)}:
        family = module_name.rsplit(".modeling_", 1)[-1]
        ok = family in FAMILIES and install(family) and ok
    return ok


def conv_kernel_size(lm: torch.nn.Module) -> int:
    """The causal conv's kernel size of `lm`'s linear-attention layers (1 when it has none)."""
    sizes = {int(m.conv1d.weight.shape[-1]) for m in linear_attention_modules(lm)}
    if len(sizes) > 1:
        raise ValueError(f"linear-attention layers with different conv kernels {sorted(sizes)}")
    return sizes.pop() if sizes else 1
