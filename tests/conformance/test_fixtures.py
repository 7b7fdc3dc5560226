"""The fixture generator regenerates the team's golden sequences bit for bit."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from losslab.conformance.fixtures import (
    ExtremeToken,
    Fixture,
    FixtureSpec,
    boundary_margins,
    generate_fixture,
)


def test_regenerates_golden_sequences_bit_for_bit(golden_tinker_ppo_dppo: Path) -> None:
    data = json.loads(golden_tinker_ppo_dppo.read_text())
    spec = FixtureSpec.from_generator_block(data["generator"])
    assert spec == FixtureSpec()  # the default fixture is set A
    ours = generate_fixture(spec)
    theirs = Fixture.from_json_sequences(data["sequences"])
    for a, b in zip(ours.sequences, theirs.sequences, strict=True):
        for key in ("sampler_logprobs", "current_logprobs", "loss_mask"):
            assert np.array_equal(getattr(a, key), getattr(b, key)), key
        assert a.advantage == b.advantage and a.prompt_length == b.prompt_length
    assert ours.sha256() == theirs.sha256()
    # the golden file's own record of threshold margins is reproduced
    margins = boundary_margins(ours)
    for key, value in margins.items():
        assert value == pytest.approx(data["generator"]["boundary_margins_float64"][key], rel=1e-12)


def test_default_fixture_shape_and_staleness() -> None:
    fx = generate_fixture()
    assert len(fx.sequences) == 16
    assert all(40 <= n <= 96 for n in fx.lengths)
    seq5 = fx.sequences[5]
    assert seq5.advantage == 0.0 and not seq5.advantages.any()
    for s in fx.sequences:
        # prompt positions are masked, have sampler 0, and stale current log-probs are <= 0
        assert not s.loss_mask[: s.prompt_length].any() and s.loss_mask[s.prompt_length :].all()
        assert not s.sampler_logprobs[: s.prompt_length].any()
        assert (s.current_logprobs <= 0).all()
    # the GRPO clip (0.8/1.2) and DPPO-TV mask (0.15) fire on a real share of loss tokens
    # (team notes: 30.8% and 18.3% on set A)
    cur = np.concatenate([s.current_logprobs[s.loss_mask > 0] for s in fx.sequences]).astype(float)
    smp = np.concatenate([s.sampler_logprobs[s.loss_mask > 0] for s in fx.sequences]).astype(float)
    adv = np.concatenate([s.advantages[s.loss_mask > 0] for s in fx.sequences])
    r = np.exp(cur - smp)
    clip = ((adv > 0) & (r > 1.2)) | ((adv < 0) & (r < 0.8))
    tv = np.exp(cur) - np.exp(smp)
    mask = np.where(adv > 0, tv > 0.15, tv < -0.15)
    assert clip.mean() == pytest.approx(254 / 824) and mask.mean() == pytest.approx(151 / 824)


def test_canonical_json_is_deterministic_and_seed_sensitive() -> None:
    a, b = generate_fixture(), generate_fixture()
    assert a.canonical_json() == b.canonical_json() and a.sha256() == b.sha256()
    assert generate_fixture(FixtureSpec(seed=1)).sha256() != a.sha256()
    body = json.loads(a.canonical_json())
    assert set(body) == {"sequences"} and len(body["sequences"]) == 16


def test_on_policy_fixture_and_extreme_tokens() -> None:
    fx = generate_fixture(
        FixtureSpec(
            noise_sd=0.0,
            extreme_tokens=(
                ExtremeToken(seq=0, pos=30, current_logprob=-0.5, sampler_logprob=-100.0),
            ),
        )
    )
    s = fx.sequences[0]
    assert s.current_logprobs[30] == np.float32(-0.5) and s.sampler_logprobs[30] == np.float32(-100)
    other = fx.sequences[1]
    resp = other.loss_mask > 0
    assert np.array_equal(other.current_logprobs[resp], other.sampler_logprobs[resp])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_seq": 0}, "n_seq = 0"),
        ({"len_lo": 10, "len_hi": 5}, "len_hi = 5"),
        ({"noise_sd": -1.0}, "noise_sd = -1.0"),
        ({"zero_adv_idx": 16}, "zero_adv_idx = 16"),
        ({"mixture_weights": (0.5, 0.6, 0.1)}, "summing to 1"),
    ],
)
def test_bad_spec_names_the_field(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FixtureSpec(**kwargs)


def test_unknown_generator_key_is_named() -> None:
    with pytest.raises(ValueError, match=r"unknown keys \['n_sequences'\]"):
        FixtureSpec.from_generator_block({"seed": 0, "n_sequences": 3})
