"""The property checks (`losslab.conformance.properties`): each fails on a small loss with the
bug its name says, and every built-in loss passes all of them.

The broken losses are the public bug classes in miniature (docs/properties.md names each
thread); each is otherwise a plain importance-sampling policy gradient −Σ A·r·m, so the check
that fails is the one its bug breaks.
"""

from __future__ import annotations

import pytest
import torch

from losslab.conformance.fixtures import generate_fixture, stress_spec
from losslab.conformance.properties import (
    PROPERTY_CHECKS,
    arms_differ,
    finite_on_stress,
    mask_equals_removal,
    minibatch_invariance,
    on_policy_gradient,
    padding_invariance,
    property_checks,
    reads_anchor_logprobs,
    run_properties,
)
from losslab.losses import LOSS_NAMES, LossFn, get_loss
from losslab.losses.data import pack
from losslab.losses.policy import LossOutput

SET_A = generate_fixture()
STRESS = generate_fixture(stress_spec())


def _output(loss: torch.Tensor, batch) -> LossOutput:
    return LossOutput(
        loss=loss,
        metrics={},
        kept_D=[torch.ones_like(x, dtype=torch.bool) for x in batch.logprobs_D],
    )


def _broken(per_token, reduction: str = "sum") -> LossFn:
    """A LossFn around `per_token(batch, num_tokens, num_sequences) -> 0-d loss`, declaring
    `reduction`; named importance_sampling, so it reads policy inputs like the real one."""

    def fn(batch, *, num_tokens=None, num_sequences=None, **params):
        return _output(per_token(batch, num_tokens, num_sequences), batch)

    params = {"reduction": reduction, "norm_constant": None}
    return LossFn(name="importance_sampling", params=params, fn=fn)


def _pg_T(t) -> torch.Tensor:
    """−A·r·m per token, r against the sampler (the correct importance-sampling surrogate)."""
    return -t.advantages_T * torch.exp(t.logprobs_T - t.sampler_logprobs_T) * t.mask_T


def _micro_batch_token_mean(batch, num_tokens, num_sequences):
    # SkyRL #925/#1296: each micro-batch divides by its OWN token count, ignoring the global one
    t = pack(batch)
    return _pg_T(t).sum() / t.loss_T.sum().clamp_min(1)


def _length_normalised(batch, num_tokens, num_sequences):
    # per-sequence mean over the datum's padded LENGTH, not its loss tokens
    t = pack(batch)
    per_seq = torch.zeros(t.num_datums, dtype=t.logprobs_T.dtype).index_add(0, t.seq_T, _pg_T(t))
    lengths = torch.tensor(t.lengths_D, dtype=t.logprobs_T.dtype)
    return (per_seq / lengths).sum() / t.num_datums


def _rejected_in_denominator(batch, num_tokens, num_sequences):
    # slime #657: the denominator counts every response token (sampler log-prob != 0), also the
    # ones the mask rejected
    t = pack(batch)
    response = torch.cat([s != 0 for s in batch.sampler_logprobs_D])
    return _pg_T(t).sum() / response.sum().clamp_min(1)


def _unclamped_sequence_mean(batch, num_tokens, num_sequences):
    # Σ_t L / n_d with n_d = 0 for a fully masked datum: 0/0
    t = pack(batch)
    dtype = t.logprobs_T.dtype
    per_seq = torch.zeros(t.num_datums, dtype=dtype).index_add(0, t.seq_T, _pg_T(t))
    n_D = torch.zeros(t.num_datums, dtype=dtype).index_add(0, t.seq_T, t.mask_T)
    return (per_seq / n_D).mean()


def _ratio_stuck_at_one(batch, num_tokens, num_sequences):
    # mlx-lm-lora #50: the ratio is a detached 1, so only the KL term has a gradient
    t = pack(batch)
    ratio_T = torch.exp(t.logprobs_T - t.sampler_logprobs_T).detach()
    kl_T = 0.5 * (t.logprobs_T - t.sampler_logprobs_T) ** 2
    return ((-t.advantages_T * ratio_T + 0.01 * kl_T) * t.mask_T).sum()


def _per_sequence_declared_per_token(batch, num_tokens, num_sequences):
    # prime-rl #2034: declared token-mean, computed as a mean of per-sequence means
    t = pack(batch)
    dtype = t.logprobs_T.dtype
    per_seq = torch.zeros(t.num_datums, dtype=dtype).index_add(0, t.seq_T, _pg_T(t))
    n_D = torch.zeros(t.num_datums, dtype=dtype).index_add(0, t.seq_T, t.mask_T)
    return (per_seq / n_D.clamp_min(1)).sum() / (n_D > 0).sum()


def _ratio_against_itself(batch, num_tokens, num_sequences):
    # AReaL #201: the "old" log-probs are recomputed from the current policy, so r = 1 always
    t = pack(batch)
    ratio_T = torch.exp(t.logprobs_T - t.logprobs_T.detach())
    return (-t.advantages_T * ratio_T * t.mask_T).sum()


def test_split_minibatches_catch_a_micro_batch_token_mean():
    result = minibatch_invariance(_broken(_micro_batch_token_mean, "token-mean"), SET_A)
    assert not result.passed
    assert "4 minibatches" in result.note and "'token-mean'" in result.note
    assert minibatch_invariance(get_loss("ppo", reduction="token-mean"), SET_A).passed


def test_padding_catches_length_normalisation():
    result = padding_invariance(_broken(_length_normalised, "seq-mean-token-mean"), SET_A)
    assert not result.passed and "masked tokens per datum changed the loss" in result.note
    assert padding_invariance(get_loss("ppo", reduction="seq-mean-token-mean"), SET_A).passed


def test_masking_equals_removal_catches_rejected_tokens_in_the_denominator():
    broken = _broken(_rejected_in_denominator, "token-mean")
    result = mask_equals_removal(broken, SET_A)
    assert not result.passed and "masked token still counts" in result.note
    # the built-in token mean counts only loss tokens
    assert mask_equals_removal(get_loss("ppo", reduction="token-mean"), SET_A).passed


def test_a_gradient_on_a_masked_token_fails_even_when_values_agree():
    def leaks(batch, num_tokens, num_sequences):
        # value unchanged, gradient 1e-3 on every token: the masked ones too
        raw_T = torch.cat(batch.logprobs_D)
        return _pg_T(pack(batch)).sum() + 1e-3 * (raw_T - raw_T.detach()).sum()

    result = mask_equals_removal(_broken(leaks), SET_A)
    assert not result.passed and result.note == "a masked token received a gradient"
    assert result.measured["masked_gradient_max_abs"] == pytest.approx(1e-3)


def test_stress_catches_an_unclamped_per_sequence_mean():
    result = finite_on_stress(_broken(_unclamped_sequence_mean, "seq-mean-token-mean"), STRESS)
    # 0/0 on the stress fixture's fully masked sequence: the value is NaN
    assert not result.passed and result.note.startswith("value nan")
    assert finite_on_stress(
        get_loss("dppo_binary_tv", reduction="seq-mean-token-mean"), STRESS
    ).passed


def test_ratio_one_catches_a_loss_that_does_nothing():
    result = on_policy_gradient(_broken(_ratio_stuck_at_one), SET_A)
    assert not result.passed
    assert "max |gradient| / max |−A·m·w| = 0" in result.note  # no policy gradient at all


def test_ratio_one_catches_per_sequence_normalisation_declared_per_token():
    result = on_policy_gradient(_broken(_per_sequence_declared_per_token, "token-mean"), SET_A)
    assert not result.passed and "'token-mean'" in result.note
    # declared honestly, the same computation passes
    honest = _broken(_per_sequence_declared_per_token, "seq-mean-token-mean")
    assert on_policy_gradient(honest, SET_A).passed


def test_moving_the_anchor_catches_a_ratio_against_the_current_policy():
    broken = _broken(_ratio_against_itself)
    assert on_policy_gradient(broken, SET_A).passed  # at p = q it looks right
    result = reads_anchor_logprobs(broken, SET_A)
    assert result is not None and not result.passed
    assert result.measured["relative_gradient_change"] == 0.0
    assert reads_anchor_logprobs(get_loss("cross_entropy"), SET_A) is None  # reads no anchor


def test_arms_differ_catches_a_treatment_that_is_the_baseline():
    # trl #7271: the "GMPO" arm silently ran the GRPO loss
    grpo = get_loss("ppo")
    silently_grpo = LossFn(name="dppo_binary_tv", params=dict(grpo.params), fn=grpo.fn)
    result = arms_differ(grpo, silently_grpo, SET_A)
    assert not result.passed and result.measured["relative_gradient_difference"] == 0.0
    assert arms_differ(grpo, get_loss("dppo_binary_tv"), SET_A).passed


def test_a_loss_that_raises_fails_its_properties_with_the_error():
    def refuses(batch, num_tokens, num_sequences):
        raise ValueError("needs old_logprobs")

    results = property_checks(_broken(refuses), SET_A, STRESS)
    assert results and all(
        not r.passed and "needs old_logprobs" in r.note for r in results.values()
    )


BUILT_INS = [
    *((name, {}) for name in LOSS_NAMES),
    *((name, {"reduction": r}) for name in ("ppo", "dppo_binary_tv") for r in (
        "token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"
    )),
    ("seq_norm", {"reduction": "seq-mean-token-sum-norm", "norm_constant": 200.0}),
    ("dppo_binary_kl", {"anchor": "recomputed", "weight_anchor": "recomputed", "log_ratio_guard": "both"}),
    ("dppo_binary_tv", {"kl_tau": 1e-3, "surrogate": "logprob", "clip_ratio_c": float("inf")}),
    ("ppo", {"surrogate": "logprob", "clip_ratio_c": 10.0}),
    ("cispo", {"clip_low": 0.8, "clip_high": 1.2}),
]  # fmt: skip


@pytest.mark.parametrize(("name", "params"), BUILT_INS, ids=lambda x: str(x))
def test_every_built_in_loss_passes_every_property(name, params):
    name = "dppo_binary_tv" if name == "seq_norm" else name
    results = property_checks(get_loss(name, **params), SET_A, STRESS)
    assert {k: r.note for k, r in results.items() if not r.passed} == {}
    assert len(results) == (5 if name == "cross_entropy" else 6)


def test_plan_report_names_arms_and_passes():
    losses = {"grpo": get_loss("ppo"), "dppo": get_loss("dppo_binary_tv")}
    report = run_properties(losses, {"baseline": "grpo", "treatment": "dppo"})
    assert report["passed"] and set(report["arms"]) == {"grpo", "dppo"}
    assert report["plan"]["arms_differ"]["passed"]
    assert report["fixture_sha256"] == SET_A.sha256()


def test_the_preflight_phase_runs_the_properties_on_the_arms_own_loss_objects():
    """The phase checks the objects the arms train; without pinned paths it checks them alone."""
    from pathlib import Path

    from losslab.conformance.arm_losses import arm_losses
    from losslab.conformance.preflight import preflight_phase
    from losslab.plan import load_plan

    plan = load_plan(Path(__file__).resolve().parents[2] / "examples" / "gsm8k_dppo_vs_grpo.json")
    plan = plan.model_copy(update={"correctness_preflight": None})
    losses = arm_losses(plan)
    treatment = plan.arm_roles()["treatment"]
    grpo = losses[plan.arm_roles()["baseline"]]
    # the treatment silently the baseline (trl #7271), as the runner would hand it over
    losses[treatment] = LossFn(name="dppo_binary_tv", params=dict(grpo.params), fn=grpo.fn)
    result = preflight_phase(plan, losses)
    assert result.applicable and result.first_failure is not None
    assert result.first_failure.name == "properties.arms_differ"
    names = [c.name for c in result.checks]
    assert names[:6] == [f"properties.{plan.arms[0].name}.{n}" for n in PROPERTY_CHECKS]
    assert result.record()["properties"]["plan"]["arms_differ"]["passed"] is False


# --- declared exceptions to the on-policy and minibatch rules (losses/declarations.py) ---------


class _Declared:
    """`loss` with a declaration whose flags are overridden: the checks read only these."""

    def __init__(self, loss: LossFn, **flags) -> None:
        self._loss, self.params = loss, loss.params
        self.declaration = type("Declaration", (), {"reduction": "sum", **flags})()

    def __call__(self, batch, **counts):
        return self._loss(batch, **counts)


def _scaled_pg(scale: float):
    return _broken(lambda batch, nt, ns: scale * _pg_T(pack(batch)).sum())


def test_a_declared_constant_normaliser_allows_one_positive_factor_and_reports_it():
    # Dr. GRPO divides by its own C: −A·m·w / C passes with C measured (here 1/256 = TRL's
    # default max_completion_length), a sign flip or a zero gradient still fails
    result = on_policy_gradient(_Declared(_scaled_pg(1 / 256), constant_normaliser=True), SET_A)
    assert result.passed and result.measured["constant_factor"] == pytest.approx(1 / 256)
    flipped = on_policy_gradient(_Declared(_scaled_pg(-1 / 256), constant_normaliser=True), SET_A)
    assert not flipped.passed
    nothing = on_policy_gradient(_Declared(_scaled_pg(0.0), constant_normaliser=True), SET_A)
    assert not nothing.passed
    assert not on_policy_gradient(_Declared(_scaled_pg(1 / 256)), SET_A).passed  # undeclared


def test_declared_detached_tokens_are_judged_on_the_kept_ones_and_capped_at_half():
    def detach_first(fraction: float):
        def per_token(batch, nt, ns):
            t = pack(batch)
            cut = torch.arange(len(t.mask_T)) < int(fraction * len(t.mask_T))
            lp = torch.where(cut, t.logprobs_T.detach(), t.logprobs_T)
            return (-t.advantages_T * torch.exp(lp - t.sampler_logprobs_T) * t.mask_T).sum()

        return _Declared(_broken(per_token), detaches_tokens=True)

    few = on_policy_gradient(detach_first(0.05), SET_A)
    assert few.passed and few.measured["detached_tokens"] > 0
    assert not on_policy_gradient(detach_first(0.9), SET_A).passed  # the loss did almost nothing


def test_a_batch_scoped_loss_must_refuse_a_minibatch():
    def refuses(batch, nt, ns):
        t = pack(batch)
        if nt is not None and nt > float(t.mask_T.sum()):
            raise ValueError("batch-scoped: called on a part of its batch")
        return _pg_T(t).sum()

    assert minibatch_invariance(_Declared(_broken(refuses), batch_scope="batch"), SET_A).passed
    silent = _Declared(_broken(lambda b, nt, ns: _pg_T(pack(b)).sum()), batch_scope="batch")
    assert not minibatch_invariance(silent, SET_A).passed
