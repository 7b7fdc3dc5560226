"""Run a `losslab.losses` loss on a fixture: value, gradient w.r.t. current log-probs, keep mask.

One place for "ours" in the preflight, `golden check`, `crosscheck` and the disagreement
classifier, so all four evaluate our losses the same way.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from losslab.conformance.fixtures import Fixture, token_tensors


def run_ours(
    fn: Any, fixture: Fixture, dtype: torch.dtype = torch.float32
) -> tuple[float, list[np.ndarray], list[np.ndarray]]:
    """(loss value, per-datum gradients, per-datum keep masks) of loss `fn` on `fixture`."""
    from losslab.losses import TokenData

    data = TokenData(**token_tensors(fixture, dtype))
    out = fn(data)
    grads = torch.autograd.grad(out.loss, data.logprobs_D, allow_unused=True)
    grad_D = [
        np.zeros(len(x), np.float32) if g is None else g.detach().numpy()
        for g, x in zip(grads, data.logprobs_D, strict=True)
    ]
    kept = [k.detach().numpy().astype(bool) for k in out.kept_D]
    return float(out.loss.detach()), grad_D, kept


def config_losses(config: Any) -> tuple[Any, Any]:
    """(loss as trained, the same loss in the reference's value convention) of a
    `frameworks.LosslabConfig`; raises ValueError with the config's reason when it has none."""
    from losslab.losses import get_loss

    if config.loss is None:
        raise ValueError(f"no losslab configuration reproduces it: {config.reason}")
    trained = get_loss(config.loss, **config.params)
    valued = get_loss(config.loss, **{**config.params, **config.value_params})
    return trained, valued
