"""Pairwise preference objectives: DPO (with cDPO label smoothing), IPO, Bradley-Terry.

pc/pr: policy log-probs of the chosen/rejected responses; rc/rr: reference log-probs (per
sequence, shape (B,)). Losses are means over the batch (0-d); an empty batch gives 0.0.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from losslab.objectives._checks import (
    plain_mean,
    require_broadcast,
    require_float_tensor,
    require_number,
)
from losslab.objectives.logprobs import selective_logprobs

Tensor = torch.Tensor


def _check_pair(fn: str, pc: Tensor, pr: Tensor, rc: Tensor, rr: Tensor) -> None:
    for name, t in (("pc", pc), ("pr", pr), ("rc", rc), ("rr", rr)):
        require_float_tensor(fn, name, t)
    require_broadcast(fn, ("pc", "pr", "rc", "rr"), pc, pr, rc, rr)


def dpo_loss(pc, pr, rc, rr, beta, label_smoothing):
    """DPO (Rafailov et al. 2023) with conservative label smoothing (cDPO, Mitchell 2023).

    z = β[(pc - rc) - (pr - rr)];  loss = mean[-(1-ε)·logσ(z) - ε·logσ(-z)].
    ε = 0 is plain DPO. Matches OpenRLHF DPOLoss and TRL `sigmoid` before it dropped ε.
    """
    fn = "dpo_loss"
    _check_pair(fn, pc, pr, rc, rr)
    b = require_number(fn, "beta", beta, low=0.0, low_open=True)
    eps = require_number(fn, "label_smoothing", label_smoothing, low=0.0, high=1.0)
    z = b * ((pc - rc) - (pr - rr))
    return plain_mean(-(1 - eps) * F.logsigmoid(z) - eps * F.logsigmoid(-z))


def ipo_loss(pc, pr, rc, rr, beta):
    """IPO (Azar et al. 2023): mean[((pc - rc) - (pr - rr) - 1/(2β))²].

    The log-ratios are used as given (no β on the margin, no length normalisation; current TRL
    divides by completion length first).
    """
    fn = "ipo_loss"
    _check_pair(fn, pc, pr, rc, rr)
    b = require_number(fn, "beta", beta, low=0.0, low_open=True)
    h = (pc - rc) - (pr - rr)
    return plain_mean((h - 1.0 / (2.0 * b)) ** 2)


def bradley_terry_logit(chosen_reward, rejected_reward, beta):
    """Elementwise Bradley-Terry logit β(r_chosen - r_rejected); P(chosen ≻ rejected) = σ(logit)."""
    fn = "bradley_terry_logit"
    require_float_tensor(fn, "chosen_reward", chosen_reward)
    require_float_tensor(fn, "rejected_reward", rejected_reward)
    require_broadcast(fn, ("chosen_reward", "rejected_reward"), chosen_reward, rejected_reward)
    b = require_number(fn, "beta", beta)
    return b * (chosen_reward - rejected_reward)


def dpo_sequence_loss(
    pc_logits,
    pr_logits,
    rc_logits,
    rr_logits,
    chosen_labels,
    rejected_labels,
    chosen_mask,
    rejected_mask,
    beta,
    label_smoothing,
):
    """dpo_loss on masked per-sequence log-prob SUMS (no length normalisation).

    pc = Σ_t lp(pc_logits, chosen_labels)·chosen_mask, likewise pr (rejected), rc, rr (reference);
    logits are (B, T, V), labels/masks (B, T).
    """
    pc_B = selective_logprobs(pc_logits, chosen_labels, chosen_mask)
    pr_B = selective_logprobs(pr_logits, rejected_labels, rejected_mask)
    rc_B = selective_logprobs(rc_logits, chosen_labels, chosen_mask)
    rr_B = selective_logprobs(rr_logits, rejected_labels, rejected_mask)
    return dpo_loss(pc_B, pr_B, rc_B, rr_B, beta, label_smoothing)
