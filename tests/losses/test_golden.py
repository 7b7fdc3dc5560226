"""Golden outputs of Spindle's losses and Stable-RL's DPPO on 16 ragged sequences (set A, seed 0).

The file ../shared/conformance/tinker_ppo_and_dppo_seed0.json holds real float32 outputs of
the pinned reference code (Spindle @ 88b2e5f3 `_loss`, Stable-RL @ c6af1d11
`compute_policy_loss_with_mask`; reference_losses.md §7). Every output must be reproduced:
loss within 1e-6 x `loss_term_abs_sum_float64`, per-token gradient within 1e-6 x max(1, |g|)
(compared in float64), per-sequence loss, and the clip/mask token counts and fractions.
"""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch

from losslab.losses import TokenData, get_loss

# golden output key -> (our loss, its parameters). Why each mapping holds:
GOLDEN_MAP: dict[str, tuple[str, dict[str, Any]]] = {
    # Tinker/Spindle built-ins at Spindle's defaults (ppo .8/1.2, cispo 0/4, dro β .05).
    "spindle_ppo": ("ppo", {}),
    "spindle_importance_sampling": ("importance_sampling", {}),
    "spindle_cispo": ("cispo", {}),
    "spindle_dro": ("dro", {"beta": 0.05}),
    "spindle_cross_entropy": ("cross_entropy", {}),
    # Spindle `dppo`: one τ both ways, value -r·A·(1-B), no ratio cap, A = 0 never masked.
    "spindle_dppo": (
        "dppo_binary_tv",
        {
            "low": 0.15,
            "high": 0.15,
            "surrogate": "ratio",
            "clip_ratio_c": math.inf,
            "zero_adv": "keep",
        },
    ),
    "spindle_dppo_default_tv0.1": (
        "dppo_binary_tv",
        {
            "low": 0.1,
            "high": 0.1,
            "surrogate": "ratio",
            "clip_ratio_c": math.inf,
            "zero_adv": "keep",
        },
    ),
    # Stable-RL: value -A·sg(min(r, 10))·M·ℓ, A = 0 takes the negative branch (the defaults).
    "stable_rl_dppo_binary_tv": (
        "dppo_binary_tv",
        {"low": 0.15, "high": 0.15, "surrogate": "logprob", "clip_ratio_c": 10.0},
    ),
    "stable_rl_dppo_binary_kl": (
        "dppo_binary_kl",
        {"low": 0.05, "high": 0.05, "surrogate": "logprob", "clip_ratio_c": 10.0},
    ),
    # Stable-RL `ppo` (ε .2/.2 -> absolute bounds .8/1.2) is the PPO mask with the log-prob value.
    "stable_rl_ppo": (
        "ppo",
        {
            "clip_low_threshold": 0.8,
            "clip_high_threshold": 1.2,
            "surrogate": "logprob",
            "clip_ratio_c": 10.0,
            "zero_adv": "negative",
        },
    ),
    # Stable-RL `pg_no_mask`: no mask, value -A·sg(min(r, 10))·ℓ = importance sampling with the
    # log-prob value and a cap of 10 (equivalently cispo(0, 10), checked below).
    "stable_rl_pg_no_mask": ("importance_sampling", {"surrogate": "logprob", "clip_ratio_c": 10.0}),
}


@cache
def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def _batch(
    golden: dict[str, Any], idx: list[int] | None = None
) -> tuple[list[torch.Tensor], TokenData]:
    seqs = [
        golden["sequences"][i]
        for i in (idx if idx is not None else range(len(golden["sequences"])))
    ]
    f64 = torch.float64
    lp_D = [torch.tensor(s["current_logprobs"], dtype=f64, requires_grad=True) for s in seqs]
    mask_D = [torch.tensor(s["loss_mask"], dtype=f64) for s in seqs]
    return lp_D, TokenData(
        logprobs_D=lp_D,
        sampler_logprobs_D=[torch.tensor(s["sampler_logprobs"], dtype=f64) for s in seqs],
        # generator: per-token advantage = A_i · loss_mask
        advantages_D=[s["advantage"] * m for s, m in zip(seqs, mask_D, strict=True)],
        mask_D=mask_D,
    )


def test_golden_covers_every_output(golden_tinker_ppo_dppo: Path) -> None:
    assert set(_load(golden_tinker_ppo_dppo)["outputs"]) == set(GOLDEN_MAP)


@pytest.mark.parametrize("key", list(GOLDEN_MAP))
def test_golden_output(golden_tinker_ppo_dppo: Path, key: str) -> None:
    golden = _load(golden_tinker_ppo_dppo)
    ref = golden["outputs"][key]
    name, params = GOLDEN_MAP[key]
    loss_fn = get_loss(name, **params)
    lp_D, batch = _batch(golden)
    out = loss_fn(batch)
    out.loss.backward()

    scale = ref["float64_check"]["loss_term_abs_sum_float64"]
    assert abs(out.loss.item() - ref["loss"]) <= 1e-6 * scale
    for d, (lp, g_ref) in enumerate(zip(lp_D, ref["grad_current_logprobs"], strict=True)):
        g_ref = torch.tensor(g_ref, dtype=torch.float64)
        err = (lp.grad - g_ref).abs() / g_ref.abs().clamp_min(1.0)
        assert float(err.max()) <= 1e-6, f"datum {d}: gradient error {float(err.max()):.3g}"
    assert out.metrics["loss/tokens"] == ref["token_count"]

    count = ref.get("clipped_token_count", ref.get("masked_token_count"))
    if count is not None:  # ppo/dppo outputs carry clip or mask statistics
        fraction = ref.get("clip_fraction", ref.get("mask_fraction"))
        fraction_nz = ref.get("clip_fraction_nonzero_adv", ref.get("mask_fraction_nonzero_adv"))
        assert out.metrics["loss/masked_count"] == count
        assert out.metrics["loss/clip_fraction"] == pytest.approx(fraction, abs=1e-12)
        assert out.metrics["loss/clip_fraction_nonzero_adv"] == pytest.approx(
            fraction_nz, abs=1e-12
        )
        assert sum(int((~k).sum()) for k in out.kept_D) == count
    native = ref.get("native_metrics", {})
    if "actor/pg_clipfrac" in native:  # Stable-RL's own metric, computed in float32
        assert out.metrics["loss/clip_fraction_nonzero_adv"] == pytest.approx(
            native["actor/pg_clipfrac"], abs=1e-7
        )


@pytest.mark.parametrize("key", list(GOLDEN_MAP))
def test_golden_per_sequence_loss(golden_tinker_ppo_dppo: Path, key: str) -> None:
    """Each sequence alone reproduces its `per_sequence_loss` (sum reduction is per-datum linear)."""
    golden = _load(golden_tinker_ppo_dppo)
    ref = golden["outputs"][key]
    loss_fn = get_loss(GOLDEN_MAP[key][0], **GOLDEN_MAP[key][1])
    scale = ref["float64_check"]["loss_term_abs_sum_float64"]
    for d, expected in enumerate(ref["per_sequence_loss"]):
        _, batch = _batch(golden, [d])
        assert abs(loss_fn(batch).loss.item() - expected) <= 1e-6 * scale, f"sequence {d}"


def test_golden_pg_no_mask_is_cispo_0_10(golden_tinker_ppo_dppo: Path) -> None:
    """cispo(0, 10) has the same value and gradient as Stable-RL pg_no_mask: sg(clip(r, 0, 10))
    = sg(min(r, 10)) because r > 0."""
    golden = _load(golden_tinker_ppo_dppo)
    ref = golden["outputs"]["stable_rl_pg_no_mask"]
    lp_D, batch = _batch(golden)
    out = get_loss("cispo", clip_low_threshold=0.0, clip_high_threshold=10.0)(batch)
    out.loss.backward()
    assert (
        abs(out.loss.item() - ref["loss"])
        <= 1e-6 * ref["float64_check"]["loss_term_abs_sum_float64"]
    )
    for lp, g_ref in zip(lp_D, ref["grad_current_logprobs"], strict=True):
        g_ref = torch.tensor(g_ref, dtype=torch.float64)
        assert float(((lp.grad - g_ref).abs() / g_ref.abs().clamp_min(1.0)).max()) <= 1e-6


def test_golden_float32_inputs(golden_tinker_ppo_dppo: Path) -> None:
    """The references ran in float32; our float32 path agrees with the golden loss to float32
    accuracy (the golden file's own float32-vs-float64 errors are ~1e-7 relative)."""
    golden = _load(golden_tinker_ppo_dppo)
    lp_D, batch = _batch(golden)
    batch32 = TokenData(
        logprobs_D=[x.detach().float().requires_grad_() for x in lp_D],
        sampler_logprobs_D=[x.float() for x in batch.sampler_logprobs_D],
        advantages_D=[x.float() for x in batch.advantages_D],
        mask_D=[x.float() for x in batch.mask_D],
    )
    for key in ("spindle_ppo", "stable_rl_dppo_binary_tv", "stable_rl_dppo_binary_kl"):
        ref = golden["outputs"][key]
        out = get_loss(GOLDEN_MAP[key][0], **GOLDEN_MAP[key][1])(batch32)
        assert out.loss.dtype == torch.float32
        assert (
            abs(out.loss.item() - ref["loss"])
            <= 1e-6 * ref["float64_check"]["loss_term_abs_sum_float64"]
        )
