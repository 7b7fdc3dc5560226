"""Every knob of the field's losses (losses/field.py) changes what the loss computes: on one
stress batch, moving any knob from its base value changes the value, a gradient, the keep mask
or a metric. A knob that changes nothing would let a framework configuration match for the
wrong reason (the atlas's "mutating a knob breaks its row" rests on this).

The batch: five datums; per-token advantages that vary within a sequence (GSPO's levels),
A = 0 tokens below every low bound (`zero_adv`), a ratio between two low bounds, ratios up to
e^26 and a sequence whose mean log-ratio is 22 (GSPO's guards at 10 and 20), recomputed
log-probs a little off the sampler's (the "recomputed" pair). Each row says what it is for.
"""

from __future__ import annotations

import math

import pytest
import torch

from losslab.losses import LOSSES, TokenData, get_loss

SAMPLER = [[-1.0, -0.5, -2.0, -1.2], [-0.3, -1.5, -0.7, -0.9], [-30.0] * 5, [-1.0] * 2, [-1.0] * 2]
DELTA = [
    [0.3, -0.6, 1.2, -0.5],  # A = 0 with r = 0.61 < every low bound
    [-0.3, 0.4, 1.5, -0.5],  # A < 0 with r = 0.74 (between lows 0.7 and 0.8), Δ = -0.5 (GMPO)
    [25.0, 24.0, 26.0, 25.0, 10.0],  # mean log-ratio 22: above verl's 10 and losslab's 20
    [-0.1, -0.2],  # GSPO s = 0.86, between 1 - 0.2 and 1 - 0.05, A < 0
    [-0.4, -0.4],  # GSPO s = 0.67 < 0.8 with A = 0 (zero_adv)
]
ADV = [[1.0, 0.5, 2.0, 0.0], [-1.0, -1.5, -0.5, -1.0], [-1.0] * 5, [-1.0, -0.5], [0.0, 0.0]]
OLD_SHIFT = [
    [0.1, -0.1, 0.2, 0.0],
    [0.05, -0.2, 0.1, 0.0],
    [0.3, -0.3, 0.0, 0.1, -0.1],
    [0.1, 0.0],
    [0.0, 0.1],
]

RECOMPUTED = {"anchor": "recomputed", "clip_low_threshold": 0.8, "clip_high_threshold": 1.2}

# (loss, base knobs, [mutations]): each mutation is applied on top of the base
CASES = [
    (
        "gspo",
        {"epsilon_low": 0.2, "epsilon_high": 0.2},
        [
            {"level": "token"},
            {"epsilon_low": 0.05},
            {"epsilon_high": 0.05},
            {"log_ratio_guard": "verl"},
            {"log_ratio_guard": "none"},
            {"zero_adv": "negative"},
            {"reduction": "token-mean"},
        ],
    ),
    (
        "luspo",
        {"epsilon_low": 0.2, "epsilon_high": 0.2},
        [
            {"level": "token"},
            {"epsilon_low": 0.05},
            {"epsilon_high": 0.05},
            {"log_ratio_guard": "verl"},
            {"zero_adv": "negative"},
        ],
    ),
    (
        "cispo_eps",
        {},
        [{"epsilon_meaning": "one_plus_eps"}, {"epsilon_high": 2.0}],
    ),
    ("cispo_eps", {"epsilon_meaning": "one_plus_eps"}, [{"epsilon_low": 0.2}]),
    (
        "dr_grpo",
        {},
        [
            {"clip_low_threshold": 0.7},
            {"clip_high_threshold": 1.3},
            {"constant": "max_seq_len", "max_prompt_length": 100.0},
            {"constant": "padded_width"},
            {"max_completion_length": 100.0},
            {"zero_adv": "negative"},
        ],
    ),
    ("dr_grpo", {"constant": "max_seq_len"}, [{"max_prompt_length": 100.0}]),
    (
        "dapo",
        {},
        [{"clip_low_threshold": 0.7}, {"clip_high_threshold": 1.5}, {"zero_adv": "negative"}],
    ),
    (
        "dual_clip_ppo",
        {},
        [
            {"clip_ratio_c": 2.0},
            {"clip_low_threshold": 0.7},
            {"clip_high_threshold": 1.3},
            {"zero_adv": "negative"},
        ],
    ),
    ("icepop", {}, [{"low": 0.9}, {"high": 2.0}, {"surrogate": "logprob"}, RECOMPUTED]),
    (
        "icepop",
        RECOMPUTED,
        [{"clip_low_threshold": 0.7}, {"clip_high_threshold": 1.5}, {"zero_adv": "negative"}],
    ),
    (
        "rollout_correction",
        {},
        [
            {"level": "sequence"},
            {"mode": "mask"},
            {"cap": 1.5},
            {"lower": 0.8},
            {"surrogate": "logprob"},
            RECOMPUTED,
        ],
    ),
    ("rollout_correction", {"mode": "mask"}, [{"lower": 0.8}]),
    (
        "rollout_correction",
        RECOMPUTED,
        [{"clip_low_threshold": 0.7}, {"clip_high_threshold": 1.5}, {"zero_adv": "negative"}],
    ),
    ("sapo", {}, [{"tau_pos": 2.0}, {"tau_neg": 2.0}]),
    (
        "gmpo",
        {},
        [
            {"log_ratio_low": 0.8},
            {"log_ratio_high": 0.8},
            {"log_ratio_guard": "none"},
            {"zero_adv": "negative"},
        ],
    ),
    ("kl_cov", {}, [{"kl_cov_ratio": 0.5}, {"kl_coef": 2.0}, {"log_ratio_guard": "none"}]),
    (
        "clip_cov",
        {"clip_cov_ratio": 0.25, "clip_cov_lb": -5.0},
        [
            {"clip_cov_ratio": 0.5},
            {"clip_cov_lb": 0.0},
            {"clip_cov_ub": 0.0},
            {"seed": 1.0},
            {"log_ratio_guard": "none"},
            {"clip_low_threshold": 0.7},
            {"clip_high_threshold": 1.5},
            {"zero_adv": "negative"},
        ],
    ),
    ("m2po", {}, [{"tau": 1.0}]),
]


def _batch() -> tuple[list[torch.Tensor], TokenData]:
    f64 = lambda rows: [torch.tensor(r, dtype=torch.float64) for r in rows]  # noqa: E731
    lp = [
        torch.tensor([s + d for s, d in zip(sr, dr, strict=True)], dtype=torch.float64)
        for sr, dr in zip(SAMPLER, DELTA, strict=True)
    ]
    for x in lp:
        x.requires_grad_(True)
    old = [
        [s + o for s, o in zip(sr, orow, strict=True)]
        for sr, orow in zip(SAMPLER, OLD_SHIFT, strict=True)
    ]
    mask = [[1.0] * len(r) for r in SAMPLER]
    return lp, TokenData(lp, f64(SAMPLER), f64(ADV), f64(mask), f64(old))


def _signature(name: str, params: dict) -> tuple:
    """(value, gradients, keep masks, metrics), NaN-safe, rounded to 12 significant digits."""
    lp, batch = _batch()
    out = get_loss(name, **params)(batch)
    out.loss.backward()

    def r(x: float) -> float | str:
        return "nan" if math.isnan(x) else float(f"{x:.12g}")

    grads = tuple(r(g) for x in lp for g in x.grad.tolist())
    kept = tuple(tuple(k.tolist()) for k in out.kept_D)
    return r(out.loss.item()), grads, kept, tuple(sorted((k, r(v)) for k, v in out.metrics.items()))


@pytest.mark.parametrize(
    ("name", "base", "mutation"),
    [(n, b, m) for n, b, ms in CASES for m in ms],
    ids=[f"{n}-{'-'.join(f'{k}={v}' for k, v in m.items())}" for n, _, ms in CASES for m in ms],
)
def test_every_knob_changes_the_loss(name: str, base: dict, mutation: dict) -> None:
    assert _signature(name, base) != _signature(name, {**base, **mutation})


def test_the_cases_cover_every_knob_of_every_field_loss() -> None:
    field = [n for n, d in LOSSES.items() if d.function.startswith("losslab.losses.field:")]
    for name in field:
        moved = {k for n, _, ms in CASES if n == name for m in ms for k in m}
        own = set(LOSSES[name].params) - {"reduction", "norm_constant"}
        assert own <= moved, (name, own - moved)
