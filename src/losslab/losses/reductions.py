"""How per-token losses become one number: an explicit `reduction=` on every loss.

Tinker's built-in losses are plain SUMS over tokens and datums (https://tinker-docs.thinkingmachines.ai/losses); the
means follow verl/Stable-RL's `agg_loss` (core_algos.py) but take *global* counts so that the
gradients of minibatches, each reduced with the full batch's counts, sum to the full-batch
gradient (the re-batching bugs of TRL #6024 and verl #7321 are exactly a missing global count).

| reduction                 | value (L_dt already weighted by the mask m_dt)          |
| ------------------------- | ------------------------------------------------------- |
| `sum`                     | Σ_d Σ_t L_dt                                            |
| `token-mean`              | Σ_d Σ_t L_dt / N        N = num_tokens (loss tokens)    |
| `seq-mean-token-sum`      | Σ_d (Σ_t L_dt) / G      G = num_sequences               |
| `seq-mean-token-mean`     | Σ_d (Σ_t L_dt / n_d) / G   n_d = loss tokens of datum d |
| `seq-mean-token-sum-norm` | Σ_d Σ_t L_dt / C        C = norm_constant (Dr. GRPO)    |

Defaults when a count is not given (this batch only, so minibatches will NOT sum to the full
batch): N = loss tokens here, G = datums here with at least one loss token (verl), C = the
largest number of loss tokens in one datum here. `seq-mean-token-sum-norm` divides by C only,
as Stable-RL's `agg_loss` does (Stable-RL c6af1d11 core_algos.py:1073-1077, no 1/G). verl's
current `agg_loss` (verl 1dda039b core_algos.py:1181-1193) and SkyRL
(`advantages / (batch_size * max_seq_len)`) divide by G·C instead: to reproduce them set
C = G·max_len. Both default C to the PADDED width (`loss_mask.shape[-1]`), not to the
largest loss-token count used here. Set C to the sampler's max_tokens for Dr. GRPO's constant
(Liu et al. 2025, "Understanding R1-Zero-Like Training"). Zero local counts (an all-masked
batch) divide by 1: the summed loss is 0 there anyway.
"""

from __future__ import annotations

import math
from typing import get_args

import torch
from torch import Tensor

from losslab.losses.data import PackedTokens
from losslab.losses.declarations import Reduction

REDUCTIONS: tuple[str, ...] = get_args(Reduction)


def _positive(name: str, value: float | None, local: float) -> float | None:
    """Check a caller-given global count: positive, finite, and not below this batch's count."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name}={value!r}: expected a finite positive number")
    if value <= 0:
        raise ValueError(f"{name}={value!r}: expected a positive number")
    if value < local:
        raise ValueError(
            f"{name}={value!r} is smaller than this batch's own count {local:g}; "
            "a global count covers every minibatch, so it cannot be smaller"
        )
    return float(value)


def reduce_loss(
    loss_T: Tensor,
    tokens: PackedTokens,
    reduction: Reduction,
    *,
    num_tokens: float | None = None,
    num_sequences: float | None = None,
    norm_constant: float | None = None,
) -> Tensor:
    """Reduce a per-token loss (already weighted by the mask, 0 off the loss) to a 0-d tensor."""
    loss_tokens_D = torch.zeros(tokens.num_datums, dtype=torch.long, device=loss_T.device)
    loss_tokens_D = loss_tokens_D.index_add(0, tokens.seq_T, tokens.loss_T.long())  # [D]
    if reduction == "sum":
        return loss_T.sum()
    if reduction == "token-mean":
        local = int(loss_tokens_D.sum())
        n = _positive("num_tokens", num_tokens, local) or max(local, 1)
        return loss_T.sum() / n
    if reduction == "seq-mean-token-sum-norm":
        local = int(loss_tokens_D.max())
        if norm_constant is not None:
            c = float(norm_constant)
            if not math.isfinite(c) or c <= 0:
                raise ValueError(
                    f"norm_constant={norm_constant!r}: expected a finite positive number"
                )
        else:
            c = max(local, 1)
        return loss_T.sum() / c
    seq_sum_D = torch.zeros(tokens.num_datums, dtype=loss_T.dtype, device=loss_T.device)
    seq_sum_D = seq_sum_D.index_add(0, tokens.seq_T, loss_T)  # [D]
    local_seqs = int((loss_tokens_D > 0).sum())
    g = _positive("num_sequences", num_sequences, local_seqs) or max(local_seqs, 1)
    if reduction == "seq-mean-token-sum":
        return seq_sum_D.sum() / g
    if reduction == "seq-mean-token-mean":
        return (seq_sum_D / loss_tokens_D.clamp_min(1)).sum() / g
    raise ValueError(f"reduction={reduction!r}: expected one of {', '.join(REDUCTIONS)}")
