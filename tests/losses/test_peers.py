"""Peers' published loss values, re-derived (peers.md §2) and run through our losses.

Spindle: modal-projects/spindle tests/backends/test_forward_backward.py
(`test_importance_sampling_loss_and_gradient`, `test_rl_loss_matches_tinker_formula`).
Its RL cases use sampler log-probs 0 on every token and Spindle's default loss mask
(A != 0 or sampler != 0), which is 1 on every token there since every A is non-zero; the IS case
has A = 0 and sampler 0 at position 0, so that position is masked. Inputs were read from that
file; peers.md §2 gives them in short form.
SkyRL: NovaSky-AI/SkyRL tests/train/algorithms/test_losses.py (dual-clip case, peers.md §2).
"""

from __future__ import annotations

import math

import pytest
import torch

from losslab.losses import get_loss


def test_spindle_importance_sampling_value_and_gradient(make_batch):
    # sampler (0, -.7, -.3), A (0, 1, -1), current (0, -.5, -.2); mask (0, 1, 1) (Spindle default).
    # r = (e^0.2, e^0.1) on the loss tokens; L = -(e^0.2·1 + e^0.1·(-1)) = -(e^0.2 - e^0.1)
    # = -0.11623; dL/dℓ = -A·r = (0, -e^0.2, +e^0.1) = (0, -1.22140, 1.10517).
    lp, batch = make_batch([[0.0, -0.5, -0.2]], [[0.0, -0.7, -0.3]], [[0, 1, -1]], [[0, 1, 1]])
    out = get_loss("importance_sampling")(batch)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(-(math.exp(0.2) - math.exp(0.1)), abs=1e-12)
    assert out.loss.item() == pytest.approx(-0.11623, abs=5e-6)  # Spindle's rounded figure
    expected = [0.0, -math.exp(0.2), math.exp(0.1)]
    assert lp[0].grad.tolist() == pytest.approx(expected, abs=1e-12)
    assert lp[0].grad.tolist() == pytest.approx([0.0, -1.22140, 1.10517], abs=5e-6)
    assert out.metrics["loss/tokens"] == 2  # Spindle's token_count


def test_spindle_ppo_is_minus_0_6(make_batch):
    # r = (2, .5, 1.1, .9), A = (1, -1, 1, -1), clip .8/1.2:
    # min(rA, clip(r)A) = (min(2, 1.2), min(-.5, -.8), 1.1, -.9) = (1.2, -.8, 1.1, -.9);
    # sum 0.6, loss -0.6. Clipped tokens: 0 (A > 0, r > 1.2) and 1 (A < 0, r < .8).
    logp = [math.log(2.0), math.log(0.5), math.log(1.1), math.log(0.9)]
    lp, batch = make_batch([logp], [[0.0] * 4], [[1, -1, 1, -1]])
    out = get_loss("ppo")(batch)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(-0.6, abs=1e-12)
    assert out.kept_D[0].tolist() == [False, False, True, True]
    assert out.metrics["loss/masked_count"] == 2
    # gradient -A·r on kept tokens, 0 on clipped ones: (0, 0, -1.1, 0.9)
    assert lp[0].grad.tolist() == pytest.approx([0.0, 0.0, -1.1, 0.9], abs=1e-12)


def test_spindle_cispo_is_minus_1_38629(make_batch):
    # clip .8/1.2, r = (2, .5), A = (1, -1): L = -(1.2·ln2·1 + .8·ln(.5)·(-1))
    # = -(1.2 + .8)·ln 2 = -2 ln 2 = -1.38629.
    lp, batch = make_batch([[math.log(2.0), math.log(0.5)]], [[0.0, 0.0]], [[1, -1]])
    out = get_loss("cispo", clip_low_threshold=0.8, clip_high_threshold=1.2)(batch)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(-(1.2 * math.log(2.0) - 0.8 * math.log(0.5)), abs=1e-12)
    assert out.loss.item() == pytest.approx(-1.38629, abs=5e-6)
    # gradient -sg(clip(r))·A = (-1.2, 0.8): the clipped weight is detached
    assert lp[0].grad.tolist() == pytest.approx([-1.2, 0.8], abs=1e-12)
    assert out.metrics["cispo/clip_fraction"] == 1.0  # both ratios are outside [.8, 1.2]


def test_spindle_dro_is_minus_0_392(make_batch):
    # β = .2, ℓ = (.2, -.2), ℓ_s = 0, A = (1, -1):
    # J = ℓA - ½β(ℓ - ℓ_s)² = (.2 - .004, .2 - .004); L = -Σ J = -0.392.
    lp, batch = make_batch([[0.2, -0.2]], [[0.0, 0.0]], [[1, -1]])
    out = get_loss("dro", beta=0.2)(batch)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(-0.392, abs=1e-12)
    # dL/dℓ = -(A - β(ℓ - ℓ_s)) = (-(1 - .04), -(-1 + .04)) = (-0.96, 0.96)
    assert lp[0].grad.tolist() == pytest.approx([-0.96, 0.96], abs=1e-12)


def test_spindle_dppo_tv_0_1_is_0_9(make_batch):
    # sampler probs 1 (ℓ_s = 0); r = p = (.5, 1.5, 1.05, .95, .5, 1.5); A = (1, 1, 1, -1, -1, -1).
    # τ = .1: masked = token 1 (A > 0, p - p_s = .5 > .1) and token 4 (A < 0, p - p_s = -.5 < -.1).
    # L = -Σ r·A·M = -(.5 + 0 + 1.05 - .95 - 0 - 1.5) = 0.9. All r < 10, so the cap is inactive.
    logp = [math.log(x) for x in (0.5, 1.5, 1.05, 0.95, 0.5, 1.5)]
    lp, batch = make_batch([logp], [[0.0] * 6], [[1, 1, 1, -1, -1, -1]])
    loss_fn = get_loss("dppo_binary_tv", low=0.1, high=0.1, surrogate="ratio")
    out = loss_fn(batch)
    assert out.loss.item() == pytest.approx(0.9, abs=1e-12)
    assert out.kept_D[0].tolist() == [True, False, True, True, False, True]
    uncapped = get_loss("dppo_binary_tv", low=0.1, high=0.1, clip_ratio_c=math.inf)(batch)
    assert uncapped.loss.item() == pytest.approx(0.9, abs=1e-12)  # Spindle has no cap


def test_skyrl_dual_clip_value_coincides_but_gradient_does_not(make_batch):
    """SkyRL's dual-clip case: A (1, -1, -4), old (-1, -1, -3), new (-1.69315, -1, -0.69741),
    ε .2, c 3 -> per-token (-0.5, 1, 12), sum 12.5.

    Our conventions have no dual clip (Tinker's ppo has none; Stable-RL's c is an importance-
    weight cap, reference_losses.md §3.2). ppo(surrogate="ratio", clip_ratio_c=3) gives the same
    VALUE here, because for A < 0 and r > c both forms give -A·c; but dual clip makes that token
    a constant (gradient 0) while truncated IS keeps the gradient -A·c = 12. So the 12.5 value is
    reproduced and the gradient difference is pinned, not hidden.
    """
    new = [-1.69315, -1.0, -0.69741]
    lp, batch = make_batch([new], [[-1.0, -1.0, -3.0]], [[1, -1, -4]])
    out = get_loss("ppo", surrogate="ratio", clip_ratio_c=3.0)(batch)
    out.loss.backward()
    # r = (e^-0.69315, 1, e^2.30259) = (0.5, 1, 10): values -A·min(r, 3) = (-0.5, 1, 12)
    assert out.loss.item() == pytest.approx(12.5, abs=1e-4)
    # gradient -A·min(r, c): (-0.5, 1, 12); SkyRL's dual-clip gradient would be (-0.5, 1, 0)
    assert lp[0].grad.tolist() == pytest.approx([-0.5, 1.0, 12.0], abs=1e-4)


def test_spindle_cross_entropy_weights_scale_tokens(make_batch):
    # Spindle `test_cross_entropy_loss_is_unchanged`: weights (1, .5), ℓ (-.2, -.4):
    # L = -(1·(-.2) + .5·(-.4)) = 0.4
    lp, batch = make_batch([[-0.2, -0.4]], [[0.0, 0.0]], [[0.0, 0.0]], [[1.0, 0.5]])
    out = get_loss("cross_entropy")(batch)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(0.4, abs=1e-12)
    assert lp[0].grad.tolist() == pytest.approx([-1.0, -0.5], abs=1e-12)
    assert out.metrics["loss/tokens"] == 2  # count_nonzero of the weights, as Spindle
    torch.testing.assert_close(out.kept_D[0], torch.tensor([True, True]))
