"""Property tests (hypothesis): masking, group centring, GAE identities, KL closed forms,
and brute-force references for the small utilities."""

from __future__ import annotations

import bisect
import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import losslab.objectives as O

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True)
D = torch.float64


@st.composite
def values_and_mask(draw, min_n: int = 1, max_n: int = 12):
    n = draw(st.integers(min_n, max_n))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(n, generator=g, dtype=D) * draw(st.sampled_from([1e-2, 1.0, 1e3]))
    m = (torch.rand(n, generator=g) > draw(st.floats(0.0, 0.9))).to(D)
    return v, m


def poison(v: torch.Tensor, m: torch.Tensor, fill: float) -> torch.Tensor:
    return torch.where(m == 0, torch.full_like(v, fill), v)


# ------------------------------------------------------------------ masked values never leak
@SETTINGS
@given(values_and_mask(), st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e30]))
def test_masked_reductions_ignore_masked_slots(vm, fill) -> None:
    v, m = vm
    bad = poison(v, m, fill)
    for fn in (O.masked_mean, O.masked_sum, O.masked_max, O.advantage_mean_std):
        torch.testing.assert_close(fn(bad, m), fn(v, m), equal_nan=False)
    torch.testing.assert_close(O.masked_whiten(bad, m, True), O.masked_whiten(v, m, True))
    if bool(m.any()):
        keep = m != 0
        # whiten applies w at every slot, so only masked-in slots are guaranteed clean
        torch.testing.assert_close(O.whiten(bad, m, False)[keep], O.whiten(v, m, False)[keep])
        # and the masked_mean equals the plain mean of the kept values
        torch.testing.assert_close(O.masked_mean(v, m), v[keep].mean())


@settings(max_examples=15, deadline=None, derandomize=True)
@given(st.integers(0, 2**31 - 1))
def test_token_objectives_ignore_masked_tokens(seed) -> None:
    g = torch.Generator().manual_seed(seed)
    B, T, V = 3, 4, 5
    logits = torch.randn(B, T, V, generator=g, dtype=D)
    old = torch.randn(B, T, V, generator=g, dtype=D)
    labels = torch.randint(0, V, (B, T), generator=g)
    m = (torch.rand(B, T, generator=g) > 0.4).to(D)
    adv = torch.randn(B, generator=g, dtype=D)
    poisoned = torch.where(m[..., None] == 0, torch.full_like(logits, float("nan")), logits)
    for fn in (
        lambda lg: O.entropy(lg, m),
        lambda lg: O.selective_logprobs(lg, labels, m),
        lambda lg: O.sequence_logprob(lg, labels, m, True),
        lambda lg: O.reverse_kl_objective(lg, old, labels, m, adv, 0.1),
        lambda lg: O.rloo_objective(lg, old, labels, m, torch.arange(3.0, dtype=D), 3, 0.2, 0.3),
        lambda lg: O.cross_entropy(lg, torch.where(m == 0, -100, labels), -100),
    ):
        torch.testing.assert_close(fn(poisoned), fn(logits))


# ------------------------------------------------------------------ group advantages
@SETTINGS
@given(st.integers(1, 5), st.integers(2, 6), st.integers(0, 2**31 - 1))
def test_group_advantages_have_zero_mean_per_group(n_groups, g_size, seed) -> None:
    r = torch.randn(n_groups * g_size, generator=torch.Generator().manual_seed(seed), dtype=D)
    for adv in (
        O.grpo_advantages(r, g_size, False),
        O.grpo_advantages(r, g_size, True),
        O.rloo_advantages(r, g_size),
        O.group_mean_baseline(r, g_size),
    ):
        assert adv.shape == r.shape
        torch.testing.assert_close(adv.view(-1, g_size).mean(1), torch.zeros(n_groups, dtype=D))
    # RLOO = G/(G-1) · (r - mean) (verl's form)
    torch.testing.assert_close(
        O.rloo_advantages(r, g_size), g_size / (g_size - 1) * O.group_mean_baseline(r, g_size)
    )
    # scaled GRPO has biased std ≈ 1 per group (up to the 1e-6 eps) unless the group is constant
    std = O.grpo_advantages(r, g_size, True).view(-1, g_size).std(1, unbiased=False)
    assert torch.all((std - 1).abs() < 1e-4)


# ------------------------------------------------------------------ returns
@SETTINGS
@given(st.integers(1, 8), st.integers(1, 3), st.integers(0, 2**31 - 1))
def test_gae_with_gamma_lam_one_is_returns_minus_values(T, B, seed) -> None:
    g = torch.Generator().manual_seed(seed)
    r, v = torch.randn(T, B, generator=g, dtype=D), torch.randn(T, B, generator=g, dtype=D)
    nv = torch.randn(B, generator=g, dtype=D)
    # γ = λ = 1: A_t = Σ_{k>=t} r_k + V_T - V_t (telescoping δ sum)
    returns = O.discounted_returns(r, 1.0) + nv
    torch.testing.assert_close(O.gae(r, v, nv, 1.0, 1.0), returns - v)
    torch.testing.assert_close(O.lambda_returns(r, v, nv, 1.0, 1.0), returns)
    # λ = 0: one-step TD target r_t + γ V_{t+1}
    v_next = torch.cat([v[1:], nv[None]])
    torch.testing.assert_close(O.lambda_returns(r, v, nv, 0.9, 0.0), r + 0.9 * v_next)


@SETTINGS
@given(st.integers(1, 8), st.floats(0.0, 1.0), st.integers(0, 2**31 - 1))
def test_discounted_returns_closed_form(T, gamma, seed) -> None:
    r = torch.randn(T, generator=torch.Generator().manual_seed(seed), dtype=D)
    want = torch.tensor(
        [sum(gamma ** (k - t) * r[k].item() for k in range(t, T)) for t in range(T)], dtype=D
    )
    torch.testing.assert_close(O.discounted_returns(r, gamma), want)


# ------------------------------------------------------------------ KL estimators
@SETTINGS
@given(st.integers(1, 8), st.sampled_from([0.1, 1.0, 5.0]), st.integers(0, 2**31 - 1))
def test_kl_closed_forms(n, scale, seed) -> None:
    g = torch.Generator().manual_seed(seed)
    logp = torch.randn(n, generator=g, dtype=D) * scale
    ref = torch.randn(n, generator=g, dtype=D) * scale
    d = logp - ref
    k1, k2, k3 = (O.kl_penalty(logp, ref, e) for e in ("k1", "k2", "k3"))
    torch.testing.assert_close(k1, d)
    torch.testing.assert_close(k2, 0.5 * d**2)
    torch.testing.assert_close(k3, torch.exp(-d) - 1 + d)
    assert torch.all(k2 >= 0) and torch.all(k3 >= 0)  # e^{-d} >= 1 - d
    torch.testing.assert_close(O.reverse_kl(logp, ref), k3)
    # symmetric_kl = cosh(d) - 1 = ½[k3(d) + k3(-d)]
    torch.testing.assert_close(
        O.symmetric_kl(logp, ref), 0.5 * (k3 + O.kl_penalty(ref, logp, "k3"))
    )


def test_k3_is_unbiased_for_kl() -> None:
    # E_{x~p}[k3] = KL(p||q): exact expectation over a 4-token categorical
    p = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=D)
    q = torch.tensor([0.25, 0.25, 0.4, 0.1], dtype=D)
    kl = (p * (p.log() - q.log())).sum()
    torch.testing.assert_close((p * O.kl_penalty(p.log(), q.log(), "k3")).sum(), kl)
    torch.testing.assert_close((p * O.kl_penalty(p.log(), q.log(), "k1")).sum(), kl)


# ------------------------------------------------------------------ small utilities vs brute force
int_lists = st.lists(st.integers(-3, 3), min_size=1, max_size=12)


@SETTINGS
@given(int_lists)
def test_mode_label_brute_force(xs) -> None:
    counts = {x: xs.count(x) for x in xs}
    best = max(counts.values())
    assert O.mode_label(torch.tensor(xs)).item() == max(x for x, c in counts.items() if c == best)


@SETTINGS
@given(st.lists(st.floats(-10, 10), min_size=1, max_size=12), st.floats(0.0, 1.0))
def test_quantile_and_median_brute_force(xs, q) -> None:
    x = torch.tensor(xs, dtype=D)
    s = sorted(xs)
    idx = math.floor(q * (len(xs) - 1) + 1e-12)
    if abs(q * (len(xs) - 1) - round(q * (len(xs) - 1))) > 1e-9:  # away from float rank ties
        assert O.quantile_lower(x, q).item() == s[idx]
    n = len(s)
    med = s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
    assert abs(O.median_reward(x).item() - med) < 1e-12


@SETTINGS
@given(st.lists(st.floats(-5, 5), min_size=1, max_size=10))
def test_cumulative_max_brute_force(xs) -> None:
    want = [xs[0]] + [max(xs[:t]) for t in range(1, len(xs))]
    assert O.cumulative_max(torch.tensor(xs, dtype=D)).tolist() == want


@SETTINGS
@given(st.lists(st.floats(-3, 3), min_size=1, max_size=10), st.lists(st.floats(-3, 3), max_size=5))
def test_bucketize_is_bisect_right(xs, bounds) -> None:
    b = sorted(bounds)
    out = O.bucketize_reward(torch.tensor(xs, dtype=D), torch.tensor(b, dtype=D))
    assert out.tolist() == [bisect.bisect_right(b, x) for x in xs]


@SETTINGS
@given(st.lists(st.integers(0, 6), min_size=1, max_size=5), st.integers(6, 8))
def test_pad_mask_and_first_nonzero(lengths, max_len) -> None:
    pm = O.pad_mask_from_lengths(torch.tensor(lengths), max_len)
    assert pm.sum(1).tolist() == lengths
    # first zero of each pad mask row = its length (-1 where the row is all ones)
    fz = O.first_nonzero_index(1 - pm)
    assert fz.tolist() == [n if n < max_len else -1 for n in lengths]


@SETTINGS
@given(st.integers(0, 2**31 - 1), st.floats(0.0, 1.0), st.integers(1, 7))
def test_top_p_rows_sum_to_one_and_top_k_counts(seed, p, k) -> None:
    g = torch.Generator().manual_seed(seed)
    probs = torch.softmax(torch.randn(3, 7, generator=g, dtype=D), -1)
    out = O.top_p_mask(probs, p)
    torch.testing.assert_close(out.sum(-1), torch.ones(3, dtype=D))
    kept = out > 0
    # kept tokens are the most probable ones, in proportion to the input
    torch.testing.assert_close(
        out[kept] / probs[kept], (1 / (probs * kept).sum(-1, keepdim=True)).expand_as(probs)[kept]
    )
    mask = O.top_k_mask(probs, k)
    assert mask.dtype == torch.bool and mask.sum(-1).tolist() == [k] * 3  # no ties in randn
