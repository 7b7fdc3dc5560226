"""The DPPO convention knobs, each checked on tokens whose gradient is derived by hand.

One datum of four loss tokens; sampler log-probs l_s, current l, advantage A:
  t0: l_s = -25, l = -3   (log r = +22: past every guard)
  t1: l_s = -3,  l = -25  (log r = -22)
  t2: l_s = -8,  l = -5   (log r = +3, r = e^3 = 20.1 > c = 10)
  t3: l_s = -1,  l = -1.1 (log r = -0.1, p moves by -0.0351: inside the 0.15 trust region)
With A = -1 (A < 0 drops a token only if p fell by more than 0.15: none here).
"""

from __future__ import annotations

import math

import pytest
import torch

from losslab.losses import TokenData, get_loss

L_S = [-25.0, -3.0, -8.0, -1.0]
L = [-3.0, -25.0, -5.0, -1.1]


def _grad(old=None, adv=-1.0, **params):
    lp = torch.tensor(L, dtype=torch.float64, requires_grad=True)
    data = TokenData(
        logprobs_D=[lp],
        sampler_logprobs_D=[torch.tensor(L_S, dtype=torch.float64)],
        advantages_D=[torch.full((4,), adv, dtype=torch.float64)],
        mask_D=[torch.ones(4, dtype=torch.float64)],
        old_logprobs_D=None if old is None else [torch.tensor(old, dtype=torch.float64)],
    )
    out = get_loss("dppo_binary_tv", **params)(data)
    (g,) = torch.autograd.grad(out.loss, lp)
    return g, out


@pytest.mark.parametrize(
    ("guard", "t0", "t1"),
    [
        ("upper", math.exp(20), math.exp(-22)),  # Stable-RL: exp(min(d, 20)), straight through
        ("both", math.exp(20), math.exp(-20)),  # verl: d clamped to [-20, 20]
        ("zero_grad", 0.0, 0.0),  # SkyRL: torch.clamp inside exp, no gradient past 20
        ("none", math.exp(22), math.exp(-22)),  # Spindle / prime-rl
    ],
)
def test_log_ratio_guards(guard: str, t0: float, t1: float) -> None:
    g, _ = _grad(clip_ratio_c=math.inf, log_ratio_guard=guard)
    # d loss / d l = -A * r' with A = -1: +r'
    assert g[0].item() == pytest.approx(t0, rel=1e-12)
    assert g[1].item() == pytest.approx(t1, rel=1e-9, abs=1e-300)
    assert g[2].item() == pytest.approx(math.exp(3.0), rel=1e-12)  # no cap: r


def test_cap_and_weight_anchor() -> None:
    g, _ = _grad(clip_ratio_c=10.0)
    assert g[2].item() == pytest.approx(10.0)  # -A * min(r, c)
    old = [-25.0, -3.0, -5.0, -1.0]  # old = current at t2: r_old = 1
    g_old, _ = _grad(old=old, clip_ratio_c=10.0, weight_anchor="recomputed")
    assert g_old[2].item() == pytest.approx(1.0)  # verl non-bypass: weight against old


def test_kl_tau_adds_two_tau_log_r_on_every_loss_token() -> None:
    g0, _ = _grad(clip_ratio_c=math.inf, log_ratio_guard="none")
    g1, _ = _grad(clip_ratio_c=math.inf, log_ratio_guard="none", kl_tau=1e-3)
    log_r = torch.tensor(L, dtype=torch.float64) - torch.tensor(L_S, dtype=torch.float64)
    # atol: t0 sits on a gradient of e^22 = 3.6e9, whose float64 spacing is 4.8e-7
    assert torch.allclose(g1 - g0, 2e-3 * log_r, rtol=1e-6, atol=1e-5)


def test_mask_fraction_without_zero_advantage_tokens() -> None:
    # A = 0 on both tokens; t1's p falls from e^-1 = 0.368 to e^-3 = 0.050 (0.318 > 0.15)
    lp = torch.tensor([-1.0, -3.0], dtype=torch.float64, requires_grad=True)
    data = TokenData(
        logprobs_D=[lp],
        sampler_logprobs_D=[torch.tensor([-1.0, -1.0], dtype=torch.float64)],
        advantages_D=[torch.tensor([0.0, 0.0], dtype=torch.float64)],
        mask_D=[torch.ones(2, dtype=torch.float64)],
    )
    out = get_loss("dppo_binary_tv")(data)
    assert out.metrics["dppo/mask_fraction"] == 0.5  # t1 takes the A <= 0 branch
    assert out.metrics["dppo/mask_fraction_nonzero_adv"] == 0.0  # no A != 0 token at all
