"""Semantics of each loss on hand-derived cases: masks, anchors, surrogates, clamp, metrics."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

from losslab.losses import LOG_RATIO_MAX, LOSS_NAMES, LOSSES, get_loss, policy
from losslab.losses.declarations import STANDARD_METRICS

INTERFACES = Path(__file__).resolve().parents[2] / "docs" / "interfaces.md"


def _documented_metric_keys() -> tuple[str, ...]:
    """The keys docs/interfaces.md says every policy loss returns."""
    text = INTERFACES.read_text(encoding="utf-8")
    para = text.split("Metric keys every policy loss returns:", 1)[1].split("Ratio and drift", 1)[0]
    return tuple(re.findall(r"`([a-z_]+/[a-z0-9_]+)`", para))


def test_standard_metrics_are_the_documented_ones():
    assert _documented_metric_keys() == STANDARD_METRICS


# A generic batch with ratios on both sides of 1 and of a cap c = 1.3, both advantage signs
# and A = 0: r = e^(log_ratio) = (1.65, 0.67, 1.11, 2.01, 0.82) and (1.35, 0.74, 1.0).
SAMPLER = [[-0.6, -1.2, -0.05, -2.0, -0.7], [-0.9, -0.1, -1.6]]
LOG_RATIO = [[0.5, -0.4, 0.1, 0.7, -0.2], [0.3, -0.3, 0.0]]
ADV = [[1.0, -1.0, 0.5, -0.5, 1.0], [-1.5, 1.5, 0.0]]


def _generic(make_batch, **kw):
    lp = [
        [s + r for s, r in zip(srow, rrow, strict=True)]
        for srow, rrow in zip(SAMPLER, LOG_RATIO, strict=True)
    ]
    return make_batch(lp, SAMPLER, ADV, **kw)


def _grads(make_batch, name: str, **params) -> list[torch.Tensor]:
    lp, batch = _generic(make_batch)
    get_loss(name, **params)(batch).loss.backward()
    return [x.grad for x in lp]


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("importance_sampling", {}),
        ("ppo", {}),
        ("dppo_binary_tv", {"low": 0.1, "high": 0.1}),
        ("dppo_binary_kl", {"low": 0.02, "high": 0.02}),
    ],
)
@pytest.mark.parametrize("cap", [1.3, math.inf])
def test_surrogates_share_one_gradient(make_batch, name, params, cap):
    """ "ratio" and "logprob" differ in value only: both gradients are -A·min(r, c)·M, including
    on tokens with r > c (three of them at c = 1.3: r = 1.65, 2.01, 1.35)."""
    ratio = _grads(make_batch, name, surrogate="ratio", clip_ratio_c=cap, **params)
    logprob = _grads(make_batch, name, surrogate="logprob", clip_ratio_c=cap, **params)
    for a, b in zip(ratio, logprob, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    if name == "ppo" and cap == math.inf:  # Tinker's clipped form has the same gradient too
        for a, b in zip(ratio, _grads(make_batch, "ppo"), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    # and that gradient is the closed form -A·min(r, c)·M (M from the loss's own kept_D)
    _, batch = _generic(make_batch)
    kept_D = get_loss(name, clip_ratio_c=cap, surrogate="ratio", **params)(batch).kept_D
    for d, grad in enumerate(ratio):
        r = torch.tensor(LOG_RATIO[d], dtype=torch.float64).exp().clamp(max=cap)
        expected = -torch.tensor(ADV[d], dtype=torch.float64) * r * kept_D[d]
        torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-12)


def test_surrogate_values_and_cap(make_batch):
    # one token: ℓ = -1, ℓ_s = -1.5 -> r = e^0.5 = 1.64872; A = 2.
    # ratio: value -A·r = -3.29744; logprob: value -A·sg(r)·ℓ = +3.29744; gradient -A·r both.
    # cap c = 1.5: ratio value -A·c = -3; logprob value -A·c·ℓ = 3; gradient -A·c = -3 both.
    r = math.exp(0.5)
    for surrogate, cap, value, grad in [
        ("ratio", math.inf, -2 * r, -2 * r),
        ("logprob", math.inf, 2 * r, -2 * r),
        ("ratio", 1.5, -3.0, -3.0),
        ("logprob", 1.5, 3.0, -3.0),
    ]:
        lp, batch = make_batch([[-1.0]], [[-1.5]], [[2.0]])
        out = get_loss("importance_sampling", surrogate=surrogate, clip_ratio_c=cap)(batch)
        out.loss.backward()
        assert out.loss.item() == pytest.approx(value, abs=1e-12), (surrogate, cap)
        assert lp[0].grad.item() == pytest.approx(grad, abs=1e-12), (surrogate, cap)


def test_log_ratio_clamp_bounds_value_not_gradient(make_batch):
    # ℓ - ℓ_s = 100 would overflow float32 (e^100 > 3.4e38). Clamped at 20: value -A·e^20 with
    # A = 1, gradient -A·e^20 (straight through). Float32 stays finite.
    lp, batch = make_batch([[-1.0, -0.5]], [[-101.0, -0.5]], [[1.0, 0.0]], dtype=torch.float32)
    out = get_loss("importance_sampling")(batch)
    out.loss.backward()
    e20 = math.exp(LOG_RATIO_MAX)
    assert LOG_RATIO_MAX == 20.0
    assert out.loss.item() == pytest.approx(-e20, rel=1e-6)
    assert lp[0].grad.tolist() == pytest.approx([-e20, 0.0], rel=1e-6)
    assert all(math.isfinite(v) for v in out.metrics.values())


def test_ppo_clip_mask_and_zero_adv_branches(make_batch):
    # r = (1.5, 0.5, 0.5, 1.0), A = (1, -1, 0, 1), Tinker bounds .8/1.2:
    # token 0: A > 0, r > 1.2 -> clipped; token 1: A < 0, r < .8 -> clipped;
    # token 2: A = 0, r < .8 -> clipped only under Stable-RL's "negative" branch; token 3 kept.
    logp = [math.log(1.5), math.log(0.5), math.log(0.5), 0.0]
    lp, batch = make_batch([logp], [[0.0] * 4], [[1.0, -1.0, 0.0, 1.0]])
    keep = get_loss("ppo")(batch)
    neg = get_loss("ppo", zero_adv="negative")(batch)
    assert keep.kept_D[0].tolist() == [False, False, True, True]
    assert neg.kept_D[0].tolist() == [False, False, False, True]
    assert keep.metrics["loss/clip_fraction"] == 2 / 4
    assert neg.metrics["loss/clip_fraction"] == 3 / 4
    # over A != 0 tokens (3 of them) both count the same 2 clipped tokens
    assert (
        keep.metrics["loss/clip_fraction_nonzero_adv"]
        == neg.metrics["loss/clip_fraction_nonzero_adv"]
        == 2 / 3
    )
    assert keep.loss.item() == neg.loss.item()  # A = 0 contributes nothing either way


def _strictly(make_batch, name, threshold_key, logp, sampler, adv, divergence):
    """A token exactly at the threshold is kept (strict >); one ulp below the value, masked."""
    lp, batch = make_batch([[logp]], [[sampler]], [[adv]])
    at = get_loss(name, **{threshold_key: divergence})(batch)
    below = get_loss(name, **{threshold_key: math.nextafter(divergence, 0.0)})(batch)
    return at.kept_D[0].item(), below.kept_D[0].item()


def test_dppo_tv_mask_by_direction_and_strictness(make_batch):
    # (p, p_s, A): p - p_s = +0.2 with A > 0 leaves upward (masked at 0.15), with A < 0 it is
    # kept; p - p_s = -0.2 with A < 0 masked, A > 0 kept; A = 0 takes the negative branch.
    p = [0.5, 0.5, 0.3, 0.3, 0.3]
    ps = [0.3, 0.3, 0.5, 0.5, 0.5]
    adv = [1.0, -1.0, -1.0, 1.0, 0.0]
    lp, batch = make_batch([[math.log(x) for x in p]], [[math.log(x) for x in ps]], [adv])
    out = get_loss("dppo_binary_tv")(batch)
    assert out.kept_D[0].tolist() == [False, True, False, True, False]
    spindle = get_loss("dppo_binary_tv", zero_adv="keep")(batch)
    assert spindle.kept_D[0].tolist() == [False, True, False, True, True]
    assert out.metrics["dppo/mask_fraction"] == out.metrics["loss/clip_fraction"] == 3 / 5
    assert out.metrics["loss/clip_fraction_nonzero_adv"] == 2 / 4
    # strict comparisons: threshold equal to the computed divergence keeps the token
    l, ls = math.log(0.5), math.log(0.3)
    tv = float(
        torch.tensor(l, dtype=torch.float64).exp() - torch.tensor(ls, dtype=torch.float64).exp()
    )
    assert _strictly(make_batch, "dppo_binary_tv", "high", l, ls, 1.0, tv) == (True, False)
    assert _strictly(make_batch, "dppo_binary_tv", "low", ls, l, -1.0, tv) == (True, False)


def test_dppo_kl_mask_hand_values(make_batch):
    # p_s = .5. p = .7: K = .5·ln(.5/.7) + .5·ln(.5/.3) = .5·(-0.33647 + 0.51083) = 0.08718.
    # p = .45: K = .5·ln(.5/.45) + .5·ln(.5/.55) = .5·(0.10536 - 0.09531) = 0.00502.
    # Threshold .05: (p=.7, A>0) masked; (p=.7, A<0) kept (p > p_s is the wrong direction);
    # (p=.45, A<0) kept (K small); (p=.3, A<0): K = .5·ln(.5/.3) + .5·ln(.5/.7) = 0.08718 -> masked.
    p = [0.7, 0.7, 0.45, 0.3]
    adv = [1.0, -1.0, -1.0, -1.0]
    lp, batch = make_batch([[math.log(x) for x in p]], [[math.log(0.5)] * 4], [adv])
    out = get_loss("dppo_binary_kl")(batch)
    assert out.kept_D[0].tolist() == [False, True, True, False]
    k = 0.5 * math.log(0.5 / 0.7) + 0.5 * math.log(0.5 / 0.3)
    assert k == pytest.approx(0.08718, abs=1e-5)
    # the threshold decides: kept just above K, masked just below (1e-6 >> the 1e-8 epsilon's effect)
    one = make_batch([[math.log(0.7)]], [[math.log(0.5)]], [[1.0]])[1]
    assert get_loss("dppo_binary_kl", high=k + 1e-6)(one).kept_D[0].item() is True
    assert get_loss("dppo_binary_kl", high=k - 1e-6)(one).kept_D[0].item() is False


def test_dppo_kl_positive_logprob_is_masked_not_nan(make_batch):
    # ℓ = 1e-7 > 0 (p a hair above 1): Stable-RL's log(1 - p + 1e-8) is NaN and keeps the token;
    # we floor 1 - p at 0 -> K = .5·ln(.5/1) + .5·ln((.5 + 1e-8)/1e-8) ≈ 8.5 -> masked for A > 0.
    lp, batch = make_batch([[1e-7]], [[math.log(0.5)]], [[1.0]])
    out = get_loss("dppo_binary_kl")(batch)
    assert out.kept_D[0].tolist() == [False]
    assert math.isfinite(out.loss.item())


def test_dppo_recomputed_anchor_masks_on_old_but_weights_on_sampler(make_batch):
    # token 0: p = .5, p_s = .5, p_o = .3, A = 1 -> vs sampler kept, vs old p - p_o = .2 > .15 masked.
    # token 1: p = .5, p_s = .25 (r = 2), p_o = .45 (p - p_o = .05, kept), A = 1 -> gradient
    #          -A·r with r against the SAMPLER = -2 (not -.5/.45 = -1.11).
    logp = [math.log(0.5), math.log(0.5)]
    sampler = [math.log(0.5), math.log(0.25)]
    old = [math.log(0.3), math.log(0.45)]
    lp, batch = make_batch([logp], [sampler], [[1.0, 1.0]], old=[old])
    out = get_loss("dppo_binary_tv", anchor="recomputed")(batch)
    out.loss.backward()
    assert out.kept_D[0].tolist() == [False, True]
    assert lp[0].grad.tolist() == pytest.approx([0.0, -2.0], abs=1e-12)
    # drift is measured against the anchor: |p - p_o| = (.2, .05) -> q50 = .125
    assert out.metrics["drift/abs_p_q50"] == pytest.approx(0.125, abs=1e-12)
    sampler_anchor = get_loss("dppo_binary_tv")(batch)
    assert sampler_anchor.kept_D[0].tolist() == [True, False]  # token 1: p - p_s = .25 > .15


def test_dppo_recomputed_anchor_needs_old_logprobs(make_batch):
    _, batch = make_batch([[-1.0]], [[-1.0]], [[1.0]])
    with pytest.raises(ValueError, match="old_logprobs_D"):
        get_loss("dppo_binary_kl", anchor="recomputed")(batch)


def test_dro_has_a_gradient_at_zero_advantage(make_batch):
    # dL/dℓ = -(A - β(ℓ - ℓ_s)) = β(ℓ - ℓ_s) at A = 0: .05·(-1 + 1.5) = 0.025
    lp, batch = make_batch([[-1.0]], [[-1.5]], [[0.0]])
    get_loss("dro")(batch).loss.backward()
    assert lp[0].grad.item() == pytest.approx(0.025, abs=1e-12)


def test_pg_grad_norm_leaves_out_the_penalty(make_batch):
    # DRO at ℓ = -1, ℓ_s = -1.5, A = 0: the whole gradient is the penalty's β(ℓ - ℓ_s) = 0.025
    # (the test above) and the policy-gradient part -ℓ·A has gradient -A = 0
    lp, batch = make_batch([[-1.0, -2.0]], [[-1.5, -2.0]], [[0.0, 2.0]])
    out = get_loss("dro")(batch)
    # PG part -Σ ℓ·A: gradient (-0, -2) -> norm 2; the penalty adds (0.025, 0) to the full one
    assert out.metrics["loss/pg_grad_norm"] == pytest.approx(2.0, abs=1e-12)
    out.loss.backward()
    assert lp[0].grad.tolist() == pytest.approx([0.025, -2.0], abs=1e-12)
    # DPPO with kl_tau: the penalty tau·(ℓ - ℓ_s)² is left out; without it the norms agree.
    # Ratio surrogate, no mask at r = e^0.5 < c: PG gradient -A·r = (0, -2) -> norm 2
    lp, batch = make_batch([[-1.0, -2.0]], [[-1.5, -2.0]], [[0.0, 2.0]])
    with_tau = get_loss("dppo_binary_tv", kl_tau=0.1, low=1.0, high=1.0)(batch)
    assert with_tau.metrics["loss/pg_grad_norm"] == pytest.approx(2.0, abs=1e-12)
    # a batch whose log-probs carry no gradient: nothing to measure
    _, frozen = make_batch([[-1.0]], [[-1.5]], [[1.0]])
    frozen.logprobs_D[0].requires_grad_(False)
    assert math.isnan(get_loss("ppo")(frozen).metrics["loss/pg_grad_norm"])


def test_cross_entropy_ignores_advantages_and_sampler(make_batch):
    # L = -Σ m·ℓ = 1 + 2 = 3 whatever the advantages and sampler log-probs
    _, a = make_batch([[-1.0, -2.0]], [[-5.0, -0.1]], [[3.0, -7.0]])
    _, b = make_batch([[-1.0, -2.0]], [[0.0, 0.0]], [[0.0, 0.0]])
    assert (
        get_loss("cross_entropy")(a).loss.item() == get_loss("cross_entropy")(b).loss.item() == 3.0
    )


def test_metrics_hand_values(make_batch):
    # r = (1, 2, 3, 4) with p = .4 everywhere: ℓ = log .4, ℓ_s = log(.4/r), A = 1.
    # ratio mean 2.5; torch.quantile (linear): q50 = 2.5, q90 at position .9·3 = 2.7 -> 3.7.
    # |p - p_s| = .4·(1 - 1/r) = (0, .2, .26667, .3): q50 = (.2 + .26667)/2 = .23333,
    # q90 = .26667 + .7·(.3 - .26667) = .29.
    r = [1.0, 2.0, 3.0, 4.0]
    lp, batch = make_batch([[math.log(0.4)] * 4], [[math.log(0.4 / x) for x in r]], [[1.0] * 4])
    m = get_loss("importance_sampling")(batch).metrics
    assert m["ratio/mean"] == pytest.approx(2.5, abs=1e-12)
    assert m["ratio/q50"] == pytest.approx(2.5, abs=1e-12)
    assert m["ratio/q90"] == pytest.approx(3.7, abs=1e-12)
    assert m["drift/abs_p_q50"] == pytest.approx((0.2 + 0.4 * (1 - 1 / 3)) / 2, abs=1e-12)
    assert m["drift/abs_p_q90"] == pytest.approx(
        0.4 * (1 - 1 / 3) + 0.7 * (0.3 - 0.4 * (1 - 1 / 3)), abs=1e-12
    )
    assert m["loss/value"] == pytest.approx(-(1 + 2 + 3 + 4), abs=1e-12)  # -Σ r·A
    assert m["loss/tokens"] == 4 and m["loss/masked_count"] == 0


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_every_loss_returns_the_interface_metrics(make_batch, name):
    _, batch = _generic(make_batch)
    out = get_loss(name)(batch)
    assert set(STANDARD_METRICS) <= set(out.metrics)
    assert list(out.metrics) == list(LOSSES[name].metrics)  # what plan check reads for the gate
    assert all(isinstance(v, float) for v in out.metrics.values())
    assert out.loss.dim() == 0
    assert [k.dtype for k in out.kept_D] == [torch.bool, torch.bool]
    assert [k.shape[0] for k in out.kept_D] == [5, 3]


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_empty_mask_metrics(make_batch, name):
    # no loss token: fractions and counts 0, ratio/drift statistics NaN (undefined)
    _, batch = make_batch([[-1.0, -2.0]], [[-1.0, -2.0]], [[1.0, 1.0]], [[0.0, 0.0]])
    m = get_loss(name)(batch).metrics
    assert m["loss/tokens"] == 0 and m["loss/clip_fraction"] == 0 and m["loss/masked_count"] == 0
    assert math.isnan(m["ratio/q90"]) and math.isnan(m["drift/abs_p_q50"])


@pytest.mark.parametrize(
    ("fn", "kwargs", "match"),
    [
        (policy.dppo_binary_tv, {"anchor": "old"}, "anchor='old'"),
        (policy.dppo_binary_kl, {"zero_adv": "skip"}, "zero_adv='skip'"),
        (policy.importance_sampling, {"surrogate": "clipped"}, "surrogate='clipped'"),
        (policy.ppo, {"reduction": "mean"}, "reduction='mean'"),
    ],
)
def test_direct_calls_reject_unknown_choices(make_batch, fn, kwargs, match):
    """The functions are public too; choices are checked there (numbers only via get_loss)."""
    _, batch = make_batch([[-1.0]], [[-1.0]], [[1.0]])
    with pytest.raises(ValueError, match=match):
        fn(batch, **kwargs)
