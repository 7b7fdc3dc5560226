"""The registry, spec strings, parameter validation, and the Tinker custom-loss adapter."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import tinker
import torch

from losslab.losses import (
    LOSS_NAMES,
    LOSSES,
    as_tinker_loss_fn,
    get_loss,
    loss_parameters,
    parse_loss_spec,
)


def test_registry_names_match_the_interface():
    """The registry (the declarations' table) is what docs/interfaces.md lists, and it covers
    every Tinker built-in loss that is not one of the local backend's own (gspo,
    stable_reinforce) or the custom-loss slot."""
    from typing import get_args

    from losslab.backends.local.builtin_losses import LOCAL_BUILTINS

    doc = (Path(__file__).resolve().parents[2] / "docs" / "interfaces.md").read_text()
    listed = doc.split("Registry names:", 1)[1].split(". Reductions", 1)[0]
    assert tuple(re.findall(r"`([a-z0-9_]+)`", listed)) == LOSS_NAMES == tuple(LOSSES)
    tinker_builtins = set(get_args(tinker.types.LossFnType)) - set(LOCAL_BUILTINS) - {"custom"}
    assert tinker_builtins <= set(LOSS_NAMES)


@pytest.mark.parametrize(
    ("name", "defaults"),
    [
        # Tinker doc "eps fixed to 0.2" as absolute bounds; Tinker losses are sums
        ("ppo", {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2, "reduction": "sum"}),
        ("cispo", {"clip_low_threshold": 0.0, "clip_high_threshold": 4.0}),  # Tinker doc, one-sided
        ("dro", {"beta": 0.05}),  # Tinker doc example, Spindle default
        # verl DPPO example thresholds (TV .15, KL .05); c = 10, Stable-RL's code fallback and the
        # plan's pinned reference revision; anchored on the rollout policy as in the paper
        ("dppo_binary_tv", {"low": 0.15, "high": 0.15, "clip_ratio_c": 10.0, "anchor": "sampler"}),
        ("dppo_binary_kl", {"low": 0.05, "high": 0.05, "clip_ratio_c": 10.0, "anchor": "sampler"}),
        ("importance_sampling", {"clip_ratio_c": math.inf, "surrogate": "ratio"}),  # Tinker: no cap
    ],
)
def test_defaults(name, defaults):
    params = get_loss(name).params
    assert {k: params[k] for k in defaults} == defaults
    assert loss_parameters(name) == params


@pytest.mark.parametrize(
    ("spec", "name", "expected"),
    [
        ("ppo", "ppo", {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}),
        (
            "ppo(clip_low=0.7, clip_high=1.3)",
            "ppo",
            {"clip_low_threshold": 0.7, "clip_high_threshold": 1.3},
        ),
        ("ppo()", "ppo", {"clip_low_threshold": 0.8}),
        (
            "dppo_binary_tv(low=0.15, high=0.15, clip_ratio_c=10)",
            "dppo_binary_tv",
            {"low": 0.15, "high": 0.15, "clip_ratio_c": 10.0},
        ),
        (
            "  dppo_binary_kl( low = 1e-2 , anchor='recomputed', reduction=seq-mean-token-sum-norm, ) ",
            "dppo_binary_kl",
            {"low": 0.01, "anchor": "recomputed", "reduction": "seq-mean-token-sum-norm"},
        ),
        (
            'dppo_binary_tv(clip_ratio_c=inf, surrogate="logprob")',
            "dppo_binary_tv",
            {"clip_ratio_c": math.inf},
        ),
        ("dro(beta=0)", "dro", {"beta": 0.0}),
    ],
)
def test_parse_loss_spec(spec, name, expected):
    fn = parse_loss_spec(spec)
    assert fn.name == name
    assert {k: fn.params[k] for k in expected} == expected


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_spec_round_trip(name):
    fn = get_loss(name, reduction="token-mean")
    again = parse_loss_spec(fn.spec)
    assert again == fn and again.spec == fn.spec


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("grpo", re.escape(f"unknown loss 'grpo'; valid losses: {', '.join(LOSSES)}")),
        (
            "ppo(eps=0.2)",
            r"unknown parameter 'eps' for loss 'ppo'; valid parameters: clip_low_threshold",
        ),
        ("cross_entropy(beta=1)", r"unknown parameter 'beta' for loss 'cross_entropy'"),
        ("dppo_binary_tv(tv_threshold=0.1)", r"valid parameters: low, high, anchor"),
        (
            "ppo(clip_low=1.2, clip_high=0.8)",
            r"clip_low_threshold=1.2 must be <= clip_high_threshold=0.8",
        ),
        ("cispo(clip_high=inf)", r"clip_high_threshold=inf: expected a finite number"),
        ("ppo(clip_low=nan)", r"expected a finite number"),
        ("ppo(clip_low=-0.1)", r"expected a value >= 0"),
        ("dro(beta=-0.1)", r"beta=-0.1: expected a value >= 0"),
        ("dppo_binary_tv(low=-0.1)", r"low=-0.1: expected a value >= 0"),
        ("dppo_binary_kl(clip_ratio_c=0)", r"clip_ratio_c=0.0: expected a value > 0"),
        (
            "dppo_binary_tv(anchor=old)",
            r"anchor='old' is not valid; expected one of sampler, recomputed",
        ),
        ("ppo(reduction=mean)", r"expected one of sum, token-mean, seq-mean-token-sum"),
        ("ppo(clip_low=abc)", r"clip_low_threshold='abc': expected a number"),
        ("ppo(clip_ratio_c=10)", r"needs surrogate='ratio' or 'logprob'"),
        ("ppo(clip_low=0.8, clip_low=0.7)", r"given twice"),
        ("ppo(", r"cannot parse loss spec"),
        ("ppo(clip_low)", r"cannot parse parameters"),
        (
            "ppo(clip_low=0.8 clip_high=1.2)",
            r"cannot parse parameters 'clip_low=0.8 clip_high=1.2'",
        ),
        ("", r"cannot parse loss spec"),
    ],
)
def test_bad_specs_raise_value_errors_naming_the_problem(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_loss_spec(spec)


def test_get_loss_validation_directly():
    with pytest.raises(ValueError, match="given twice"):
        get_loss("ppo", clip_low=0.7, clip_low_threshold=0.7)
    with pytest.raises(ValueError, match="expected a number"):
        get_loss("dro", beta=True)
    with pytest.raises(ValueError, match="loss spec must be a string"):
        parse_loss_spec(None)  # type: ignore[arg-type]


# ----- as_tinker_loss_fn: the SDK's forward_backward_custom contract (tinker_contract.md §2.4) --


def _datums():
    mk = tinker.ModelInput.from_ints
    return [
        tinker.Datum(
            model_input=mk([1, 2, 3]),
            loss_fn_inputs={
                "target_tokens": [2, 3, 4],
                "logprobs": [0.0, -0.7, -0.3],
                "advantages": [0.0, 1.0, -1.0],
            },
        ),
        tinker.Datum(  # a datum with no loss token still needs a gradient
            model_input=mk([5, 6]),
            loss_fn_inputs={
                "target_tokens": [6, 7],
                "logprobs": [0.0, 0.0],
                "advantages": [0.0, 0.0],
            },
        ),
    ]


def test_as_tinker_loss_fn_follows_the_custom_loss_contract():
    # what the SDK does: fresh float32 leaves per datum, call, float(loss), backward, check grads
    logprobs_list = [
        torch.tensor([0.0, -0.5, -0.2]).requires_grad_(True),
        torch.tensor([-1.0, -2.0]).requires_grad_(True),
    ]
    custom = as_tinker_loss_fn(get_loss("importance_sampling"))
    loss, metrics = custom(_datums(), logprobs_list)
    loss.backward()
    # Spindle's IS case again: -(e^0.2 - e^0.1) = -0.11623, gradient (0, -e^0.2, e^0.1)
    assert float(loss.detach().sum()) == pytest.approx(-(math.exp(0.2) - math.exp(0.1)), rel=1e-6)
    assert logprobs_list[0].grad.tolist() == pytest.approx(
        [0.0, -math.exp(0.2), math.exp(0.1)], rel=1e-6
    )
    assert logprobs_list[1].grad is not None and logprobs_list[1].grad.tolist() == [0.0, 0.0]
    assert all(isinstance(k, str) and isinstance(v, float) for k, v in metrics.items())
    assert metrics["loss/tokens"] == 2.0
    assert custom.__name__ == "losslab_importance_sampling"


def test_as_tinker_loss_fn_passes_global_counts_and_supports_cross_entropy():
    lp = [torch.tensor([-0.2, -0.4]).requires_grad_(True)]
    data = [
        tinker.Datum(
            model_input=tinker.ModelInput.from_ints([1, 2]),
            loss_fn_inputs={"target_tokens": [2, 3], "weights": [1.0, 1.0]},
        )
    ]
    # token-mean over a global count of 4 tokens: (0.2 + 0.4) / 4 = 0.15
    custom = as_tinker_loss_fn(get_loss("cross_entropy", reduction="token-mean"), num_tokens=4)
    loss, _ = custom(data, lp)
    assert loss.item() == pytest.approx(0.15, rel=1e-6)


def test_params_round_trip_through_get_loss_keeps_optional_none():
    # `norm_constant` is annotated `float | None`; its default None must be accepted when a
    # caller passes LossFn.params back in (the conformance preflight does exactly this).
    fn = get_loss("ppo")
    again = get_loss("ppo", **fn.params)
    assert again.params == fn.params
    assert again.params["norm_constant"] is None


def test_no_public_name_collides_with_the_reference_library():
    """`losslab.losses` (what trains) and `losslab.objectives` (the reference library checked by
    `losslab conform`) share no public name, so `from ... import ppo`-style imports are unambiguous."""
    import losslab.losses
    import losslab.objectives

    assert set(losslab.losses.__all__) & set(losslab.objectives.__all__) == set()
