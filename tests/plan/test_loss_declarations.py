"""`plan check` reads the losses' declarations: a gate metric the arm's loss cannot feed is
refused with the gate check's JSON path, and every `LossFn.spec` pastes into a plan."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from losslab.losses import LOSSES, build_loss, get_loss
from losslab.losses.declarations import Choice, LossDeclaration, Number
from losslab.plan import GATE_METRICS, check_plan_data, resolve_loss

from ._plans import fresh_seed, set_at


def _errors(data: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p.path, p.message) for p in check_plan_data(data).errors]


def test_a_treatment_loss_that_does_not_log_the_gate_metric_is_refused() -> None:
    data = fresh_seed()
    # the seed's gate reads the DPPO mask fraction; a GRPO treatment never logs it
    set_at(data, "arms[1].loss", "ppo(clip_low_threshold=0.7, clip_high_threshold=1.3)")
    errors = _errors(data)
    assert [path for path, _ in errors] == ["activation_gate.checks[0].metric"]
    message = errors[0][1]
    assert message.startswith(
        "'dppo_masked_token_fraction' reads 'dppo/mask_fraction_nonzero_adv' from the treatment "
        "arm's loss, ppo (arms[1].loss 'ppo(clip_low_threshold=0.7, clip_high_threshold=1.3)'), "
        "which does not log it; ppo logs loss/value, "
    )
    assert message.endswith(", ".join(LOSSES["ppo"].metrics))


def test_an_inapplicable_gate_reads_no_metric() -> None:
    data = fresh_seed()
    set_at(data, "arms[1].loss", "ppo(clip_low_threshold=0.7, clip_high_threshold=1.3)")
    set_at(data, "activation_gate.applicable", False)
    assert _errors(data) == []


def test_a_baseline_side_metric_is_checked_against_the_baseline_loss(monkeypatch) -> None:
    """`grpo_clip_fraction` is the baseline loss evaluated as a side loss on the treatment's
    batches: its key is checked against the BASELINE arm's declaration. Every loss logs the
    standard `loss/clip_fraction`, so the entry is pointed at `cispo/clip_fraction`, which only
    cispo declares, to see the check pick the baseline's loss."""
    entry = dataclasses.replace(
        GATE_METRICS["grpo_clip_fraction"], logged_key="cispo/clip_fraction"
    )
    monkeypatch.setitem(GATE_METRICS, "grpo_clip_fraction", entry)
    data = fresh_seed()
    assert _errors(data) == [
        (
            "activation_gate.checks[2].metric",
            "'grpo_clip_fraction' reads 'cispo/clip_fraction' from the baseline arm's loss (a side "
            "loss on the treatment arm's batches), ppo (arms[0].loss 'grpo_clip_eps0.2'), which "
            f"does not log it; ppo logs {', '.join(LOSSES['ppo'].metrics)}",
        )
    ]
    set_at(data, "arms[0].loss", "cispo(clip_low_threshold=0.8, clip_high_threshold=1.2)")
    assert _errors(data) == []


def _non_default(declaration: LossDeclaration) -> dict[str, Any]:
    """A value other than the default for every parameter the plan can train with: finite
    numbers + 0.125 (inside every declared lower bound; the ordered pairs move together), None
    -> 512, choices -> another option. `recomputed` anchors are skipped: the engine trains on
    sampler log-probs only, so a plan refuses them (tests/plan/test_recompute_refused.py).
    Infinite defaults stay (ppo's clipped surrogate has no cap). Where a rule refuses the
    moved numbers (dr_grpo's max_prompt_length is read only with constant="max_seq_len"), only
    the choices move."""
    out: dict[str, Any] = {}
    for key, domain in declaration.params.items():
        if isinstance(domain, Choice):
            others = [o for o in domain.options if o not in (domain.default, "recomputed")]
            if others:
                out[key] = others[-1]
        elif isinstance(domain, Number) and domain.default is None:
            out[key] = 512.0
        elif isinstance(domain, Number) and domain.default != float("inf"):
            out[key] = domain.default + 0.125
    try:
        declaration.resolve(out)
    except ValueError:  # a rule ties a number to a choice (read only under another option)
        out = {k: v for k, v in out.items() if isinstance(declaration.params[k], Choice)}
    return out


@pytest.mark.parametrize("name", list(LOSSES))
def test_every_loss_spec_pastes_into_a_plan(name: str) -> None:
    fn = get_loss(name, **_non_default(LOSSES[name]))
    assert fn.params != get_loss(name).params
    assert "reduction=seq-mean-token-sum-norm" in fn.spec  # the bare word plans now read
    data = fresh_seed()
    set_at(data, "arms[0].loss", fn.spec)  # the baseline: the gate's DPPO metric is the treatment's
    result = check_plan_data(data)
    if not LOSSES[name].reads_policy_inputs:  # cross-entropy: the spec reads, an RL arm refuses it
        assert [(e.path, "cannot train an RL arm" in e.message) for e in result.errors] == [
            ("arms[0].loss", True)
        ]
        assert build_loss(resolve_loss(fn.spec)) == fn
        return
    assert result.errors == []
    assert build_loss(result.plan.loss("baseline")) == fn
