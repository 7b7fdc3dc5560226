"""Reproduce every probe of the `reforacle` record whose inputs it gives.

Each test re-creates the probe's inputs from the same seeded torch.Generator calls, in the same
order, and compares with the reference output the record printed (quoted in a comment with the
probe's title). Values printed with 4 decimals are compared at atol 5e-5 (half the last printed
digit plus float32 noise); values printed in full at atol 1e-6.
Source: ../shared/seeds/objectives_reverse_engineering_record.txt.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

import losslab.objectives as O

P4 = {"atol": 5e-5, "rtol": 0.0}  # printed with 4 decimals
FULL = {"atol": 1e-6, "rtol": 1e-5}  # printed in full


def gen(seed: int) -> tuple[torch.Generator, Callable[..., torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return g, lambda *s: torch.randn(*s, generator=g)


def close(actual: torch.Tensor, expected, tol=P4) -> None:
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), **tol)


def test_probe_py_masked_mean() -> None:
    # "Run the probe example": reference masked_mean -> -0.07950486242771149, empty mask -> 0.0
    g, rn = gen(0)
    values = rn(8)
    mask = (torch.rand(8, generator=g) > 0.5).float()
    close(O.masked_mean(values, mask), -0.07950486242771149, FULL)
    assert O.masked_mean(rn(4), torch.zeros(4)).item() == 0.0


def test_entropy_and_token_logprobs() -> None:
    # "Probe entropy and token_logprobs conventions": entropy 1.5408, normalized_entropy 0.9573,
    # token_logprobs shape (2, 4) and [0, 0] = -1.3877
    g, rn = gen(1)
    logits = rn(3, 5)
    mask = (torch.rand(3, generator=g) > 0.3).float()
    close(O.entropy(logits, mask), 1.5408)
    close(O.normalized_entropy(logits, mask), 0.9573)
    logits2 = rn(2, 4, 6)
    labels = torch.randint(0, 6, (2, 4), generator=g)
    tl = O.token_logprobs(logits2, labels)
    assert tl.shape == (2, 4)
    close(tl[0, 0], -1.3877)


def test_selective_and_sequence_logprobs() -> None:
    # "Probe selective_logprobs and sequence_logprob": sel [-9.9312, -7.4454] (shape [2]);
    # length_normalize=True [-2.4828, -2.4818]
    g, rn = gen(2)
    logits = rn(2, 4, 6)
    labels = torch.randint(0, 6, (2, 4), generator=g)
    mask = (torch.rand(2, 4, generator=g) > 0.3).float()
    close(O.selective_logprobs(logits, labels, mask), [-9.9312, -7.4454])
    close(O.sequence_logprob(logits, labels, mask, False), [-9.9312, -7.4454])
    close(O.sequence_logprob(logits, labels, mask, True), [-2.4828, -2.4818])


def test_kl_estimators() -> None:
    # "Probe kl estimators": k1/k2/k3, reverse_kl (= k3) and symmetric_kl vectors
    _, rn = gen(3)
    logp, ref = rn(5), rn(5)
    close(O.kl_penalty(logp, ref, "k1"), [2.1715, -0.1627, -0.9221, 0.8215, -0.9312])
    close(O.kl_penalty(logp, ref, "k2"), [2.3578, 0.0132, 0.4252, 0.3374, 0.4336])
    k3 = [1.2855, 0.0140, 0.5925, 0.2612, 0.6064]
    close(O.kl_penalty(logp, ref, "k3"), k3)
    close(O.reverse_kl(logp, ref), k3)
    close(O.symmetric_kl(logp, ref), [3.4429, 0.0133, 0.4562, 0.3568, 0.4659])


def test_dpo_ipo_bradley_terry() -> None:
    # "Probe dpo, ipo, bradley_terry": dpo 0.6859 (beta 0.1, ls 0.05), ipo 25.4948, bt vector
    _, rn = gen(4)
    pc, pr, rc, rr = rn(6), rn(6), rn(6), rn(6)
    close(O.dpo_loss(pc, pr, rc, rr, 0.1, 0.05), 0.6859)
    close(O.ipo_loss(pc, pr, rc, rr, 0.1), 25.4948, {"atol": 5e-4, "rtol": 0.0})
    cr, rj = rn(6), rn(6)
    close(O.bradley_terry_logit(cr, rj, 0.1), [-0.1039, -0.1383, 0.1153, -0.0426, -0.0130, -0.0609])


def test_importance_ratio_clip_fraction_normalize() -> None:
    # "Probe importance_ratio, clip_fraction, normalize" (raw ratios 2.4966 1.1720 0.3044 ...)
    _, rn = gen(5)
    logp, old = rn(6), rn(6)
    close(O.importance_ratio(logp, old, 0.2), [1.2, 1.1720, 0.8, 1.2, 1.2, 1.2])
    close(O.clip_fraction(logp, old, 0.2), 5 / 6)  # printed 0.8333
    x = rn(7)
    close(O.normalize(x, 1e-8), [0.1218, -1.3931, 0.9097, 0.7211, -1.2511, 1.0517, -0.1601])


def test_whiten_variants() -> None:
    # "Probe whiten variants": the four reference vectors
    g, rn = gen(6)
    x = rn(8)
    mask = (torch.rand(8, generator=g) > 0.3).float()
    close(
        O.whiten(x, mask, False),
        [-1.5278, -0.8109, 0.5829, -0.5706, -1.1999, 0.1427, 1.1830, 0.5192],
    )
    close(
        O.masked_whiten(x, mask, False),
        [-1.5278, -0.8109, 0.5829, -0.0107, -0.0107, -0.0107, 1.1830, 0.5192],
    )
    close(
        O.whiten(x, mask, True),
        [-1.5171, -0.8002, 0.5936, -0.5598, -1.1892, 0.1534, 1.1937, 0.5300],
    )
    close(O.masked_whiten(x, mask, True), [-1.5171, -0.8002, 0.5936, 0, 0, 0, 1.1937, 0.5300])


def test_advantage_mean_std() -> None:
    # "Verify whiten var denom and advantage_mean_std": [0.4121, 0.9313]
    g, rn = gen(7)
    x = rn(8)
    mask = (torch.rand(8, generator=g) > 0.3).float()
    close(O.advantage_mean_std(x, mask), [0.4121, 0.9313])


def test_gae_lambda_discounted() -> None:
    # "Probe gae, lambda_returns, discounted_returns" (next_value 0.5, gamma 0.9, lam 0.95)
    _, rn = gen(8)
    rewards, values, nv = rn(5), rn(5), torch.tensor(0.5)
    close(O.gae(rewards, values, nv, 0.9, 0.95), [0.3282, -0.5554, 0.7814, 1.8158, -0.8212])
    close(
        O.lambda_returns(rewards, values, nv, 0.9, 0.95),
        [-0.3326, -0.6987, 0.6771, 0.2846, -0.1894],
    )
    close(O.discounted_returns(rewards, 0.9), [-0.5819, -0.9480, 0.3610, -0.1574, -0.6394])


def test_group_advantages() -> None:
    # "Probe grpo/rloo advantages, group_mean_baseline" (G = 3)
    _, rn = gen(9)
    rewards = rn(6)
    centred = [-0.5303, 1.3363, -0.8060, -0.3319, 0.6402, -0.3082]
    close(O.grpo_advantages(rewards, 3, False), centred)
    close(O.grpo_advantages(rewards, 3, True), [-0.5572, 1.4043, -0.8470, -0.7331, 1.4139, -0.6808])
    close(O.rloo_advantages(rewards, 3), [-0.7954, 2.0044, -1.2090, -0.4979, 0.9602, -0.4623])
    close(O.group_mean_baseline(rewards, 3), centred)


def test_value_huber_clipped_pg() -> None:
    # "Probe value_loss, huber, clipped_pg": 2.3118, 1.2284, -0.2012 (clip 0.2 / 0.3)
    g, rn = gen(10)
    values, old, returns = rn(6), rn(6), rn(6)
    close(O.value_loss(values, old, returns, 0.2), 2.3118)
    close(O.huber_value_loss(values, returns, 1.0), 1.2284)
    logp, old2, adv = rn(6), rn(6), rn(6)
    mask = (torch.rand(6, generator=g) > 0.3).float()
    close(O.clipped_pg_loss(logp, old2, adv, mask, 0.2, 0.3), -0.2012)


def test_cross_entropy_probe() -> None:
    # "Probe ce, smoothed_nll, ...": cross_entropy 2.2595; with labels[1] = -100: 1.3769.
    # The reference's smoothed_nll then failed on the -100 label; ours raises a ValueError.
    g, rn = gen(11)
    rn(3, 7)
    torch.randint(0, 7, (3,), generator=g)
    ce = O.cross_entropy(rn(4, 7), torch.randint(0, 7, (4,), generator=g), -100)
    close(ce, 2.2595)
    li = rn(4, 7)
    lb = torch.randint(0, 7, (4,), generator=g)
    lb[1] = -100
    close(O.cross_entropy(li, lb, -100), 1.3769)
    try:
        O.smoothed_nll(li, lb, 0.1)
    except ValueError as e:
        assert "labels must lie in [0, 7)" in str(e)
    else:
        raise AssertionError("smoothed_nll accepted label -100")


def test_smoothed_nll_and_temperature() -> None:
    # "Probe smoothed_nll formula": 1.9227 (s=0), 1.9500 (s=0.1); logprob_at_temperature at T=2
    # with labels [1, 3] -> [-2.0789, -2.0317]
    g, rn = gen(12)
    li = rn(4, 7)
    lb = torch.randint(0, 7, (4,), generator=g)
    close(O.smoothed_nll(li, lb, 0.0), 1.9227)
    close(O.smoothed_nll(li, lb, 0.1), 1.9500)
    close(O.logprob_at_temperature(rn(2, 5), torch.tensor([1, 3]), 2.0), [-2.0789, -2.0317])


def test_remaining_utilities() -> None:
    # "Probe remaining utilities": mode 3, median 2.5, masked_max 1.4103, quantile_lower -0.6628,
    # cumulative_max [1,1,3,3,5], bucketize [0,1,2,3], pad_mask, first_nonzero [2,0,-1]
    g, rn = gen(13)
    assert O.mode_label(torch.tensor([1, 2, 2, 3, 3, 3, 1])).item() == 3
    close(O.median_reward(torch.tensor([1.0, 3.0, 2.0, 4.0])), 2.5)
    v = rn(6)
    m = (torch.rand(6, generator=g) > 0.4).float()
    close(O.masked_max(v, m), 1.4103)
    close(O.quantile_lower(rn(10), 0.3), -0.6628)
    close(O.cumulative_max(torch.tensor([1.0, 3, 2, 5, 4])), [1.0, 1, 3, 3, 5])
    b = O.bucketize_reward(torch.tensor([0.1, 0.5, 0.9, 1.5]), torch.tensor([0.2, 0.6, 1.0]))
    assert b.tolist() == [0, 1, 2, 3] and b.dtype == torch.int64
    pm = O.pad_mask_from_lengths(torch.tensor([2, 3, 0]), 4)
    assert pm.dtype == torch.float32
    assert pm.tolist() == [[1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]]
    fz = O.first_nonzero_index(torch.tensor([[0.0, 0, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]]))
    assert fz.tolist() == [2, 0, -1] and fz.dtype == torch.int64


def test_top_k_top_p_and_2d() -> None:
    # "Probe top_k, top_p, 2D behaviors"
    g, rn = gen(14)
    logits = rn(2, 6)
    assert O.top_k_mask(logits, 3).tolist() == [
        [False, True, False, False, True, True],
        [True, False, True, True, False, False],
    ]
    probs = torch.softmax(rn(2, 6), -1)
    close(
        O.top_p_mask(probs, 0.7),
        [[0.1872, 0.1795, 0, 0.1531, 0.4802, 0], [1.0, 0, 0, 0, 0, 0]],
    )
    v = rn(2, 4)
    m = (torch.rand(2, 4, generator=g) > 0.4).float()
    close(O.masked_max(v, m), 1.1964)
    close(
        O.cumulative_max(rn(2, 4)),
        [[-0.7920, 0.4916, 2.0040, -0.2893], [-0.7920, 0.4916, 2.0040, -0.2893]],
    )
    assert O.first_nonzero_index(torch.tensor([0.0, 0, 1, 0])).item() == 2
    close(O.median_reward(torch.tensor([3.0, 1.0, 2.0])), 2.0)


def test_hand_made_probes() -> None:
    # "Determine cummax dim, mode tie-break, masked_max edge", "Nail cumulative_max semantics",
    # "Probe mode tie-break and masked_max negatives", "Determine bucketize right convention"
    x = torch.tensor([[1.0, 3, 2, 0], [5, 1, 4, 2]])
    assert O.cumulative_max(x).tolist() == [[1, 3, 2, 0], [1, 3, 2, 0]]
    x3 = torch.tensor([[1.0, 9], [5, 2], [3, 8]])
    assert O.cumulative_max(x3).tolist() == [[1, 9], [1, 9], [5, 9]]
    for labels, mode in [
        ([1, 1, 2, 2], 2),
        ([2, 2, 1, 1], 2),
        ([3, 3, 1, 1, 2], 3),
        ([5, 1, 1], 1),
        ([1, 1, 5, 5, 2, 2], 5),
        ([5, 4, 3, 2, 1], 5),
    ]:
        out = O.mode_label(torch.tensor(labels))
        assert out.item() == mode and out.dtype == torch.int64 and out.dim() == 0
    assert O.masked_max(torch.tensor([1.0, 2.0]), torch.tensor([0.0, 0.0])).item() == 0.0
    assert O.masked_max(torch.tensor([-1.0, -2.0, 5.0]), torch.tensor([1.0, 1, 0])).item() == -1.0
    assert O.masked_max(torch.tensor([-3.0, -2.0]), torch.tensor([1.0, 1])).item() == -2.0
    b = torch.tensor([0.0, 0.5, 1.0])
    v = torch.tensor([-0.1, 0.0, 0.3, 0.5, 0.7, 1.0, 2.0])
    assert O.bucketize_reward(v, b).tolist() == [0, 1, 1, 2, 2, 3, 3]


def test_dpo_sequence_loss_probe() -> None:
    # "Probe dpo_sequence_loss": 0.5428 (beta 0.1, label_smoothing 0)
    g, rn = gen(20)
    B, T, V = 2, 4, 5
    pcl, prl, rcl, rrl = rn(B, T, V), rn(B, T, V), rn(B, T, V), rn(B, T, V)
    cl = torch.randint(0, V, (B, T), generator=g)
    rl = torch.randint(0, V, (B, T), generator=g)
    cm = (torch.rand(B, T, generator=g) > 0.3).float()
    rm = (torch.rand(B, T, generator=g) > 0.3).float()
    close(O.dpo_sequence_loss(pcl, prl, rcl, rrl, cl, rl, cm, rm, 0.1, 0.0), 0.5428)


def test_rloo_objective_probe() -> None:
    # "Probe rloo_objective": 0.2949 (G 3, clip 0.2 / 0.3)
    g, rn = gen(21)
    B, T, V = 6, 4, 5
    logits, old = rn(B, T, V), rn(B, T, V)
    labels = torch.randint(0, V, (B, T), generator=g)
    mask = (torch.rand(B, T, generator=g) > 0.3).float()
    rewards = rn(B)
    close(O.rloo_objective(logits, old, labels, mask, rewards, 3, 0.2, 0.3), 0.2949)


def test_reverse_kl_objective_probe() -> None:
    # "Probe reverse_kl_objective": 1.0201 (beta 0.1, advantages (B,))
    g, rn = gen(22)
    B, T, V = 3, 4, 5
    logits, ref = rn(B, T, V), rn(B, T, V)
    labels = torch.randint(0, V, (B, T), generator=g)
    mask = (torch.rand(B, T, generator=g) > 0.3).float()
    adv = rn(B)
    close(O.reverse_kl_objective(logits, ref, labels, mask, adv, 0.1), 1.0201)


def test_grpo_objective_probe() -> None:
    # "Probe grpo_objective composition": the six reference values printed in full
    # (beta 0.04, clip 0.2 / 0.3, G 3), composite tolerance atol 1e-5 / rtol 1e-4 is not needed:
    # we match to 1e-6.
    g, rn = gen(23)
    B, T, V = 6, 4, 5
    logits, old, ref = rn(B, T, V), rn(B, T, V), rn(B, T, V)
    labels = torch.randint(0, V, (B, T), generator=g)
    mask = (torch.rand(B, T, generator=g) > 0.3).float()
    rewards = rn(B)
    expected = {
        (False, "k1"): 2.7708613872528076,
        (False, "k2"): 2.784942388534546,
        (False, "k3"): 2.7873611450195312,
        (True, "k1"): 2.799774408340454,
        (True, "k2"): 2.8138551712036133,
        (True, "k3"): 2.8162739276885986,
    }
    for (sbs, est), want in expected.items():
        out = O.grpo_objective(logits, old, ref, labels, mask, rewards, 3, 0.04, 0.2, 0.3, sbs, est)
        close(out, want, FULL)


def test_ppo_objective_probe() -> None:
    # "Probe ppo_objective": 0.7886 (T 6, next_value 0.3, gamma 0.99, lam 0.95, clips 0.2,
    # vf_coef 0.5); without whitening the advantages it would be 0.6986
    _, rn = gen(24)
    T = 6
    rewards, values, old_values, logp, old_logp = rn(T), rn(T), rn(T), rn(T), rn(T)
    out = O.ppo_objective(
        rewards,
        values,
        old_values,
        logp,
        old_logp,
        torch.tensor(0.3),
        0.99,
        0.95,
        0.2,
        0.2,
        0.2,
        0.5,
    )
    close(out, 0.7886)
