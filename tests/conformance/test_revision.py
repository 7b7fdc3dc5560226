"""Revision strings of the plan's form, parsed; bad ones named in the error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from losslab.conformance.frameworks import resolve_reference
from losslab.plan import RevisionError, parse_revision

PLAN = Path(__file__).resolve().parents[2] / "examples" / "gsm8k_dppo_vs_grpo.json"


def _paths() -> dict:
    return json.loads(PLAN.read_text())["correctness_preflight"]["paths"][0]


def test_plan_revisions_parse() -> None:
    base = parse_revision(_paths()["baseline_revision"])
    assert (base.repo, base.commit[:8], base.function) == (
        "modal-projects/spindle",
        "e58ebef1",
        "_loss",
    )
    assert base.kwargs == {"loss_name": "ppo"} and base.clip_bounds == (0.8, 1.2)
    assert base.description.startswith("Spindle's stock Tinker 'ppo' loss")
    ref = parse_revision(_paths()["reference_revision"])
    assert ref.path == "verl/trainer/ppo/core_algos.py"
    assert ref.kwargs == {"loss_mode": "dppo_binary_tv", "clip_ratio": 0.15, "clip_ratio_c": 10}


def test_effective_parameters_of_plan_references() -> None:
    base = resolve_reference(parse_revision(_paths()["baseline_revision"]))
    assert base.params == {
        "loss_name": "ppo",
        "loss_config": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    }
    ref = resolve_reference(parse_revision(_paths()["reference_revision"]))
    assert ref.params["clip_ratio_low"] == ref.params["clip_ratio_high"] == 0.15
    assert ref.params["clip_ratio_c"] == 10.0
    assert ref.params["global_batch_info"] == {"dp_size": 1, "batch_num_tokens": 1}
    assert any("ActorConfig" in n for n in ref.notes)  # the clip_ratio fallback is stated


def test_free_text_and_nested_literals() -> None:
    rev = parse_revision("a/b@abcdef1:x.py::f(k={'x': [1, 2]}, free words here, s='a,b') -- note")
    assert rev.kwargs == {"k": {"x": [1, 2]}, "s": "a,b"} and rev.notes == ("free words here",)
    assert rev.description == "note"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a/b:x.py::f()", "missing '@commit'"),
        ("a/b@abcdef1::f()", "missing ':path'"),
        ("a/b@abcdef1:x.py:f()", "missing '::function'"),
        ("a/b@xyz:x.py::f()", "7-40 hex digits"),
        ("a/b@abcdef1:x.py::f(k=open('x'))", "k=open"),
        ("a/b@abcdef1:x.py::f(k=1, k=2)", "given twice"),
    ],
)
def test_malformed_revision_names_string_and_part(text: str, message: str) -> None:
    with pytest.raises(RevisionError, match=message) as info:
        parse_revision(text)
    assert repr(text) in str(info.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("someone/else@abcdef1:x.py::f(a=1)", "no known reference for someone/else::f"),
        ("sail-sg/Stable-RL@abcdef1:x.py::other_fn()", "no known reference"),
        (
            "sail-sg/Stable-RL@abcdef1:x.py::compute_policy_loss_with_mask(loss_mode='dppo_topk_kl', "
            "clip_ratio=0.1)",
            "top-k",
        ),
        (
            "sail-sg/Stable-RL@abcdef1:x.py::compute_policy_loss_with_mask(loss_mode='ppo')",
            "set clip_ratio",
        ),
        (
            "sail-sg/Stable-RL@abcdef1:x.py::compute_policy_loss_with_mask(clip_ratio=0.2, lr=1)",
            r"unknown arguments \['lr'\]",
        ),
        (
            "modal-projects/spindle@abcdef1:x.py::_loss(loss_name='ppo', beta=0.1)",
            r"unsupported ppo loss config keys \['beta'\]",
        ),
        (
            "modal-projects/spindle@abcdef1:x.py::_loss(loss_name='ppo', clip 1.2/0.8)",
            "0 <= low <= high",
        ),
        ("modal-projects/spindle@abcdef1:x.py::_loss(loss_name='grpo')", "loss_name = 'grpo'"),
    ],
)
def test_unknown_reference_or_parameter_is_named(text: str, message: str) -> None:
    with pytest.raises(RevisionError, match=message):
        resolve_reference(parse_revision(text))
