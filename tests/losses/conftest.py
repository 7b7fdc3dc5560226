"""Helpers shared by the loss tests: build TokenData from plain lists."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
import torch

from losslab.losses import TokenData

Batch = tuple[list[torch.Tensor], TokenData]


def build_batch(
    logprobs: Sequence[Sequence[float]],
    sampler: Sequence[Sequence[float]],
    advantages: Sequence[Sequence[float]],
    mask: Sequence[Sequence[float]] | None = None,
    old: Sequence[Sequence[float]] | None = None,
    dtype: torch.dtype = torch.float64,
) -> Batch:
    """Leaf log-prob tensors (requires_grad) and the TokenData around them; mask defaults to 1."""
    lp_D = [torch.tensor(x, dtype=dtype, requires_grad=True) for x in logprobs]
    mask = mask if mask is not None else [[1.0] * len(x) for x in logprobs]
    return lp_D, TokenData(
        logprobs_D=lp_D,
        sampler_logprobs_D=[torch.tensor(x, dtype=dtype) for x in sampler],
        advantages_D=[torch.tensor(x, dtype=dtype) for x in advantages],
        mask_D=[torch.tensor(x, dtype=dtype) for x in mask],
        old_logprobs_D=None if old is None else [torch.tensor(x, dtype=dtype) for x in old],
    )


@pytest.fixture
def make_batch() -> Callable[..., Batch]:
    return build_batch
