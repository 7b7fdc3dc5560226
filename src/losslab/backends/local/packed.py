"""Linear layers on weights packed once for oneDNN: the CPU decode step's GEMMs.

On the CPU, `F.linear` runs MKL's sgemm, which copies the weight into its blocked layout inside
every call. A decode step multiplies only as many rows as there are sequences (64 in a GRPO
batch of 8 x 8) by every weight of the model, so that per-call copy of a weight fetched from
memory costs as much as the product itself. oneDNN's linear on a weight reordered once
(`torch.ops.mkldnn._reorder_linear_weight`, then `_linear_pointwise`: the pair inductor's CPU
freezing path uses) skips it. Measured on 2 threads with the weights out of cache, as in a
decode step (2026-12-06, this VM, 64 rows): (576 -> 1536) 1.05 -> 0.61 ms, (1536 -> 576) 1.02
-> 0.71 ms, (576 -> 1152) 0.90 -> 0.47 ms, the 49,152-row unembedding 37.0 -> 18.4 ms; at 424
rows (a prefill) 4.9 -> 3.7 ms. Packing costs about one call's time per weight (the unembedding
17 ms, 136 ms the first time in a process), so the sampler packs the LoRA-merged weights and
the unembedding once per generation and frees them after it (`sampling.merged_lora_linears`):
no memory is kept past sampling, whose peak stays below the training pass's.

Values equal `F.linear`'s to float32 round-off (the two libraries block the sums differently);
no gradient is recorded, so this is for no-grad inference only. `$LOSSLAB_PACKED_LINEAR=0`
turns packing off (to measure against MKL, or to rule it out); GPUs and other dtypes never pack.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

PACKED_ENV = "LOSSLAB_PACKED_LINEAR"


def packing_available(weight: Tensor) -> bool:
    """True where a float32 CPU weight can be packed for oneDNN: torch built with it, the ops
    present, and `$LOSSLAB_PACKED_LINEAR` not "0"."""
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and os.environ.get(PACKED_ENV, "") != "0"
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


def pack(weight_O_I: Tensor) -> Tensor:
    """The (out, in) weight reordered into oneDNN's blocked layout (an opaque mkldnn tensor of
    the same size)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight_O_I.detach())


def packed_linear(x_M_I: Tensor, packed_O_I: Tensor, bias_O: Tensor | None = None) -> Tensor:
    """`x W^T + b` on a `pack`ed weight; `x` of any leading shape. Records no gradient."""
    if torch.is_grad_enabled() and x_M_I.requires_grad:
        raise RuntimeError("packed_linear records no gradient; call it under torch.no_grad()")
    return torch.ops.mkldnn._linear_pointwise(x_M_I, packed_O_I, bias_O, "none", [], "")


class PackedLinear(torch.nn.Module):
    """Stands in for a frozen `nn.Linear` (no grad) with its weight packed for oneDNN; the
    dense weight it was built from can be freed."""

    def __init__(self, weight_O_I: Tensor, bias_O: Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight_O_I.shape
        self.packed = pack(weight_O_I)
        self.bias = bias_O

    def forward(self, x: Tensor) -> Tensor:
        return packed_linear(x, self.packed, self.bias)
