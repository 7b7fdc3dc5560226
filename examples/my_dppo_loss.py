"""DPPO-Binary-TV (Qi et al. 2026, "Rethinking the Trust Region in LLM RL", arXiv 2602.04879)
as a Tinker custom loss: the code a researcher runs through `forward_backward_custom`.

Written from the paper's method and Stable-RL's `compute_policy_loss_with_mask`
(`loss_mode='dppo_binary_tv'`) as a user would, not from losslab: it imports only torch and
reads the datums the way the Tinker cookbook does. The plan `examples/my_dppo_plan.json` names
it as its treatment arm's loss, `my_dppo_loss.py::dppo_loss(delta=0.15, cap=10)`, and losslab
checks this very function against the pinned Stable-RL source before training it.

Per loss token (weights m = 1), with p = exp(logp), p_old the sampler's probability and
r = p / p_old:

    mask M = 0 if (A > 0 and p - p_old > delta) or (A <= 0 and p - p_old < -delta), else 1
    loss = - sum_tokens A * sg(min(r, cap)) * M * m * logp

so the gradient is the masked, truncated importance-sampled policy gradient -A*min(r, cap)*M,
and the value is the one Stable-RL's function returns (its "logprob" form). The sum over tokens
is Tinker's convention for `forward_backward_custom`.
"""

from __future__ import annotations

import torch

LOG_RATIO_MAX = 20.0  # exp(20) ~ 4.9e8: Stable-RL clamps log r from above before exp


def dppo_loss(data, logprobs_list, *, delta=0.15, cap=10.0):
    total = torch.zeros(())
    masked, live = 0.0, 0.0
    for datum, logp in zip(data, logprobs_list, strict=True):
        inputs = datum.loss_fn_inputs
        logp_old = inputs["logprobs"].to_torch()
        adv = inputs["advantages"].to_torch()
        if "mask" in inputs:
            m = inputs["mask"].to_torch()
        elif "weights" in inputs:
            m = inputs["weights"].to_torch()
        else:
            m = torch.ones_like(adv)
        m = m.to(logp.dtype)
        # where m = 0 the inputs may be anything: zero them so nothing there is inf or nan
        logp_old = torch.where(m > 0, logp_old, torch.zeros_like(logp_old))
        adv = torch.where(m > 0, adv, torch.zeros_like(adv))
        logp_live = torch.where(m > 0, logp, torch.zeros_like(logp))

        with torch.no_grad():
            diff = logp_live.exp() - logp_old.exp()
            leaves = torch.where(adv > 0, diff > delta, diff < -delta)
            keep = (~leaves).to(logp.dtype)
            ratio = torch.exp(torch.clamp(logp_live - logp_old, max=LOG_RATIO_MAX))
            weight = torch.clamp(ratio, max=cap)
        total = total - (adv * weight * keep * m * logp_live).sum()
        nonzero = (m > 0) & (adv != 0)
        masked += float((leaves & nonzero).sum())
        live += float(nonzero.sum())
    metrics = {"dppo/mask_fraction_nonzero_adv": masked / max(live, 1.0)}
    return total, metrics
