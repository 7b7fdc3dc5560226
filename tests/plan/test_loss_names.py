"""Plan loss names resolve to registry specs pinned by the correctness preflight's revisions."""

from __future__ import annotations

import pytest

from losslab.plan import (
    LossNameError,
    check_plan_data,
    load_plan,
    parse_registry_spec,
    parse_revision,
    resolve_loss,
)

from ._plans import SEED_PLAN, fresh_seed

SPINDLE = (
    "modal-projects/spindle@e58ebef130b4cd02de6880e62d27ec358ff7132c:src/spindle/backends/"
    "megatron_runtime/common/forward_backward.py::_loss(loss_name='ppo', clip 0.8/1.2) — note"
)
STABLE_RL = (
    "sail-sg/Stable-RL@c6af1d119c0fe30d16dd9a837d35fdf695acd226:verl/trainer/ppo/core_algos.py::"
    "compute_policy_loss_with_mask(loss_mode='dppo_binary_tv', clip_ratio=0.15, clip_ratio_c=10)"
)


def test_seed_plan_losses() -> None:
    plan = load_plan(SEED_PLAN)
    assert plan.loss_spec("baseline") == "ppo(clip_low_threshold=0.8, clip_high_threshold=1.2)"
    assert plan.loss_spec("treatment") == (
        'dppo_binary_tv(low=0.15, high=0.15, anchor="sampler", clip_ratio_c=10)'
    )


def test_parse_revision() -> None:
    rev = parse_revision(STABLE_RL)
    assert rev.repo == "sail-sg/Stable-RL"
    assert rev.commit == "c6af1d119c0fe30d16dd9a837d35fdf695acd226"
    assert rev.function == "compute_policy_loss_with_mask"
    assert rev.kwargs == {"loss_mode": "dppo_binary_tv", "clip_ratio": 0.15, "clip_ratio_c": 10}
    spindle = parse_revision(SPINDLE)
    assert spindle.kwargs == {"loss_name": "ppo"}
    assert spindle.free_text == ["clip 0.8/1.2"]


def test_grpo_eps_from_name_and_from_revision() -> None:
    # eps 0.1 -> clip [1 - 0.1, 1 + 0.1] = [0.9, 1.1]
    assert resolve_loss("grpo_clip_eps0.1").spec == (
        "ppo(clip_low_threshold=0.9, clip_high_threshold=1.1)"
    )
    from_rev = resolve_loss("grpo_clip", baseline_revision=SPINDLE)
    assert from_rev.spec == "ppo(clip_low_threshold=0.8, clip_high_threshold=1.2)"
    assert from_rev.source == "correctness_preflight baseline_revision"
    with pytest.raises(LossNameError, match="no clip eps"):
        resolve_loss("grpo_clip")


def test_dppo_kl_and_recompute_anchor() -> None:
    kl = STABLE_RL.replace("dppo_binary_tv", "dppo_binary_kl_recompute").replace("0.15", "0.05")
    assert resolve_loss("dppo_divergence_mask", reference_revision=kl).spec == (
        'dppo_binary_kl(low=0.05, high=0.05, anchor="recomputed", clip_ratio_c=10)'
    )


def test_plan_specs_read_bare_words_like_parse_loss_spec() -> None:
    """One grammar: a registry spec in a plan reads bare words as `parse_loss_spec` does, so a
    word where a number belongs reaches the loss's declaration, which refuses it at plan check."""
    assert parse_registry_spec("ppo(reduction=token-mean, clip_low_threshold=foo)") == (
        "ppo",
        {"reduction": "token-mean", "clip_low_threshold": "foo"},
    )
    data = fresh_seed()
    data["arms"][0]["loss"] = "ppo(clip_low_threshold=foo)"
    errors = check_plan_data(data).errors
    assert [(e.path, e.message) for e in errors] == [
        (
            "arms[0].loss",
            'resolves to ppo(clip_low_threshold="foo"), which its declaration refuses: '
            "ppo: clip_low_threshold='foo': expected a number",
        )
    ]


def test_registry_spec_passes_through() -> None:
    spec = "cispo(clip_low_threshold=0.8, clip_high_threshold=1.2)"
    assert resolve_loss(spec).spec == spec
    assert resolve_loss("importance_sampling").spec == "importance_sampling()"
    assert parse_registry_spec('dppo_binary_tv(low=0.2, anchor="sampler")') == (
        "dppo_binary_tv",
        {"low": 0.2, "anchor": "sampler"},
    )


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("grpo_clip_eps1.5", "outside (0, 1)"),
        ("ppo(clip_low_threshold=", "not a loss spec"),
        ("not_a_loss", "not a known loss"),
    ],
)
def test_bad_names(name: str, words: str) -> None:
    with pytest.raises(LossNameError, match=words.replace("(", r"\(").replace(")", r"\)")):
        resolve_loss(name)


def test_registry_names_match_losses_package() -> None:
    """`plan` and `losses` read one name table (the losses' declarations); the plan's display
    spec still parses back to the resolved loss."""
    from losslab.losses import LOSSES, parse_loss_spec
    from losslab.plan import loss_names

    assert loss_names.LOSSES is LOSSES
    plan = load_plan(SEED_PLAN)
    baseline = parse_loss_spec(plan.loss_spec("baseline"))
    treatment = parse_loss_spec(plan.loss_spec("treatment"))
    assert baseline.name == "ppo"
    assert (baseline.params["clip_low_threshold"], baseline.params["clip_high_threshold"]) == (
        0.8,
        1.2,
    )
    assert treatment.name == "dppo_binary_tv"
    assert {k: treatment.params[k] for k in ("low", "high", "anchor", "clip_ratio_c")} == {
        "low": 0.15,
        "high": 0.15,
        "anchor": "sampler",
        "clip_ratio_c": 10.0,
    }
