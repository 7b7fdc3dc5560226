"""The stress fixture separates the DPPO conventions; set A cannot (team notes §2.2).

Mutations of the plan's treatment loss: a missing cap (c = inf), a wrong anchor, a wrong
threshold and a sign error must each fail the preflight, and the classifier names the change
that would make the check pass.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from losslab.conformance.classify import _Negated
from losslab.conformance.fixtures import STRESS_PAIRS, generate_fixture, stress_spec
from losslab.conformance.preflight import Implementation, plan_implementations, run_preflight
from losslab.losses import get_loss
from losslab.plan import load_plan

PLAN = Path(__file__).resolve().parents[2] / "examples" / "gsm8k_dppo_vs_grpo.json"


def test_stress_fixture_has_every_separating_case() -> None:
    fx = generate_fixture(stress_spec())
    set_a = generate_fixture()
    assert fx.sequences[0].advantage > 0 > fx.sequences[1].advantage
    log_r = np.concatenate(
        [(s.current_logprobs - s.sampler_logprobs)[s.loss_mask > 0] for s in fx.sequences]
    )
    assert (np.exp(log_r) > 10).sum() >= 4  # r > c = 10
    assert (np.abs(log_r) > 20).sum() == 6  # +22, -22, +20.5 in two sequences
    assert fx.sequences[7].loss_mask.sum() == 0  # fully masked
    assert fx.sequences[5].advantage == 0  # zero-advantage group
    old = np.concatenate([s.old_logprobs[s.loss_mask > 0] for s in fx.sequences])
    smp = np.concatenate([s.sampler_logprobs[s.loss_mask > 0] for s in fx.sequences])
    assert np.std(old - smp) == pytest.approx(0.3, rel=0.1)  # old = sampler + N(0, 0.3)
    # the injected pairs sit where stress_spec puts them
    for k, (sampler, current) in enumerate(STRESS_PAIRS):
        assert fx.sequences[1].sampler_logprobs[19 + k] == np.float32(sampler)
        assert fx.sequences[1].current_logprobs[19 + k] == np.float32(current)
    # set A itself is unchanged (the golden file's sha is checked in test_fixtures)
    assert set_a.sequences[0].old_logprobs is None


@pytest.fixture(scope="module")
def treatment() -> Implementation:
    plan = load_plan(PLAN)
    return plan_implementations(plan, plan.correctness_preflight.paths[0])["treatment"]


def _run(treatment: Implementation, loss_fn, value_fn) -> dict:
    plan = load_plan(PLAN)
    base = plan_implementations(plan, plan.correctness_preflight.paths[0])["baseline"]
    rep = run_preflight(
        PLAN,
        implementations={"baseline": base, "treatment": Implementation(loss_fn, value_fn, "m")},
        allow_rederivation=True,
    )
    return rep


def _mutated(treatment: Implementation, **change):
    fn, vfn = treatment.loss_fn, treatment.value_fn
    return get_loss(fn.name, **{**fn.params, **change}), get_loss(
        vfn.name, **{**vfn.params, **change}
    )


def test_the_plans_treatment_passes_on_both_fixtures(treatment: Implementation) -> None:
    rep = _run(treatment, treatment.loss_fn, treatment.value_fn)
    assert rep["passed"] and rep["paths"][0]["stress"]["passed"]


@pytest.mark.parametrize(
    ("change", "set_a_blind", "fix"),
    [
        ({"clip_ratio_c": math.inf}, True, "clip_ratio_c = 10.0"),
        ({"anchor": "recomputed"}, True, "anchor = sampler"),
        ({"low": 0.2, "high": 0.2}, False, "thresholds = 0.15"),
        ("sign", False, "the sign flipped"),
    ],
)
def test_each_mutation_fails_and_is_classified(
    treatment: Implementation, change, set_a_blind: bool, fix: str
) -> None:
    if change == "sign":
        fn, vfn = _Negated(treatment.loss_fn), _Negated(treatment.value_fn)
    else:
        fn, vfn = _mutated(treatment, **change)
    rep = _run(treatment, fn, vfn)
    path = rep["paths"][0]
    assert not rep["passed"]
    assert not path["stress"]["checks"]["reference_gradient"]["passed"]
    set_a_ok = path["checks"]["reference_gradient"]["passed"]
    # c = inf and the recomputed anchor pass on set A (no r > c, old = sampler): blind there
    assert set_a_ok is set_a_blind
    assert fix in path["stress"]["classification"]["summary"]


def test_classifier_names_the_config_default_cap() -> None:
    # a reference run with verl's/Stable-RL's ActorConfig cap (c = 3.0) against ours at c = 10
    from losslab.conformance.classify import classify
    from losslab.conformance.frameworks import rederive, resolve_reference
    from losslab.conformance.metrics import Tolerance
    from losslab.plan import parse_revision

    fx = generate_fixture(stress_spec())
    rev = parse_revision(
        "sail-sg/Stable-RL@c6af1d119c0fe30d16dd9a837d35fdf695acd226:verl/trainer/ppo/"
        "core_algos.py::compute_policy_loss_with_mask(loss_mode='dppo_binary_tv', "
        "clip_ratio=0.15, clip_ratio_c=3.0)"
    )
    ref = rederive(resolve_reference(rev), fx)
    ours = get_loss("dppo_binary_tv", low=0.15, high=0.15, clip_ratio_c=10.0)
    value = get_loss("dppo_binary_tv", low=0.15, high=0.15, clip_ratio_c=10.0, surrogate="logprob")
    tol = Tolerance(atol=1e-5, rtol=1e-3, min_cosine=0.9999)
    verdict = classify(ours, value, ref, fx, {"loss": Tolerance(1e-5, 1e-4), "gradient": tol})
    assert [m["summary"] for m in verdict["matches"]] == [
        "matches if clip_ratio_c = 3.0: verl and Stable-RL ActorConfig default"
    ]
