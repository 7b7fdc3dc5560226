"""Pilot diagnostics: the sampler/trainer gap and its alignment check, mismatch vs drift at the
trust region, duplicate completions and the effective group size, on hand-built cases, the
engine's fakes and the local backend with a tiny random model."""

from __future__ import annotations

from itertools import islice

import pytest
import tinker
import torch

from losslab.backends.local import LocalServiceClient, make_tiny_model_dir
from losslab.engine import (
    ALIGNMENT_ABS_TOL,
    ArmLoop,
    alignment_check,
    build_datum,
    pilot_diagnostics,
    policy_stats,
    train_steps,
)
from losslab.engine import rl as engine_rl
from losslab.plan import GATE_METRICS

from ._fakes import FakeTrainingClient, ppo_clip_loss, tv_mask_loss
from .test_local_backend import DPPO, PPO, EvenLengthTask, make_arm
from .test_rl import AddTask, arm

# prompt [10, 11] + completion [20, 21, 22] with sampler log-probs q = (-1, -2, -3):
# build_datum puts q at the 3 completion targets of the 4 shifted positions (mask 0, 1, 1, 1)
Q = [-1.0, -2.0, -3.0]


def _datum(sampler_logprobs: list[float]) -> tinker.Datum:
    return build_datum([10, 11], [20, 21, 22], sampler_logprobs, 1.0)


def _trainer(offset: float = 0.0) -> list[torch.Tensor]:
    # the trainer's log-probs at the 4 positions (the prompt position is off the loss)
    return [torch.tensor([-9.0] + [q + offset for q in Q])]


def test_gap_and_shifted_gaps_by_hand():
    # aligned, trainer = sampler + 0.01 = (-0.99, -1.99, -2.99): |d| = 0.01 at each token; one
    # position out of step the pairs are (-0.99 vs -2), (-1.99 vs -3) -> 1.01 (+1) and
    # (-1.99 vs -1), (-2.99 vs -2) -> 0.99 (-1); both series are linear, so Pearson is 1
    stats = policy_stats([_datum(Q)], _trainer(0.01))
    assert stats["gap/abs_logprob_mean"] == pytest.approx(0.01, abs=1e-6)
    assert stats["gap/abs_logprob_mean_shift_plus1"] == pytest.approx(1.01, abs=1e-6)
    assert stats["gap/abs_logprob_mean_shift_minus1"] == pytest.approx(0.99, abs=1e-6)
    assert stats["gap/logprob_pearson"] == pytest.approx(1.0, abs=1e-9)


def _mismatch(stats: dict[str, float]) -> dict[str, float]:
    keys = ("abs_logprob_mean", "abs_logprob_mean_shift_minus1", "abs_logprob_mean_shift_plus1")
    return {k: stats[f"gap/{k}"] for k in keys}


def test_alignment_check_fails_on_an_off_by_one():
    aligned = alignment_check(_mismatch(policy_stats([_datum(Q)], _trainer(0.01))))
    assert aligned.passed and aligned.measured == pytest.approx(0.01, abs=1e-6)
    # the sampler's log-probs one position late (q_t at target t+1): at the trained positions
    # |d| = (|-0.99 - 0|, |-1.99 + 1|, |-2.99 + 2|) -> mean 0.99; shifted by +1 the pairs are
    # (-0.99 vs -1), (-1.99 vs -2) -> 0.01: the ratio is 1 one position out of step
    late = _datum([0.0] + Q[:-1])
    shifted = alignment_check(_mismatch(policy_stats([late], _trainer(0.01))))
    assert not shifted.passed
    assert shifted.measured == pytest.approx(0.99, abs=1e-6)
    assert "off-by-one" in shifted.note
    # no gap at all: every ratio is 1, nothing to tell apart
    exact = alignment_check(_mismatch(policy_stats([_datum(Q)], _trainer(0.0))))
    assert exact.passed and exact.measured <= ALIGNMENT_ABS_TOL


def test_duplicate_completions_shrink_the_effective_group():
    """The fake sampler answers every request with the same two completions ("2", "3") cycled
    over num_samples = 4: each group holds 2 distinct sequences, so 2 of its 4 are duplicates
    and the effective group size is 2, below the planned 4."""
    client = FakeTrainingClient(completions=["2", "3"])
    rows = list(train_steps(ArmLoop(client, AddTask(), arm()), 0, 2))
    for row in rows:
        assert row["data/group_size"] == 4.0
        assert row["data/effective_group_size_mean"] == 2.0
        assert row["data/duplicate_completions"] == 2 * 2  # 2 groups x (4 - 2)
        assert row["data/groups_all_identical"] == 0.0
    groups = pilot_diagnostics(rows, {}, group_size=4, update=2)["groups"]
    assert groups["effective_group_size_mean"] == 2.0 < groups["planned_group_size"] == 4
    assert groups["below_plan"] and groups["duplicate_completions"] == 8.0
    # one completion for every sample (tinker-feedback #79): each group is one sequence
    rows = list(train_steps(ArmLoop(FakeTrainingClient(completions=["2"]), AddTask(), arm()), 0, 1))
    assert rows[0]["data/effective_group_size_min"] == 1.0
    assert rows[0]["data/groups_all_identical"] == 2.0


def test_mismatch_vs_drift_names_what_made_the_trust_region_act():
    """TV mask (delta 0.1) and the PPO clip (0.2) on the fake: every sampled token has log q = -1,
    rewards [1, 0, 1, 0] give A = +-0.5 (no A = 0 token), half the loss tokens have A > 0.

    - drift only (mismatch 0, shift 0.3 per optim step): update 1 sees r = 1, nothing acts;
      update 2 sees log r = 0.3: |dp| = e^-0.7 - e^-1 = 0.1287 > 0.1 and r = 1.35 > 1.2, so
      both drop the A > 0 half -> (0, 0.5), "mostly drift";
    - mismatch only (trainer 0.3 above the sampler, no drift): (0.5, 0.5), "mostly mismatch".
    """
    cases = {"drift": dict(shifts=[0.3]), "mismatch": dict(mismatch=0.3, shifts=[0.0])}
    for cause, fake in cases.items():
        client = FakeTrainingClient(**fake)
        config = arm("dppo", tv_mask_loss(0.1), side_losses={"baseline": ppo_clip_loss(0.2)})
        rows = list(islice(train_steps(ArmLoop(client, AddTask(), config), 0, 2), 2))
        diag = pilot_diagnostics(rows, GATE_METRICS, group_size=4, update=2)
        table = {r["metric"]: r for r in diag["trust_region"]}
        first = 0.5 if cause == "mismatch" else 0.0
        for metric in ("dppo_masked_token_fraction", "grpo_clip_fraction"):
            assert table[metric]["mismatch_only"] == pytest.approx(first), (cause, metric)
            assert table[metric]["mismatch_and_drift"] == pytest.approx(0.5), (cause, metric)
            assert table[metric]["acted_because"] == f"mostly {cause}"
        assert table["grpo_clip_fraction"]["key"] == "baseline/loss/clip_fraction_nonzero_adv"
        # the gap before any update is the fake's mismatch, at every token
        assert diag["mismatch"]["abs_logprob_mean"] == pytest.approx(fake.get("mismatch", 0.0))


def test_one_update_per_batch_has_no_drift_column():
    rows = list(
        train_steps(ArmLoop(FakeTrainingClient(), AddTask(), arm(updates_per_batch=1)), 0, 1)
    )
    diag = pilot_diagnostics(rows, GATE_METRICS, group_size=4, update=1)
    for row in diag["trust_region"]:
        assert row["mismatch_and_drift"] is None
        assert row["acted_because"] == "one update per batch: no drift to measure"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("m") / "tiny", "llama", seed=0)


def _shifted_build_datum(prompt_tokens, tokens, sampler_logprobs, advantage):
    """An off-by-one on purpose: each sampler log-prob lands one target late."""
    late = [0.0, *list(sampler_logprobs)[:-1]]
    return build_datum(prompt_tokens, tokens, late, advantage)


def test_alignment_on_the_local_backend_passes_and_catches_a_shift(tiny_dir, monkeypatch):
    """The tiny random model's sampler and trainer agree to float noise (gap ~1e-7, Pearson 1);
    the same pilot with the sampler's log-probs one position late fails the check."""
    service = LocalServiceClient(device="cpu")

    def pilot(steps: int = 1):
        client = service.create_lora_training_client(str(tiny_dir), rank=4, seed=0).result()
        config = make_arm("dppo", DPPO, side_losses={"baseline": _ppo()})
        rows = list(train_steps(ArmLoop(client, EvenLengthTask(), config), 0, steps))
        return rows, pilot_diagnostics(rows, GATE_METRICS, group_size=4, update=2)

    rows, diag = pilot(steps=2)
    m = diag["mismatch"]
    assert m["abs_logprob_max"] < 1e-4 and m["pearson_min"] > 0.999
    assert alignment_check(m).passed
    # DPPO without kl_tau is all policy gradient: its PG norm is the whole loss's, update by
    # update (both |dL/dl| of the same sum-reduced loss)
    norms = [
        (r[f"update{u}/loss/pg_grad_norm"], r[f"update{u}/grad/logprob_norm"])
        for r in rows
        for u in (1, 2)
    ]
    assert [pg for pg, _ in norms] == pytest.approx([total for _, total in norms], rel=1e-9)
    assert max(pg for pg, _ in norms) > 0
    assert diag["grad_norm"]["pg_update1"] == pytest.approx(diag["grad_norm"]["total_update1"])
    monkeypatch.setattr(engine_rl, "build_datum", _shifted_build_datum)
    shifted = alignment_check(pilot()[1]["mismatch"])
    assert not shifted.passed and "off-by-one" in shifted.note


def _ppo():
    from losslab.losses import as_tinker_loss_fn, parse_loss_spec

    return as_tinker_loss_fn(parse_loss_spec(PPO))
