"""Ragged token data in the Tinker convention, its validation, and the packed form losses use.

A batch is a list of datums. Datum d holds 1-D tensors of length T_d: the current log-probs of
its target tokens (the tensor being differentiated), the sampler (rollout) log-probs, per-token
advantages, and the loss mask (Tinker "weights"). Validation happens once, in `pack`, so every
loss sees clean inputs: values at masked positions are replaced by 0 with `torch.where` (never
multiplied by the mask), so NaN or inf there cannot leak into a loss value or gradient.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:  # tinker is only needed to build TokenData from real Tinker datums
    import tinker


@dataclass(frozen=True)
class TokenData:
    """One entry per datum; each a 1-D tensor of length T_d (ragged across datums)."""

    logprobs_D: list[Tensor]
    """Current log-probs of the target tokens (requires grad); the tensor losses differentiate."""
    sampler_logprobs_D: list[Tensor]
    """Rollout (sampler) log-probs, p_old in the Tinker loop; the importance ratio's denominator."""
    advantages_D: list[Tensor]
    """Per-token advantages (0 on prompt tokens)."""
    mask_D: list[Tensor]
    """Loss mask (Tinker "weights"): 1 on action tokens, 0 elsewhere; non-negative weights scale."""
    old_logprobs_D: list[Tensor] | None = None
    """Recomputed old-policy log-probs; only read by DPPO with anchor="recomputed"."""

    def __len__(self) -> int:
        return len(self.logprobs_D)

    @classmethod
    def from_datums(
        cls,
        data: list[tinker.Datum],
        logprobs_list: list[Tensor],
        *,
        require_policy_inputs: bool = True,
    ) -> TokenData:
        """Build TokenData from Tinker datums and the per-datum log-probs of `forward_backward_custom`.

        Reads `loss_fn_inputs` keys "logprobs" (sampler log-probs), "advantages", optional
        "old_logprobs", and the loss mask from "mask", else "weights", else
        `advantages != 0 | sampler != 0` (Spindle's default for RL losses).

        Args:
            data: the datums passed to `forward_backward_custom`.
            logprobs_list: one 1-D tensor per datum, aligned with its `target_tokens`.
            require_policy_inputs: when False (cross-entropy), a missing "logprobs" or
                "advantages" key is read as zeros instead of raising.
        """
        if len(data) != len(logprobs_list):
            raise ValueError(
                f"got {len(data)} datums but {len(logprobs_list)} logprob tensors; "
                "expected one logprob tensor per datum"
            )
        sampler_D, advantages_D, mask_D, old_D = [], [], [], []
        for d, (datum, logprobs_T) in enumerate(zip(data, logprobs_list, strict=True)):
            inputs = {k: v.to_torch() for k, v in datum.loss_fn_inputs.items()}
            if not isinstance(logprobs_T, Tensor):
                raise ValueError(
                    f"logprobs_list[{d}] is {type(logprobs_T).__name__}, expected a Tensor"
                )
            zeros_T = torch.zeros(logprobs_T.shape, dtype=torch.float32)
            for key in ("logprobs", "advantages"):
                if key not in inputs and require_policy_inputs:
                    raise ValueError(
                        f"datum {d}: loss_fn_inputs has no {key!r} (keys: {sorted(inputs)}); "
                        "policy losses need sampler 'logprobs' and 'advantages'"
                    )
            sampler_T = inputs.get("logprobs", zeros_T)
            advantages_T = inputs.get("advantages", zeros_T)
            if "mask" in inputs:
                mask_T = inputs["mask"]
            elif "weights" in inputs:
                mask_T = inputs["weights"]
            else:
                mask_T = ((advantages_T != 0) | (sampler_T != 0)).float()
            sampler_D.append(sampler_T)
            advantages_D.append(advantages_T)
            mask_D.append(mask_T)
            old_D.append(inputs.get("old_logprobs"))
        has_old = [o is not None for o in old_D]
        if any(has_old) and not all(has_old):
            missing = [d for d, h in enumerate(has_old) if not h]
            raise ValueError(f"'old_logprobs' is present in some datums but missing in {missing}")
        return cls(
            logprobs_D=list(logprobs_list),
            sampler_logprobs_D=sampler_D,
            advantages_D=advantages_D,
            mask_D=mask_D,
            old_logprobs_D=old_D if all(has_old) and old_D else None,  # type: ignore[arg-type]
        )


@dataclass(frozen=True)
class PackedTokens:
    """The batch concatenated over datums (T = sum of T_d), validated and cleaned.

    At positions with mask 0 every input is 0 (set with `torch.where`), so per-token losses
    there are finite; `logprobs_T` keeps its graph to each datum's tensor (gradient 0 there).
    """

    logprobs_T: Tensor  # [T] current log-probs, differentiable
    sampler_logprobs_T: Tensor  # [T]
    advantages_T: Tensor  # [T]
    mask_T: Tensor  # [T] non-negative weights, 0 off the loss
    old_logprobs_T: Tensor | None  # [T] or None
    seq_T: Tensor  # [T] int64 datum index of each token
    lengths_D: list[int]

    @property
    def loss_T(self) -> Tensor:
        """Bool [T]: the token is in the loss (mask > 0)."""
        return self.mask_T > 0

    @property
    def num_datums(self) -> int:
        return len(self.lengths_D)


_FIELDS = ("logprobs_D", "sampler_logprobs_D", "advantages_D", "mask_D", "old_logprobs_D")


def _locate(bad_T: Tensor, lengths_D: list[int]) -> tuple[int, int, int]:
    """(datum, position, count) of the first True in a flat [T] mask."""
    i = int(bad_T.nonzero()[0, 0])
    d, start = 0, 0
    while start + lengths_D[d] <= i:
        start += lengths_D[d]
        d += 1
    return d, i - start, int(bad_T.sum())


def _check_structure(batch: TokenData) -> torch.dtype:
    """Types, 1-D shapes, equal lengths per datum and float dtypes; returns the batch dtype."""
    n = len(batch.logprobs_D)
    if n == 0:
        raise ValueError("TokenData has no datums; expected at least one")
    for field in _FIELDS[1:]:
        value = getattr(batch, field)
        if value is not None and len(value) != n:
            raise ValueError(f"{field} has {len(value)} entries but logprobs_D has {n}")
    dtype = None
    for d in range(n):
        tensors = {f: getattr(batch, f)[d] for f in _FIELDS if getattr(batch, f) is not None}
        for field, x in tensors.items():
            if not isinstance(x, Tensor):
                raise ValueError(f"{field}[{d}] is {type(x).__name__}, expected a torch.Tensor")
            if x.dim() != 1:
                raise ValueError(
                    f"{field}[{d}] has shape {tuple(x.shape)}, expected a 1-D tensor per datum"
                )
        lp = tensors["logprobs_D"]
        if not lp.is_floating_point():
            raise ValueError(f"logprobs_D[{d}] has dtype {lp.dtype}, expected float32 or float64")
        dtype = dtype or lp.dtype
        if lp.dtype != dtype:
            raise ValueError(
                f"logprobs_D[{d}] has dtype {lp.dtype} but logprobs_D[0] has {dtype}; "
                "expected one float dtype for the whole batch"
            )
        for field, x in tensors.items():
            if x.shape[0] != lp.shape[0]:
                raise ValueError(
                    f"datum {d}: {field} has length {x.shape[0]} but logprobs_D has "
                    f"{lp.shape[0]}; expected equal lengths"
                )
            if field != "mask_D" and not x.is_floating_point():
                raise ValueError(f"{field}[{d}] has dtype {x.dtype}, expected a float dtype")
            if field == "mask_D" and x.is_complex():
                raise ValueError(f"mask_D[{d}] has dtype {x.dtype}, expected bool, int or float")
    assert dtype is not None
    return dtype


def pack(batch: TokenData) -> PackedTokens:
    """Validate `batch` and concatenate it into one flat token axis.

    Raises ValueError naming the field, datum index and position for: datum-count or length
    mismatches, non-1-D tensors, non-floating log-probs/advantages, mixed float dtypes,
    negative or non-finite mask values, and NaN/inf at positions the mask keeps.
    """
    if not isinstance(batch, TokenData):
        raise ValueError(f"expected TokenData, got {type(batch).__name__}")
    dtype = _check_structure(batch)
    device = batch.logprobs_D[0].device
    lengths_D = [int(x.shape[0]) for x in batch.logprobs_D]
    zero = torch.zeros((), dtype=dtype, device=device)

    def flat(field: str) -> Tensor:
        return torch.cat([x.to(device=device, dtype=dtype) for x in getattr(batch, field)])

    mask_T = flat("mask_D")  # [T]
    bad_T = ~torch.isfinite(mask_T) | (mask_T < 0)
    if bool(bad_T.any()):
        d, t, _ = _locate(bad_T, lengths_D)
        raise ValueError(
            f"mask_D[{d}] has value {float(batch.mask_D[d][t])} at position {t}; "
            "expected finite non-negative weights"
        )
    keep_T = mask_T > 0
    cleaned: dict[str, Tensor] = {}
    for field in _FIELDS:
        if field == "mask_D" or getattr(batch, field) is None:
            continue
        x_T = flat(field)  # [T]; for logprobs_D the graph to every datum's tensor is kept
        bad_T = keep_T & ~torch.isfinite(x_T)
        if bool(bad_T.any()):
            d, t, count = _locate(bad_T, lengths_D)
            raise ValueError(
                f"{field}[{d}] has a non-finite value {float(x_T[bad_T.nonzero()[0, 0]])} at "
                f"position {t}, where the loss mask keeps the token (mask="
                f"{float(mask_T[bad_T.nonzero()[0, 0]])}); expected finite values on every "
                f"loss token ({count} such positions in the batch)"
            )
        x_T = torch.where(keep_T, x_T, zero)
        cleaned[field] = x_T if field == "logprobs_D" else x_T.detach()
    seq_T = torch.repeat_interleave(
        torch.arange(len(lengths_D), device=device), torch.tensor(lengths_D, device=device)
    )
    return PackedTokens(
        logprobs_T=cleaned["logprobs_D"],
        sampler_logprobs_T=cleaned["sampler_logprobs_D"],
        advantages_T=cleaned["advantages_D"],
        mask_T=torch.where(keep_T, mask_T, zero),
        old_logprobs_T=cleaned.get("old_logprobs_D"),
        seq_T=seq_T,
        lengths_D=lengths_D,
    )
