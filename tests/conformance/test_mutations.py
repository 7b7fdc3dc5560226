"""Mutation check: typical bugs injected into copies of the arms' losses fail the preflight.

The copies below restate the two arms' losses from the team notes (reference_losses.md §3-§4):
baseline GRPO/PPO, Tinker value -sum m*min(r*A, clip(r, 0.8, 1.2)*A); treatment DPPO-Binary-TV at
0.15 in Stable-RL's value convention -sum m*A*sg(min(r, c))*M*logp. The unmutated copies pass
(the control), so each failure is the bug's doing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from losslab.conformance.preflight import Implementation, run_preflight

PLAN = Path(__file__).resolve().parents[2] / "examples" / "gsm8k_dppo_vs_grpo.json"


@dataclass
class Out:
    loss: torch.Tensor
    kept_D: list[torch.Tensor]


def _cat(batch, mask_shift: int = 0) -> tuple[torch.Tensor, ...]:
    masks = [torch.roll(m, -mask_shift) if mask_shift else m for m in batch.mask_D]
    return (
        torch.cat(batch.logprobs_D),
        torch.cat(batch.sampler_logprobs_D),
        torch.cat(batch.advantages_D),
        torch.cat(masks),
    )


def _split(x: torch.Tensor, batch) -> list[torch.Tensor]:
    return list(torch.split(x, [len(t) for t in batch.logprobs_D]))


def ppo_copy(sign: float = 1.0, swap_bounds: bool = False, mask_shift: int = 0) -> Callable:
    def loss_fn(batch) -> Out:
        lp, lp_s, adv, m = _cat(batch, mask_shift)
        lo, hi = (1.2, 0.8) if swap_bounds else (0.8, 1.2)
        r = torch.exp(lp - lp_s)
        objective = torch.minimum(r * adv, torch.clamp(r, min=lo, max=hi) * adv)
        blocked = ((adv > 0) & (r > 1.2)) | ((adv < 0) & (r < 0.8))
        return Out(-sign * (objective * m).sum(), _split(~(blocked & (m > 0)), batch))

    return loss_fn


def dppo_copy(
    mean: bool = False, mask_shift: int = 0, detach_weight: bool = True, anchor: str = "sampler"
) -> Callable:
    def loss_fn(batch) -> Out:
        lp, lp_s, adv, m = _cat(batch, mask_shift)
        p = lp.detach().exp()
        p_anchor = p if anchor == "current" else lp_s.exp()
        leaving = torch.where(adv > 0, p - p_anchor > 0.15, p - p_anchor < -0.15)
        keep = (~leaving).to(lp.dtype)
        w = torch.clamp(torch.exp(torch.clamp(lp - lp_s, max=20.0)), max=10.0)
        if detach_weight:
            w = w.detach()
        loss = -(adv * w * keep * lp * m).sum()
        if mean:
            loss = loss / m.sum()
        return Out(loss, _split(~(leaving & (m > 0)), batch))

    return loss_fn


def _run(baseline: Callable, treatment: Callable) -> dict[str, bool]:
    rep = run_preflight(
        PLAN,
        implementations={
            "baseline": Implementation(baseline, label="copy"),
            "treatment": Implementation(treatment, label="copy"),
        },
        allow_rederivation=True,
    )
    return {name: chk["passed"] for name, chk in rep["paths"][0]["checks"].items()}


def test_unmutated_copies_pass() -> None:
    assert all(_run(ppo_copy(), dppo_copy()).values())


@pytest.mark.parametrize(
    ("bug", "baseline", "treatment", "must_fail"),
    [
        ("sign flip", ppo_copy(sign=-1.0), dppo_copy(), ["baseline_loss", "baseline_gradient"]),
        (
            "clip bounds swapped",
            ppo_copy(swap_bounds=True),
            dppo_copy(),
            ["baseline_loss", "baseline_gradient"],
        ),
        (
            "mean instead of sum",
            ppo_copy(),
            dppo_copy(mean=True),
            ["reference_loss", "reference_gradient"],
        ),
        (
            "mask shifted by one token",
            ppo_copy(mask_shift=1),
            dppo_copy(mask_shift=1),
            ["baseline_gradient", "reference_gradient"],
        ),
        # the value is unchanged; only the gradient check can catch it
        (
            "stop-gradient missing",
            ppo_copy(),
            dppo_copy(detach_weight=False),
            ["reference_gradient"],
        ),
        (
            "anchor switched from sampler to current",
            ppo_copy(),
            dppo_copy(anchor="current"),
            ["reference_loss", "reference_gradient"],
        ),
    ],
)
def test_injected_bug_fails_the_preflight(
    bug: str, baseline: Callable, treatment: Callable, must_fail: list[str]
) -> None:
    passed = _run(baseline, treatment)
    assert not all(passed.values()), f"{bug} was not caught"
    for name in must_fail:
        assert not passed[name], f"{bug}: {name} should fail"
