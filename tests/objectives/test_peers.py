"""Expected values published by peer test suites (see ../shared/specs/peers.md §2), re-derived
here; each test names the peer file and shows why our convention gives the same number."""

from __future__ import annotations

import math

import torch

import losslab.objectives as O


def test_torchtune_dpo_values() -> None:
    # pytorch/torchtune tests/torchtune/rlhf/loss/test_dpo_loss.py: beta 0.1, logits
    # (pc - pr) - (rc - rr) = [0, 10, 20] -> losses [0.69315, 0.31326, 0.12693] = -logσ(β·logit).
    # Our z = β[(pc - rc) - (pr - rr)] is the same margin; pass it via pc with pr = rc = rr = 0.
    # dpo_loss averages, so call it once per element.
    for margin, want in [(0.0, 0.69315), (10.0, 0.31326), (20.0, 0.12693)]:
        pc = torch.tensor([margin])
        zero = torch.zeros(1)
        loss = O.dpo_loss(pc, zero, zero, zero, 0.1, 0.0)
        assert abs(loss.item() - want) < 5e-6
        assert abs(want - math.log1p(math.exp(-0.1 * margin))) < 5e-6  # the closed form
    # batch of three: the mean of the three published values
    loss = O.dpo_loss(torch.tensor([0.0, 10, 20]), *[torch.zeros(3)] * 3, 0.1, 0.0)
    assert abs(loss.item() - (0.69315 + 0.31326 + 0.12693) / 3) < 1e-5


def test_skyrl_gae_gamma_lambda_one() -> None:
    # NovaSky-AI/SkyRL tests/backends/skyrl_train/utils/test_ppo_utils.py: γ = λ = 1,
    # rewards [1, 2, 3], values [.5, 1, 1.5] -> returns [6, 5, 3]. With γ = λ = 1 GAE telescopes:
    # A_t = Σ_{k>=t} r_k + V_T - V_t, so returns = A + V = [6, 5, 3] + next_value; SkyRL has no
    # bootstrap, i.e. next_value = 0. One trajectory is our 1-D (T,) layout directly.
    rewards = torch.tensor([1.0, 2.0, 3.0])
    values = torch.tensor([0.5, 1.0, 1.5])
    returns = O.lambda_returns(rewards, values, torch.tensor(0.0), 1.0, 1.0)
    torch.testing.assert_close(returns, torch.tensor([6.0, 5.0, 3.0]))
    adv = O.gae(rewards, values, torch.tensor(0.0), 1.0, 1.0)
    torch.testing.assert_close(adv, torch.tensor([5.5, 4.0, 1.5]))  # returns - values


def test_torchtune_gae_example_time_axis() -> None:
    # pytorch/torchtune tests/torchtune/rlhf/test_rewards.py: values = rewards = [0, 0, 0, 1],
    # γ 0.9, λ 0.95 -> returns [γ³λ², γ²λ, γ, 1] = [0.65792, 0.7695, 0.9, 1].
    # torchtune's layout is (B, T), time LAST, bootstrap 0; ours is time on DIM 0, so one
    # trajectory is the same 1-D vector and a batch must be transposed.
    # Derivation (next_value 0): δ = [0, 0, γ, 0] (δ_2 = 0 + γ·1 - 0, δ_3 = 1 + 0 - 1);
    # A = [γ³λ², γ²λ, γ, 0]; returns = A + V = [γ³λ², γ²λ, γ, 1].
    g, lam = 0.9, 0.95
    want = torch.tensor([g**3 * lam**2, g**2 * lam, g, 1.0])
    torch.testing.assert_close(want, torch.tensor([0.65792, 0.7695, 0.9, 1.0]), atol=5e-6, rtol=0)
    x = torch.tensor([0.0, 0.0, 0.0, 1.0])
    torch.testing.assert_close(O.lambda_returns(x, x, torch.tensor(0.0), g, lam), want)
    # torchtune's (B=2, T=4) batch, transposed to our (T, B)
    batch_BT = torch.stack([x, x])
    out_TB = O.lambda_returns(batch_BT.T, batch_BT.T, torch.zeros(2), g, lam)
    torch.testing.assert_close(out_TB.T, torch.stack([want, want]))


def test_skyrl_grpo_no_std() -> None:
    # SkyRL test_ppo_utils.py: rewards (sums) [6, 3, 9, 12], groups [0, 0, 1, 1], no std
    # -> [1.5, -1.5, -1.5, 1.5]. Groups are contiguous blocks of 2: means 4.5 and 10.5.
    r = torch.tensor([6.0, 3.0, 9.0, 12.0])
    want = torch.tensor([1.5, -1.5, -1.5, 1.5])
    torch.testing.assert_close(O.grpo_advantages(r, 2, False), want)
    torch.testing.assert_close(O.group_mean_baseline(r, 2), want)


def test_verl_masked_mean_and_nan() -> None:
    # verl tests/utils/test_torch_functional.py: masked_mean([1,2,3,4], [1,0,0,1]) = 2.5;
    # a NaN at a masked slot is ignored; a NaN at a kept slot propagates.
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    m = torch.tensor([1.0, 0.0, 0.0, 1.0])
    assert O.masked_mean(x, m).item() == 2.5  # (1 + 4) / 2
    x_nan = torch.tensor([1.0, float("nan"), 3.0, 4.0])
    assert O.masked_mean(x_nan, m).item() == 2.5
    assert torch.isnan(O.masked_mean(x_nan, torch.ones(4)))


def test_skyrl_dual_clip_case_shows_no_dual_clip() -> None:
    # SkyRL tests/train/algorithms/test_losses.py dual-clip case: A [1, -1, -4], old [-1, -1, -3],
    # new [-1.69315, -1, -0.69741], ε 0.2, c 3 -> per-token [-0.5, 1, 12]. Ratios are
    # exp(new - old) = [0.5, 1, 10]. We have NO dual clip, so token 3 is max(-A·r, -A·1.2)
    # = max(40, 4.8) = 40 instead of SkyRL's min(40, -A·c = 12):
    # per-token [-0.5, 1, 40], token-mean 40.5 / 3 = 13.5.
    adv = torch.tensor([1.0, -1.0, -4.0])
    old = torch.tensor([-1.0, -1.0, -3.0])
    new = torch.tensor([-1.69315, -1.0, -0.69741])
    loss = O.clipped_pg_loss(new, old, adv, torch.ones(3), 0.2, 0.2)
    assert abs(loss.item() - 13.5) < 1e-3  # 1e-3: the published logps are rounded to 5 decimals
