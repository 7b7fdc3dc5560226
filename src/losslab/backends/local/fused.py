"""Fused LoRA projections and gated MLPs for the local backend's training passes.

PEFT runs a LoRA projection as five autograd nodes, `base(x) + lora_B(lora_A(dropout(x))) *
scale`: each writes a full (tokens x out) tensor that the next one reads again (the scale, the
add). `_LoraLinear` computes `y = x W^T + b`, then accumulates `scale * (x A^T) B^T` into `y` in
place (one `addmm`), and its backward forms `dx`, `dA`, `dB` directly, so each projection costs
its two GEMMs plus two rank-r GEMMs each way.

A gated MLP, `down(act(gate(x)) * up(x))` (Llama, Qwen2/3, Qwen3.5, Mistral, Gemma3...), keeps
four (tokens x intermediate) tensors alive for the backward under autograd: `gate(x)`, `up(x)`,
`silu(gate(x))` and the product. `_GatedDown` fuses SiLU, the product and the down projection
(with its LoRA), saves only `gate(x)` and `up(x)` and recomputes the product in the backward:
the same gradient, half the MLP's activation memory (on SmolLM2-135M ~0.37 of the ~1.3 MB
each training token keeps), for a few elementwise passes in the backward.

Used only on the training client's own model, under its lock, for the length of one pass
(`fused_training_modules`); sampling snapshots use `sampling.merged_lora_linears` instead.
Layers of any other kind (DoRA, LoRA dropout, several adapters, adapters in another dtype
than the base, trainable base weights) keep PEFT's forward.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers.activations import ACT2FN


def _plain_lora_adapter(m: torch.nn.Module) -> str | None:
    """The one active adapter of a plain LoRA Linear (no DoRA, no LoRA bias, no fan-in-fan-out,
    not merged); None for any other module or kind of LoRA layer."""
    from peft.tuners.lora import Linear as LoraLinear

    if type(m) is not LoraLinear or m.merged or getattr(m, "fan_in_fan_out", False):
        return None
    adapters = list(m.active_adapters)
    if len(adapters) != 1 or adapters[0] not in m.lora_A:
        return None
    name = adapters[0]
    if m.use_dora.get(name, False) or m.lora_bias.get(name, False):
        return None
    return name


def plain_lora_layers(lm: torch.nn.Module) -> list[tuple[str, Any]] | None:
    """`lm`'s LoRA Linears when every LoRA layer is a plain single-adapter Linear
    (`_plain_lora_adapter`); None otherwise (fused MoE expert parameters...)."""
    from peft.tuners.lora import LoraLayer

    lora = [(n, m) for n, m in lm.named_modules() if isinstance(m, LoraLayer)]
    if any(_plain_lora_adapter(m) is None for _, m in lora):
        return None
    return lora or None


@dataclass(frozen=True)
class LinearParts:
    """A projection `x W^T + b + scale * (x A^T) B^T`; `lora_a`/`lora_b` None for a plain one."""

    weight: Tensor  # (O, I), frozen
    bias: Tensor | None  # (O,)
    lora_a: Tensor | None  # (R, I)
    lora_b: Tensor | None  # (O, R)
    scale: float

    def args(self) -> tuple[Any, ...]:
        return self.weight, self.bias, self.lora_a, self.lora_b, self.scale


def linear_parts(m: torch.nn.Module) -> LinearParts | None:
    """The parts of a frozen `nn.Linear` or a plain LoRA Linear around one; None when the module
    must keep its own forward (LoRA dropout, disabled adapters, mixed dtypes, trainable base)."""
    if type(m) is torch.nn.Linear:
        if m.weight.requires_grad or (m.bias is not None and m.bias.requires_grad):
            return None
        return LinearParts(m.weight, m.bias, None, None, 0.0)
    name = _plain_lora_adapter(m)
    if name is None or m.disable_adapters:
        return None
    base = m.base_layer
    if (
        type(base) is not torch.nn.Linear
        or not isinstance(m.lora_dropout[name], torch.nn.Identity)
        or base.weight.requires_grad
        or (base.bias is not None and base.bias.requires_grad)
    ):
        return None
    a, b = m.lora_A[name].weight, m.lora_B[name].weight
    if not (a.dtype == b.dtype == base.weight.dtype):
        return None
    return LinearParts(base.weight, base.bias, a, b, float(m.scaling[name]))


def _project(
    x_M_I: Tensor, weight: Tensor, bias: Tensor | None, lora_a: Tensor | None, lora_b, scale
) -> tuple[Tensor, Tensor | None]:
    """`(x W^T + b + scale (x A^T) B^T, x A^T)`: the LoRA term accumulated into the output."""
    y_M_O = F.linear(x_M_I, weight, bias)
    if lora_a is None:
        return y_M_O, None
    xa_M_R = _rank_r_product(lora_a, x_M_I.T).T
    return y_M_O.addmm_(xa_M_R, lora_b.T, alpha=scale), xa_M_R


def _rank_r_product(left_R_K: Tensor, right_K_N: Tensor) -> Tensor:
    """`left @ right` for a rank-r `left` (R, K): each LoRA product whose output has r columns
    is formed as the transpose of this one, its (R, N) form. MKL's sgemm runs an (N, K) x (K, R)
    product with R = 8 at 15-40 GFLOP/s and the same product as (R, K) x (K, N) 3-4x faster
    (2 threads, N = 1099 tokens, K = 576-1536: `dB` 1.60 -> 0.38 ms, `dy B` 1.00 -> 0.35 ms),
    so the rank-r factors of the backward come out as transposed views."""
    return left_R_K @ right_K_N


def _project_backward(
    ctx, gy_M_O: Tensor, x_M_I: Tensor | None, xa_M_R: Tensor | None, need_x: bool, first: int
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """`(dL/dx, dL/dA, dL/dB)` of `_project`; `first` is the index of `weight` among the
    Function's inputs (the LoRA factors follow at +2, +3)."""
    weight, lora_a, lora_b = ctx.saved_tensors[-3:]
    scale = ctx.scale
    need_a, need_b = ctx.needs_input_grad[first + 2], ctx.needs_input_grad[first + 3]
    grad_x = grad_a = grad_b = g_xa_M_R = None
    if lora_a is not None:
        g_xa_M_R = _rank_r_product(lora_b.T, gy_M_O.T).T.mul_(scale)
        if need_b:
            grad_b = _rank_r_product(xa_M_R.T, gy_M_O).T.mul_(scale)
        if need_a:
            grad_a = g_xa_M_R.T @ x_M_I
    if need_x:
        grad_x = gy_M_O @ weight
        if g_xa_M_R is not None:
            grad_x.addmm_(g_xa_M_R, lora_a)
    return grad_x, grad_a, grad_b


class _LoraLinear(torch.autograd.Function):
    """`y = x W^T + b + scale * (x A^T) B^T` with the gradients of PEFT's LoRA Linear."""

    @staticmethod
    def forward(ctx, x, weight, bias, lora_a, lora_b, scale):  # type: ignore[override]
        x_M_I = x.reshape(-1, x.shape[-1])
        y_M_O, xa_M_R = _project(x_M_I, weight, bias, lora_a, lora_b, scale)
        ctx.scale, ctx.x_shape = scale, x.shape
        keep_x = x_M_I if ctx.needs_input_grad[3] else None
        ctx.save_for_backward(keep_x, xa_M_R, weight, lora_a, lora_b)
        return y_M_O.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, gy):  # type: ignore[override]
        x_M_I, xa_M_R = ctx.saved_tensors[:2]
        gy_M_O = gy.reshape(-1, gy.shape[-1])
        grad_x, grad_a, grad_b = _project_backward(
            ctx, gy_M_O, x_M_I, xa_M_R, ctx.needs_input_grad[0], first=1
        )
        if grad_x is not None:
            grad_x = grad_x.reshape(ctx.x_shape)
        return grad_x, None, None, grad_a, grad_b, None


class _GatedDown(torch.autograd.Function):
    """`down(silu(g) * u)` with `down` a (LoRA) projection; saves `g`, `u` (not the product)."""

    @staticmethod
    def forward(ctx, g, u, weight, bias, lora_a, lora_b, scale):  # type: ignore[override]
        h_M_F = (F.silu(g) * u).reshape(-1, g.shape[-1])
        y_M_O, ha_M_R = _project(h_M_F, weight, bias, lora_a, lora_b, scale)
        ctx.scale, ctx.shape = scale, g.shape
        ctx.save_for_backward(g, u, ha_M_R, weight, lora_a, lora_b)
        return y_M_O.reshape(*g.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, gy):  # type: ignore[override]
        g, u, ha_M_R = ctx.saved_tensors[:3]
        g_M_F, u_M_F = g.reshape(-1, g.shape[-1]), u.reshape(-1, u.shape[-1])
        silu_M_F = F.silu(g_M_F)
        h_M_F = silu_M_F * u_M_F if ctx.needs_input_grad[4] else None
        gy_M_O = gy.reshape(-1, gy.shape[-1])
        grad_h, grad_a, grad_b = _project_backward(ctx, gy_M_O, h_M_F, ha_M_R, True, first=2)
        grad_u = (grad_h * silu_M_F).reshape(ctx.shape)
        grad_g = torch.ops.aten.silu_backward(grad_h.mul_(u_M_F), g_M_F).reshape(ctx.shape)
        return grad_g, grad_u, None, None, grad_a, grad_b, None


def lora_linear(x: Tensor, parts: LinearParts) -> Tensor:
    return _LoraLinear.apply(x, *parts.args())


class FusedLinear(torch.nn.Module):
    """Stands in for a (LoRA) Linear for one pass; the parameters are the original's."""

    def __init__(self, parts: LinearParts) -> None:
        super().__init__()
        self.parts = parts

    def forward(self, x: Tensor) -> Tensor:
        return lora_linear(x, self.parts)


def _gated_mlp_reference(self, x):
    down_proj = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
    return down_proj


def _runs(m: torch.nn.Module, reference: Any) -> bool:
    """True when `type(m).forward` is `reference`'s code: the same bytecode and names."""
    code = getattr(getattr(type(m), "forward", None), "__code__", None)
    ref = reference.__code__
    return code is not None and code.co_code == ref.co_code and code.co_names == ref.co_names


def _is_silu_gated_mlp(m: torch.nn.Module) -> bool:
    """True when `m.forward` is exactly transformers' `down(act(gate(x)) * up(x))` (same
    bytecode and attribute names) and `act` is SiLU."""
    from transformers.activations import SiLUActivation

    return _runs(m, _gated_mlp_reference) and type(getattr(m, "act_fn", None)) in (
        SiLUActivation,
        torch.nn.SiLU,
    )


class FusedGatedMLP(torch.nn.Module):
    """`down(silu(gate(x)) * up(x))` through `_GatedDown`, for one pass."""

    def __init__(self, gate: LinearParts, up: LinearParts, down: LinearParts) -> None:
        super().__init__()
        self.gate, self.up, self.down = gate, up, down

    def forward(self, x: Tensor) -> Tensor:
        g = lora_linear(x, self.gate)
        u = lora_linear(x, self.up)
        return _GatedDown.apply(g, u, *self.down.args())


def _gated_rmsnorm_reference(self, hidden_states, gate):
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    hidden_states = self.weight * hidden_states.to(input_dtype)
    hidden_states = hidden_states * ACT2FN[self.activation](gate.to(torch.float32))
    return hidden_states.to(input_dtype)


def _is_gated_rmsnorm(m: torch.nn.Module) -> bool:
    """True for the Gated-DeltaNet output norm of transformers' hybrids (Qwen3.5, Qwen3.5-MoE,
    Qwen3-Next: `w * rmsnorm(x) * silu(z)`, the same bytecode) with a frozen weight."""
    weight = getattr(m, "weight", None)
    return (
        _runs(m, _gated_rmsnorm_reference)
        and getattr(m, "activation", None) == "silu"
        and isinstance(weight, Tensor)
        and not weight.requires_grad
    )


class _GatedRMSNorm(torch.autograd.Function):
    """`w * (x * rsqrt(mean(x^2) + eps)) * silu(z)` over the last dim, with the reference's
    operations in its order (the same float32 values); saves `x`, `z` and the per-row rsqrt,
    not the normalised, weighted and gated intermediates autograd keeps (two full-size
    tensors fewer), and recomputes those in the backward. `w` is frozen."""

    @staticmethod
    def forward(ctx, x, z, weight, eps):  # type: ignore[override]
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, z, rstd, weight)
        return (weight * (x * rstd)) * F.silu(z)

    @staticmethod
    def backward(ctx, gy):  # type: ignore[override]
        x, z, rstd, weight = ctx.saved_tensors
        normed = x * rstd
        grad_z = torch.ops.aten.silu_backward(gy * (weight * normed), z)
        grad_normed = gy * F.silu(z) * weight
        # d/dx of x * rstd(x): rstd * (g - normed * mean(g * normed))
        mean_gn = (grad_normed * normed).mean(-1, keepdim=True)
        grad_x = rstd * (grad_normed - normed * mean_gn)
        return grad_x, grad_z, None, None


class FusedGatedRMSNorm(torch.nn.Module):
    """Stands in for a `_is_gated_rmsnorm` module for one pass: float32 inputs run
    `_GatedRMSNorm`, any other dtype the module's own forward."""

    def __init__(self, norm: torch.nn.Module) -> None:
        super().__init__()
        self.norm = norm

    def forward(self, hidden_states: Tensor, gate: Tensor) -> Tensor:
        if hidden_states.dtype != torch.float32 or gate.dtype != torch.float32:
            return self.norm(hidden_states, gate)
        norm = self.norm
        return _GatedRMSNorm.apply(hidden_states, gate, norm.weight, norm.variance_epsilon)


def _replacements(lm: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """(module name, stand-in) for every SiLU gated MLP, every Gated-DeltaNet output norm and
    every other LoRA Linear of `lm`."""
    from peft.tuners.lora import Linear as LoraLinear

    out: list[tuple[str, torch.nn.Module]] = [
        (name, FusedGatedRMSNorm(m)) for name, m in lm.named_modules() if _is_gated_rmsnorm(m)
    ]
    inside_mlp: set[str] = set()
    for name, m in lm.named_modules():
        if not _is_silu_gated_mlp(m):
            continue
        parts = [linear_parts(getattr(m, p)) for p in ("gate_proj", "up_proj", "down_proj")]
        if all(p is not None for p in parts):
            out.append((name, FusedGatedMLP(*parts)))  # type: ignore[arg-type]
            inside_mlp.add(name + ".")
    for name, m in lm.named_modules():
        if type(m) is not LoraLinear or any(name.startswith(p) for p in inside_mlp):
            continue
        parts = linear_parts(m)
        if parts is not None and parts.lora_a is not None:
            out.append((name, FusedLinear(parts)))
    return out


@contextmanager
def swapped_modules(
    lm: torch.nn.Module, replacements: list[tuple[str, torch.nn.Module]]
) -> Iterator[int]:
    """Inside the block each named submodule of `lm` is the given stand-in; the originals are
    put back on exit, also after an error. Yields how many were swapped."""
    swapped: list[tuple[torch.nn.Module, str, torch.nn.Module]] = []
    try:
        for name, stand_in in replacements:
            parent_name, _, child = name.rpartition(".")
            parent = lm.get_submodule(parent_name) if parent_name else lm
            swapped.append((parent, child, getattr(parent, child)))
            setattr(parent, child, stand_in)
        yield len(swapped)
    finally:
        for parent, child, original in reversed(swapped):
            setattr(parent, child, original)


def fused_training_modules(lm: torch.nn.Module) -> AbstractContextManager[int]:
    """Inside the block, `lm`'s SiLU gated MLPs, Gated-DeltaNet output norms and plain LoRA
    Linears run fused (`FusedGatedMLP`, `FusedGatedRMSNorm`, `FusedLinear`, sharing the
    original parameters, so gradients land in the LoRA weights as before); the modules are put
    back on exit. Yields how many were swapped.
    Values and gradients equal PEFT's to float round-off (tests/backends/test_fused.py)."""
    return swapped_modules(lm, _replacements(lm))
