"""Loss declarations: parameter domains, rules, and the `loss_function` binding's contract."""

from __future__ import annotations

import math
from typing import get_args

import pytest
import torch

from losslab.losses import LOSSES, TokenLoss, get_loss, loss_function, pack
from losslab.losses.declarations import (
    STANDARD_METRICS,
    Choice,
    LossDeclaration,
    Number,
    Reduction,
    declare,
    ordered,
)


@pytest.mark.parametrize(
    ("domain", "value", "expected"),
    [
        (Number(1.0, min=0.0), 0.0, 0.0),  # inclusive
        (Number(1.0, min=0.0), 3, 3.0),  # integers read as floats
        (Number(1.0, above=0.0, allow_inf=True), math.inf, math.inf),
        (Number(None, above=0.0, optional=True), None, None),
        (Number(0.5, max=1.0), 1.0, 1.0),
        (Number(0.5, below=1.0), 0.999, 0.999),
    ],
)
def test_number_accepts_its_domain(domain, value, expected):
    assert domain.check("l: k=v", value) == expected


@pytest.mark.parametrize(
    ("domain", "value", "message"),
    [
        (Number(1.0, min=0.0), -0.1, "l: k=v: expected a value >= 0"),
        (Number(1.0, above=0.0), 0.0, "l: k=v: expected a value > 0"),
        (Number(1.0, above=0.0, allow_inf=True), -math.inf, "l: k=v: expected a value > 0"),
        (Number(0.5, max=1.0), 1.5, "l: k=v: expected a value <= 1"),
        (Number(0.5, below=1.0), 1.0, "l: k=v: expected a value < 1"),
        (Number(1.0), math.inf, "l: k=v: expected a finite number"),
        (Number(1.0, allow_inf=True), math.nan, "l: k=v: expected a finite number"),
        (Number(1.0), None, "l: k=v: expected a number"),
        (Number(1.0), True, "l: k=v: expected a number"),
        (Number(1.0), "abc", "l: k=v: expected a number"),
    ],
)
def test_number_refuses_outside_its_domain(domain, value, message):
    with pytest.raises(ValueError) as err:
        domain.check("l: k=v", value)
    assert str(err.value) == message


def test_choice_reads_its_literal():
    choice = Choice.of(Reduction, "sum")
    assert choice.options == get_args(Reduction) and choice.default == "sum"
    assert choice.check("l: r='sum'", "sum") == "sum"
    with pytest.raises(ValueError, match=r"l: r='x' is not valid; expected one of sum, token-mean"):
        choice.check("l: r='x'", "x")


def test_resolve_fills_defaults_checks_rules_and_aliases():
    ppo = LOSSES["ppo"]
    resolved = ppo.resolve({"clip_low": 0.7})
    assert resolved["clip_low_threshold"] == 0.7 and resolved["clip_high_threshold"] == 1.2
    assert list(resolved) == list(ppo.params)[: len(resolved)]
    # the rule reads the default of the parameter not given: 1.3 > default high 1.2
    with pytest.raises(ValueError, match=r"ppo: clip_low_threshold=1.3 must be <= clip_high"):
        ppo.resolve({"clip_low_threshold": 1.3})
    assert ordered("a", "b")({"a": 1.0, "b": 1.0}) is None


def test_declare_refuses_a_bad_declaration():
    with pytest.raises(ValueError, match="'ppo' is declared twice"):
        declare("ppo", "x:y", params={})
    with pytest.raises(ValueError, match="are every loss's"):
        declare("t_reduction", "x:y", params={"reduction": Choice("sum", ("sum",))})
    with pytest.raises(ValueError, match=r"t_default: tau=-1.0: expected a value >= 0"):
        declare("t_default", "x:y", params={"tau": Number(-1.0, min=0.0)})
    assert {"t_reduction", "t_default"}.isdisjoint(LOSSES)  # nothing half-registered


def test_every_function_is_bound_to_its_declaration():
    for name, declaration in LOSSES.items():
        fn = get_loss(name).fn
        assert fn.declaration is declaration
        assert declaration.function == f"{fn.__module__}:{fn.__name__}"
        assert declaration.metrics[: len(STANDARD_METRICS)] == STANDARD_METRICS


def _undeclared(name: str, **params) -> LossDeclaration:
    """A declaration that is not registered (for the binding's own checks)."""
    return LossDeclaration(
        name,
        "x:y",
        params={
            **params,
            "reduction": Choice("sum", ("sum",)),
            "norm_constant": Number(None, optional=True),
        },
        metrics=STANDARD_METRICS,
    )


def test_loss_function_refuses_parameters_other_than_the_declared():
    with pytest.raises(TypeError, match=r"keyword parameters \(tau, beta\) are not loss 't'"):

        @loss_function(_undeclared("t", beta=Number(1.0), tau=Number(1.0)))
        def t(batch, *, tau: float, beta: float) -> TokenLoss:  # order differs
            raise AssertionError("never called")


def test_loss_function_refuses_undeclared_metrics(make_batch):
    @loss_function(_undeclared("t"))
    def t(batch) -> TokenLoss:
        t = pack(batch)
        keep_T = torch.ones_like(t.loss_T)
        return TokenLoss(t, -t.logprobs_T * t.mask_T, keep_T, t.sampler_logprobs_T, {"t/x": 1.0})

    _, batch = make_batch([[-1.0]], [[-1.0]], [[1.0]])
    with pytest.raises(RuntimeError, match=r"loss 't' logged .*'t/x'.*not its declared"):
        t(batch)
