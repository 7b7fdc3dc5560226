"""The field's losses (losses/field.py) on one hand-derived batch: value, gradient, keep mask and
each declared metric, and the framework conventions each knob names.

The batch (float64): two datums, the second with a masked third token that holds a huge
log-ratio (it must never reach a value, a gradient or a sequence ratio).

    datum 0: ℓ_s = (-1.0, -2.0, -0.5), Δ = ℓ - ℓ_s = (0.2, -0.4, 0.5), A = +1, m = (1, 1, 1)
    datum 1: ℓ_s = (-0.3, -1.5, -0.7), Δ = (0.1, 0.3, 9.0),             A = -2, m = (1, 1, 0)

so r = e^Δ = (1.22140, 0.67032, 1.64872 | 1.10517, 1.34986), N = 5 loss tokens, G = 2.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from losslab.losses import LOSSES, get_loss, parse_loss_spec

DOCS = Path(__file__).resolve().parents[2] / "docs" / "losses.md"

SAMPLER = [[-1.0, -2.0, -0.5], [-0.3, -1.5, -0.7]]
DELTA = [[0.2, -0.4, 0.5], [0.1, 0.3, 9.0]]
ADV = [[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]]
MASK = [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]
E = math.exp
R = [[E(0.2), E(-0.4), E(0.5)], [E(0.1), E(0.3)]]  # loss tokens only


def _batch(make_batch, adv=ADV, old=None):
    lp = [
        [s + d for s, d in zip(sr, dr, strict=True)] for sr, dr in zip(SAMPLER, DELTA, strict=True)
    ]
    return make_batch(lp, SAMPLER, adv, mask=MASK, old=old)


def _run(make_batch, name, adv=ADV, old=None, **params):
    lp, batch = _batch(make_batch, adv, old)
    out = get_loss(name, **params)(batch)
    out.loss.backward()
    assert set(out.metrics) == set(LOSSES[name].metrics)  # every declared key is logged
    return out, [g.tolist() for g in (x.grad for x in lp)]


def _flat(rows):
    return [x for row in rows for x in row]


# --- GSPO / LUSPO ---


def test_gspo_sequence_ratio_value_and_gradient(make_batch):
    # s_0 = e^{(0.2 - 0.4 + 0.5)/3} = e^0.1, s_1 = e^{(0.1 + 0.3)/2} = e^0.2 (the masked Δ = 9
    # is left out). Bounds 0.8/1.2: s_0 = 1.105 inside; s_1 = 1.221 > 1.2 but A < 0, so the
    # unclipped side: per-token loss -A·s, seq-mean-token-mean = (1/2)(-1·e^0.1 + 2·e^0.2).
    # dL/dℓ_t = -(1/G)·A_d·s_d/n_d: datum 0 -(1/2)e^0.1/3, datum 1 +(1/2)·2·e^0.2/2, masked 0.
    out, grads = _run(make_batch, "gspo", epsilon_low=0.2, epsilon_high=0.2)
    s0, s1 = E(0.1), E(0.2)
    assert out.loss.item() == pytest.approx(0.5 * (-s0 + 2 * s1), abs=1e-12)
    assert grads[0] == pytest.approx([-s0 / 6] * 3, abs=1e-12)
    assert grads[1] == pytest.approx([s1 / 2, s1 / 2, 0.0], abs=1e-12)
    assert out.metrics["gspo/seq_ratio_mean"] == pytest.approx((s0 + s1) / 2, abs=1e-12)
    assert out.metrics["loss/clip_fraction"] == 0.0


def test_gspo_clips_whole_sequences(make_batch):
    # ε_hi = 0.05: s_0 = 1.105 > 1.05 with A > 0, so datum 0 is clipped as a whole: value
    # -1.05 per token, no gradient, all three tokens not kept; datum 1 as above.
    out, grads = _run(make_batch, "gspo", epsilon_low=0.2, epsilon_high=0.05)
    assert out.loss.item() == pytest.approx(0.5 * (-1.05 + 2 * E(0.2)), abs=1e-12)
    assert grads[0] == [0.0, 0.0, 0.0]
    assert out.kept_D[0].tolist() == [False, False, False]
    assert out.kept_D[1].tolist() == [True, True, True]
    assert out.metrics["loss/clip_fraction"] == pytest.approx(3 / 5)


def test_gspo_token_level_weights_each_token_by_its_own_advantage(make_batch):
    # Per-token advantages in datum 0: A = (1, 2, 0). GSPO-token: value still s_0 per token,
    # dL/dℓ_t = -(1/G)(1/n_0)·A_t·s_0; the sequence level spreads the mean advantage instead:
    # -(1/G)(1/n_0)·(ΣA)·s_0/n_0 = -(1/2)(1/3)·3·s_0/3 on every token.
    adv = [[1.0, 2.0, 0.0], [-2.0, -2.0, -2.0]]
    params = dict(epsilon_low=0.2, epsilon_high=0.2, adv=adv)
    tok, tok_grads = _run(make_batch, "gspo", level="token", **params)
    seq, seq_grads = _run(make_batch, "gspo", level="sequence", **params)
    s0 = E(0.1)
    assert tok.loss.item() == pytest.approx(seq.loss.item(), abs=1e-12)
    assert tok_grads[0] == pytest.approx([-s0 / 6, -2 * s0 / 6, 0.0], abs=1e-12)
    assert seq_grads[0] == pytest.approx([-s0 / 6] * 3, abs=1e-12)
    assert tok_grads[1] == pytest.approx(seq_grads[1], abs=1e-12)  # constant A: levels agree


@pytest.mark.parametrize("level", ["sequence", "token"])
def test_gspo_log_ratio_guards(make_batch, level):
    # One datum, Δ = (12, 12) -> log s = 12 (and Δ = (30, 30) -> 30), A = -1 (A < 0 and s above
    # the clip: the unclipped side), seq-mean-token-mean: L = s, dL/dℓ_t = s/2 (both levels).
    #   "upper" (losslab): s = e^min(log s, 20), gradient straight through;
    #   "verl": s = e^min(log s, 10) with torch's clamp, gradient 0 beyond 10;
    #   "none" (TRL): s = e^log s.
    def run(delta: float, guard: str):
        lp, batch = make_batch([[-1.0 + delta] * 2], [[-1.0] * 2], [[-1.0] * 2])
        out = get_loss("gspo", level=level, log_ratio_guard=guard)(batch)
        out.loss.backward()
        return [out.loss.item(), *lp[0].grad.tolist()]  # value, then the two gradients

    assert run(12.0, "upper") == pytest.approx([E(12), E(12) / 2, E(12) / 2], rel=1e-12)
    assert run(12.0, "none") == pytest.approx([E(12), E(12) / 2, E(12) / 2], rel=1e-12)
    assert run(12.0, "verl") == pytest.approx([E(10), 0.0, 0.0], rel=1e-12)
    assert run(30.0, "upper") == pytest.approx([E(20), E(20) / 2, E(20) / 2], rel=1e-12)
    assert run(30.0, "none") == pytest.approx([E(30), E(30) / 2, E(30) / 2], rel=1e-12)


def test_luspo_scales_each_sequence_by_its_length(make_batch):
    # LUSPO (TRL `luspo` after PR #6654): GSPO's sequence loss summed over the sequence's tokens,
    # then the mean over sequences: (1/2)(3·(-e^0.1) + 2·(2·e^0.2)); gradient n_d times GSPO's.
    out, grads = _run(make_batch, "luspo", epsilon_low=0.2, epsilon_high=0.2)
    s0, s1 = E(0.1), E(0.2)
    assert out.loss.item() == pytest.approx(0.5 * (-3 * s0 + 4 * s1), abs=1e-12)
    assert grads[0] == pytest.approx([-s0 / 2] * 3, abs=1e-12)
    assert grads[1] == pytest.approx([s1, s1, 0.0], abs=1e-12)


# --- CISPO: the same epsilon means two caps ---


@pytest.mark.parametrize(
    ("params", "low", "high"),
    [
        ({"epsilon_meaning": "absolute_cap", "epsilon_high": 1.5}, 0.0, 1.5),  # TRL
        ({"epsilon_meaning": "one_plus_eps", "epsilon_high": 0.5}, 0.0, 1.5),  # slime cap 1.5
        ({"epsilon_meaning": "one_plus_eps", "epsilon_low": 0.2, "epsilon_high": 0.5}, 0.8, 1.5),
        ({"epsilon_meaning": "one_plus_eps", "epsilon_high": 1.5}, 0.0, 2.5),  # slime, ε = 1.5
    ],
)
def test_cispo_eps_meanings(make_batch, params, low, high):
    # w = sg(clip(r, low, high)); L = -Σ w·A·ℓ / N (token-mean), dL/dℓ = -w·A/N.
    out, grads = _run(make_batch, "cispo_eps", **params)
    lp = _flat(
        [
            [s + d for s, d in zip(sr, dr, strict=True)]
            for sr, dr in zip(SAMPLER, DELTA, strict=True)
        ]
    )
    lp = lp[:3] + lp[3:5]
    a = [1.0, 1.0, 1.0, -2.0, -2.0]
    w = [min(max(r, low), high) for r in _flat(R)]
    assert out.loss.item() == pytest.approx(
        -sum(wi * ai * li for wi, ai, li in zip(w, a, lp, strict=True)) / 5
    )
    assert _flat(grads)[:5] == pytest.approx(
        [-wi * ai / 5 for wi, ai in zip(w, a, strict=True)], abs=1e-12
    )
    clipped = sum(r < low or r > high for r in _flat(R))
    assert out.metrics["cispo/clip_fraction"] == pytest.approx(clipped / 5)
    assert all(k.all() for k in out.kept_D)  # the clip reweights, never zeroes


def test_cispo_eps_absolute_cap_has_no_lower_bound():
    with pytest.raises(ValueError, match="epsilon_low=0.2 needs epsilon_meaning='one_plus_eps'"):
        get_loss("cispo_eps", epsilon_low=0.2)


# --- the PPO family ---

# PPO per-token values at bounds 0.8/1.2 (A = +1 in datum 0, -2 in datum 1):
#   datum 0: r = 1.2214 > 1.2 clipped -> -1.2 (no grad); 0.6703 < 0.8 but A > 0, unclipped
#            -> -0.6703; 1.6487 clipped -> -1.2 (no grad)
#   datum 1: A < 0, r = 1.1052, 1.3499 both unclipped (the low bound binds for A < 0) -> 2·r
PPO_VALUES = [-1.2, -E(-0.4), -1.2, 2 * E(0.1), 2 * E(0.3)]
PPO_GRADS = [0.0, -E(-0.4), 0.0, 2 * E(0.1), 2 * E(0.3)]


@pytest.mark.parametrize(
    ("params", "c"),
    [
        ({}, 256.0),  # TRL: sum / (B · max_completion_length)
        ({"constant": "max_seq_len", "max_prompt_length": 100.0}, 356.0),  # SkyRL
        ({"constant": "padded_width"}, 3.0),  # verl: the padded width, here the longest datum
    ],
)
def test_dr_grpo_constant(make_batch, params, c):
    # L = Σ PPO_t / (G·C), G = 2; gradient PPO_GRADS / (G·C).
    out, grads = _run(make_batch, "dr_grpo", **params)
    assert out.loss.item() == pytest.approx(sum(PPO_VALUES) / (2 * c), abs=1e-12)
    assert _flat(grads)[:5] == pytest.approx([g / (2 * c) for g in PPO_GRADS], abs=1e-12)
    assert out.metrics["dr_grpo/constant"] == c
    assert out.kept_D[0].tolist() == [False, True, False]


def test_dr_grpo_prompt_length_is_read_only_by_skyrl():
    with pytest.raises(ValueError, match="max_prompt_length=10.0 is read only with"):
        get_loss("dr_grpo", max_prompt_length=10)


def test_dapo_clip_higher_token_mean(make_batch):
    # bounds 0.8/1.28: r = 1.2214 is now inside (-1.2214, gradient -1.2214), 1.6487 still
    # clipped at -1.28; datum 1 as PPO. Token-mean over N = 5.
    out, grads = _run(make_batch, "dapo")
    values = [-E(0.2), -E(-0.4), -1.28, 2 * E(0.1), 2 * E(0.3)]
    assert out.loss.item() == pytest.approx(sum(values) / 5, abs=1e-12)
    expected = [-E(0.2), -E(-0.4), 0.0, 2 * E(0.1), 2 * E(0.3)]
    assert _flat(grads)[:5] == pytest.approx([g / 5 for g in expected], abs=1e-12)
    assert out.kept_D[0].tolist() == [True, True, False]


def test_dual_clip_bounds_negative_advantages(make_batch):
    # c = 1.3: datum 1's second token (A = -2, r = 1.3499 > c) takes the constant -A·c = 2.6
    # and no gradient; the first (r = 1.105 < c) keeps 2·r. Datum 0 as PPO. Token-mean.
    out, grads = _run(make_batch, "dual_clip_ppo", clip_ratio_c=1.3)
    values = PPO_VALUES[:4] + [2.6]
    assert out.loss.item() == pytest.approx(sum(values) / 5, abs=1e-12)
    assert _flat(grads)[:5] == pytest.approx([g / 5 for g in PPO_GRADS[:4] + [0.0]], abs=1e-12)
    assert out.kept_D[1].tolist() == [True, False, True]
    assert out.metrics["dual_clip/fraction"] == pytest.approx(1 / 5)


def test_dual_clip_cap_must_exceed_the_high_bound():
    with pytest.raises(ValueError, match="clip_high_threshold=1.2 must be <= clip_ratio_c=1.1"):
        get_loss("dual_clip_ppo", clip_ratio_c=1.1)


# --- rollout correction and IcePop ---


def test_tis_token_truncate(make_batch):
    # anchor "sampler": w = sg(min(r, 1.5)) = (1.2214, 0.6703, 1.5 | 1.1052, 1.3499); value
    # -A·w, gradient -A·w, token-mean. One token truncated (1.6487).
    out, grads = _run(make_batch, "rollout_correction", cap=1.5)
    w = [min(r, 1.5) for r in _flat(R)]
    a = [1.0, 1.0, 1.0, -2.0, -2.0]
    assert out.loss.item() == pytest.approx(
        -sum(x * y for x, y in zip(w, a, strict=True)) / 5, abs=1e-12
    )
    assert _flat(grads)[:5] == pytest.approx(
        [-x * y / 5 for x, y in zip(w, a, strict=True)], abs=1e-12
    )
    assert out.metrics["rollout_correction/affected_fraction"] == pytest.approx(1 / 5)
    assert out.metrics["rollout_correction/weight_mean"] == pytest.approx(sum(w) / 5)
    # slime's two-sided truncation clip(w, 0.8, 1.5) lifts 0.6703 to 0.8 as well
    both, both_grads = _run(make_batch, "rollout_correction", cap=1.5, lower=0.8)
    w2 = [min(max(r, 0.8), 1.5) for r in _flat(R)]
    assert _flat(both_grads)[:5] == pytest.approx(
        [-x * y / 5 for x, y in zip(w2, a, strict=True)], abs=1e-12
    )
    assert both.metrics["rollout_correction/affected_fraction"] == pytest.approx(2 / 5)
    logprob, logprob_grads = _run(make_batch, "rollout_correction", cap=1.5, surrogate="logprob")
    assert _flat(logprob_grads) == pytest.approx(
        _flat(grads), abs=1e-12
    )  # one gradient, two values


def test_mis_token_mask_equals_icepop(make_batch):
    # [0.8, 1.5]: 0.6703 and 1.6487 are masked (weight 0, not kept); the rest keep w = r.
    mis, mis_grads = _run(make_batch, "rollout_correction", mode="mask", lower=0.8, cap=1.5)
    ice, ice_grads = _run(make_batch, "icepop", low=0.8, high=1.5)
    w = [E(0.2), 0.0, 0.0, E(0.1), E(0.3)]
    a = [1.0, 1.0, 1.0, -2.0, -2.0]
    assert ice.loss.item() == pytest.approx(
        -sum(x * y for x, y in zip(w, a, strict=True)) / 5, abs=1e-12
    )
    assert mis.loss.item() == pytest.approx(ice.loss.item(), abs=1e-12)
    assert _flat(ice_grads) == pytest.approx(_flat(mis_grads), abs=1e-12)
    assert _flat(ice_grads)[:5] == pytest.approx(
        [-x * y / 5 for x, y in zip(w, a, strict=True)], abs=1e-12
    )
    assert ice.kept_D[0].tolist() == [True, False, False]
    assert ice.metrics["icepop/mask_fraction"] == pytest.approx(2 / 5)
    assert mis.metrics["rollout_correction/affected_fraction"] == pytest.approx(2 / 5)


def test_icepop_bounds_are_each_frameworks(make_batch):
    # prime-rl's [0.2, 5] keeps every token here; rllm/AReaL's [0.5, 5] too; [1.3, 5] drops
    # three (r = 1.2214, 0.6703, 1.1052).
    for low, dropped in ((0.2, 0), (0.5, 0), (1.3, 3)):
        out, _ = _run(make_batch, "icepop", low=low, high=5.0)
        assert out.metrics["icepop/mask_fraction"] == pytest.approx(dropped / 5)


def test_sequence_level_weights(make_batch):
    # w_d = e^{Σ_t Δ}: datum 0 e^0.3 = 1.3499, datum 1 e^0.4 = 1.4918 (masked Δ left out).
    # truncate at 1.4: (1.3499, 1.4); mask at 1.4: datum 1 dropped whole.
    trunc, trunc_grads = _run(make_batch, "rollout_correction", level="sequence", cap=1.4)
    w = [E(0.3)] * 3 + [1.4] * 2
    a = [1.0, 1.0, 1.0, -2.0, -2.0]
    assert trunc.loss.item() == pytest.approx(
        -sum(x * y for x, y in zip(w, a, strict=True)) / 5, abs=1e-12
    )
    assert _flat(trunc_grads)[:5] == pytest.approx(
        [-x * y / 5 for x, y in zip(w, a, strict=True)], abs=1e-12
    )
    mask, mask_grads = _run(
        make_batch, "rollout_correction", level="sequence", mode="mask", cap=1.4
    )
    assert mask.loss.item() == pytest.approx(-3 * E(0.3) / 5, abs=1e-12)
    assert mask.kept_D[1].tolist() == [False, False, True]
    assert mask_grads[1] == [0.0, 0.0, 0.0]


def test_recomputed_anchor_weights_a_clipped_ppo_ratio(make_batch):
    # ℓ_o = ℓ_s + δ, δ = (0.1, 0.0, -0.1 | 0.2, -0.2): k = e^δ (detached), PPO ratio
    # ρ = e^(Δ - δ) = (e^0.1, e^-0.4, e^0.6 | e^-0.1, e^0.5) clipped at 0.8/1.2; IcePop bounds
    # [0.8, 1.5] drop nothing (k ≥ e^-0.2 = 0.819). Per token -k·min(ρA, clip(ρ)A):
    #   datum 0 (A = +1): -e^0.1·e^0.1, -1·e^-0.4 (ρ < 0.8, A > 0: unclipped), -e^-0.1·1.2 (clipped)
    #   datum 1 (A = -2): e^0.2·2·max(e^-0.1, 0.8) = e^0.2·2e^-0.1, e^-0.2·2·e^0.5 (unclipped)
    delta = [[0.1, 0.0, -0.1], [0.2, -0.2, 0.0]]
    old = [
        [s + d for s, d in zip(sr, dr, strict=True)] for sr, dr in zip(SAMPLER, delta, strict=True)
    ]
    params = dict(anchor="recomputed", clip_low_threshold=0.8, clip_high_threshold=1.2)
    out, grads = _run(make_batch, "icepop", old=old, low=0.8, high=1.5, **params)
    values = [-E(0.2), -E(-0.4), -E(-0.1) * 1.2, 2 * E(0.1), 2 * E(0.3)]
    assert out.loss.item() == pytest.approx(sum(values) / 5, abs=1e-12)
    expected = [-E(0.2), -E(-0.4), 0.0, 2 * E(0.1), 2 * E(0.3)]  # dρ/dℓ = ρ, times k
    assert _flat(grads)[:5] == pytest.approx([g / 5 for g in expected], abs=1e-12)
    assert out.kept_D[0].tolist() == [True, True, False]
    # low = 0.9 drops datum 1's second token (k = 0.819): its value and gradient go to 0
    masked, masked_grads = _run(make_batch, "icepop", old=old, low=0.9, high=1.5, **params)
    assert masked.loss.item() == pytest.approx(sum(values[:4]) / 5, abs=1e-12)
    assert masked_grads[1] == pytest.approx([2 * E(0.1) / 5, 0.0, 0.0], abs=1e-12)
    assert masked.metrics["icepop/mask_fraction"] == pytest.approx(1 / 5)


def test_recomputed_anchor_needs_old_logprobs(make_batch):
    _, batch = _batch(make_batch)
    with pytest.raises(
        ValueError, match='icepop: anchor="recomputed" needs TokenData.old_logprobs_D'
    ):
        get_loss("icepop", anchor="recomputed")(batch)


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("icepop", {"clip_low_threshold": 0.8}, "need anchor='recomputed'"),
        ("icepop", {"low": 6.0}, "low=6.0 must be <= high=5.0"),
        (
            "rollout_correction",
            {"anchor": "recomputed", "surrogate": "logprob"},
            "surrogate='logprob' needs anchor='sampler'",
        ),
    ],
)
def test_correction_rules(name, params, message):
    with pytest.raises(ValueError, match=message):
        get_loss(name, **params)


def test_masked_huge_log_ratio_never_leaks(make_batch):
    # the masked token's Δ = 9 would give a sequence ratio e^{9.6/3} if it were counted
    for name in ("gspo", "luspo", "rollout_correction"):
        out, grads = _run(make_batch, name, **({"level": "sequence"} if name != "gspo" else {}))
        assert math.isfinite(out.loss.item())
        assert grads[1][2] == 0.0


# --- SAPO, GMPO ---


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def test_sapo_soft_gate(make_batch):
    # τ = 1 for A > 0 (datum 0), 1.05 for A < 0 (datum 1). Per token -(4/τ)·σ(τ(r-1))·A,
    # seq-mean-token-mean: (1/2)·[(1/3)·Σ_0 + (1/2)·Σ_1]; gradient -A·4σ(1-σ)·r/(G·n_d).
    out, grads = _run(make_batch, "sapo")
    value, expected, weights = 0.0, [], []
    for r, a, tau, n in zip(
        _flat(R), [1, 1, 1, -2, -2], [1, 1, 1, 1.05, 1.05], [3, 3, 3, 2, 2], strict=True
    ):
        sig = _sigmoid(tau * (r - 1))
        value += -(4 / tau) * sig * a / (2 * n)
        expected.append(-a * 4 * sig * (1 - sig) * r / (2 * n))
        weights.append(4 * sig * (1 - sig))
    assert out.loss.item() == pytest.approx(value, abs=1e-12)
    assert _flat(grads)[:5] == pytest.approx(expected, abs=1e-12)
    assert out.metrics["sapo/gate_weight_mean"] == pytest.approx(sum(weights) / 5, abs=1e-12)
    assert all(k.all() for k in out.kept_D)


def test_gmpo_geometric_mean_clipped_in_log_space(make_batch):
    # log bounds ±0.45. Datum 0 (A > 0): Δ̃ = (0.2, -0.4, min(0.5, 0.45) = 0.45), g_0 =
    # e^{0.25/3}; datum 1 (A < 0): Δ̃ = max(Δ, clip Δ) = (0.1, 0.3), g_1 = e^0.2.
    # L = (1/2)·(-1·g_0 + 2·g_1); dL/dℓ_t = -Ā·g_d/(G·n_d) on unclipped tokens, 0 on the clipped.
    out, grads = _run(make_batch, "gmpo", log_ratio_low=0.45, log_ratio_high=0.45)
    g0, g1 = E(0.25 / 3), E(0.2)
    assert out.loss.item() == pytest.approx(0.5 * (-g0 + 2 * g1), abs=1e-12)
    assert grads[0] == pytest.approx([-g0 / 6, -g0 / 6, 0.0], abs=1e-12)
    assert grads[1] == pytest.approx([g1 / 2, g1 / 2, 0.0], abs=1e-12)
    assert out.kept_D[0].tolist() == [True, True, False]
    assert out.metrics["gmpo/seq_ratio_mean"] == pytest.approx((g0 + g1) / 2, abs=1e-12)


# --- Clip-Cov, KL-Cov, M2PO (batch-scoped) ---

# cov = (A - Ā)(ℓ - ℓ̄) over the 5 loss tokens: Ā = -0.2, ℓ = (-0.8, -2.4, 0.0 | -0.2, -1.2),
# ℓ̄ = -0.92: cov = (0.144, -1.776, 1.104 | -1.296, 0.504).


def test_kl_cov_penalises_the_top_covariance_tokens(make_batch):
    # ratio 0.4: k = ⌊5·0.4⌋ = 2 -> cov 1.104 (datum 0 token 2) and 0.504 (datum 1 token 1)
    # get + |Δ| (0.5 and 0.3). Token-mean; gradient (-A·r + sign(Δ)·selected)/5.
    out, grads = _run(make_batch, "kl_cov", kl_cov_ratio=0.4)
    a = [1.0, 1.0, 1.0, -2.0, -2.0]
    base = [-x * y for x, y in zip(a, _flat(R), strict=True)]
    assert out.loss.item() == pytest.approx((sum(base) + 0.5 + 0.3) / 5, abs=1e-12)
    expected = [b / 5 for b in base]
    expected[2] += 1 / 5
    expected[4] += 1 / 5
    assert _flat(grads)[:5] == pytest.approx(expected, abs=1e-12)
    assert out.metrics["kl_cov/selected_fraction"] == pytest.approx(2 / 5)
    none, _ = _run(make_batch, "kl_cov", kl_cov_ratio=0.0)
    assert none.loss.item() == pytest.approx(sum(base) / 5, abs=1e-12)


def test_clip_cov_zeroes_a_candidate_the_ppo_clip_left(make_batch):
    # bounds 0.8/1.2 clip datum 0's tokens 0 and 2; of the rest only datum 1 token 1 has cov in
    # (0.4, 5): it is the one candidate and k = max(1, ⌊5·0.2⌋) = 1, so it is zeroed.
    out, grads = _run(make_batch, "clip_cov", clip_cov_ratio=0.2, clip_cov_lb=0.4)
    assert out.loss.item() == pytest.approx(sum(PPO_VALUES[:4]) / 5, abs=1e-12)
    assert _flat(grads)[:5] == pytest.approx([g / 5 for g in PPO_GRADS[:4] + [0.0]], abs=1e-12)
    assert out.kept_D[1].tolist() == [True, False, True]
    assert out.metrics["clip_cov/selected_fraction"] == pytest.approx(1 / 5)
    # lb = -2: three candidates (-1.776, -1.296, 0.504), k = ⌊5·0.4⌋ = 2 drawn by the seed
    draws = [
        _run(make_batch, "clip_cov", clip_cov_ratio=0.4, clip_cov_lb=-2.0, seed=s)[0]
        for s in (3, 3)
    ]
    assert draws[0].metrics["clip_cov/selected_fraction"] == pytest.approx(2 / 5)
    assert [k.tolist() for k in draws[0].kept_D] == [k.tolist() for k in draws[1].kept_D]


def test_m2po_masks_until_the_second_moment_fits(make_batch):
    # (log r)² = (0.04, 0.16, 0.25 | 0.01, 0.09), M2 = 0.11. Dropping the largest: 0.075,
    # 0.0467, then 0.025 <= 0.04 after three (Δ = 0.5, -0.4, 0.3). Kept: datum 0 token 0 and
    # datum 1 token 0: L = (-e^0.2 + 2·e^0.1)/5, gradient -A·r/5 there.
    out, grads = _run(make_batch, "m2po")
    assert out.loss.item() == pytest.approx((-E(0.2) + 2 * E(0.1)) / 5, abs=1e-12)
    assert _flat(grads)[:5] == pytest.approx([-E(0.2) / 5, 0, 0, 2 * E(0.1) / 5, 0], abs=1e-12)
    assert out.metrics["m2po/second_moment"] == pytest.approx(0.11, abs=1e-12)
    assert out.metrics["m2po/masked_fraction"] == pytest.approx(3 / 5)
    loose, _ = _run(make_batch, "m2po", tau=0.2)  # M2 = 0.11 <= 0.2: nothing masked
    assert loose.metrics["m2po/masked_fraction"] == 0.0


@pytest.mark.parametrize("name", ["m2po", "kl_cov", "clip_cov"])
def test_batch_scoped_losses_refuse_a_part_of_a_batch(make_batch, name):
    assert LOSSES[name].batch_scope == "batch"
    _, batch = _batch(make_batch)
    loss = get_loss(name)
    assert math.isfinite(loss(batch, num_tokens=5, num_sequences=2).loss.item())  # its own counts
    with pytest.raises(ValueError, match=f"loss '{name}' is batch-scoped .* num_tokens=10 says"):
        loss(batch, num_tokens=10)
    with pytest.raises(ValueError, match="num_sequences=4 says this batch of 2"):
        loss(batch, num_sequences=4)
    assert LOSSES["gspo"].batch_scope == "token"


def test_docs_have_a_section_per_field_loss():
    """docs/losses.md: a `## ...` section naming every loss of losses/field.py in backticks,
    citing its paper (an arXiv id, or for LUSPO / TIS the PR or the blog), and every knob of
    each loss named in backticks somewhere in the page."""
    text = DOCS.read_text(encoding="utf-8")
    sections: dict[str, str] = {}
    for chunk in text.split("\n## ")[1:]:
        heading, _, body = chunk.partition("\n")
        for name in re.findall(r"`([a-z0-9_]+)`", heading):
            sections[name] = body
    field = [n for n, d in LOSSES.items() if d.function.startswith("losslab.losses.field:")]
    assert len(field) == 13
    for name in field:
        assert name in sections, name
        assert re.search(r"arXiv \d{4}\.\d{5}|PR #\d+|fengyao\.notion\.site", sections[name]), name
        for knob in LOSSES[name].params:
            assert f"`{knob}`" in text, (name, knob)


def test_the_framework_configuration_specs_build(make_batch):
    """Every spec in docs/losses.md's framework table parses, resolves and runs (the ones that
    anchor on recomputed log-probs with old log-probs given)."""
    text = DOCS.read_text(encoding="utf-8")
    table = text.split("<!-- specs -->", 1)[1].split("<!-- /specs -->", 1)[0]
    specs = re.findall(r"\| `([a-z0-9_]+\(.*?\))` \|", table)
    assert len(specs) == 24
    lp = [
        [s + d for s, d in zip(sr, dr, strict=True)] for sr, dr in zip(SAMPLER, DELTA, strict=True)
    ]
    _, batch = make_batch(lp, SAMPLER, ADV, mask=MASK, old=SAMPLER)
    for spec in specs:
        assert math.isfinite(parse_loss_spec(spec)(batch).loss.item()), spec
