"""Target-token log-probs from hidden states without materialising full-vocabulary logits.

`log p(y_t | x_<=t) = h_t . w_{y_t} - logsumexp_v(h_t . w_v)` for the (frozen, possibly tied)
unembedding `W` (V x H). Computed in row chunks, so peak memory is `chunk x V` instead of
`tokens x V` (8 x 200 x 49,152 fp32 logits are 315 MB per copy on SmolLM2). The backward
recomputes each chunk's softmax and returns only `dL/dh_t = g_t (w_{y_t} - softmax_t @ W)`,
skipping rows whose incoming gradient is zero (prompt tokens under an RL loss). This is the
"fused linear cross-entropy" idea (e.g. Liger-Kernel's FusedLinearCrossEntropy), written in torch.
"""

from __future__ import annotations

import torch
from torch import Tensor

CHUNK_ROWS = 512  # 512 x 49,152 fp32 = 100 MB peak for SmolLM2


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


def _causal_lm(model: torch.nn.Module) -> torch.nn.Module:
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


def sequence_logprobs(
    model: torch.nn.Module,
    inputs: list[list[int]],
    targets: list[Tensor],
    *,
    device: torch.device,
    max_tokens_per_batch: int = 8192,
) -> list[Tensor]:
    """Per-sequence float32 log-probs `log p(targets[i][t] | inputs[i][:t+1])` (shape (N_i,)).

    Sequences are right-padded into micro-batches of at most `max_tokens_per_batch` padded tokens;
    the unembedding runs only on real (non-pad) positions. Gradient flows when grad mode is on.
    """
    lm = _causal_lm(model)
    out: list[Tensor] = [torch.empty(0)] * len(inputs)
    order = list(range(len(inputs)))
    start = 0
    while start < len(order):
        # Greedy packing in the given order: B * max_len <= budget (at least one sequence).
        end, longest = start, 0
        while end < len(order):
            longest_next = max(longest, len(inputs[order[end]]))
            if end > start and longest_next * (end - start + 1) > max_tokens_per_batch:
                break
            longest, end = longest_next, end + 1
        idx = order[start:end]
        start = end
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
            w_V_H = lm.get_output_embeddings().weight
            lp_M = target_logprobs(hidden_B_N_H[valid_B_N], w_V_H, tgt_B_N[valid_B_N])
        else:  # unusual heads (bias, softcap): full logits, still only on real positions
            logits_B_N_V = lm(input_ids=ids_B_N, attention_mask=mask_B_N).logits
            logp_M_V = torch.log_softmax(logits_B_N_V[valid_B_N].float(), dim=-1)
            lp_M = logp_M_V.gather(-1, tgt_B_N[valid_B_N][:, None]).squeeze(-1)
        lengths = [len(inputs[i]) for i in idx]
        for i, lp in zip(idx, torch.split(lp_M, lengths), strict=True):
            out[i] = lp
    return out
