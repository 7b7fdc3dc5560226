"""Bad input, masked garbage, empty masks, and TokenData.from_datums on real Tinker datums."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tinker
import torch

from losslab.losses import LOSS_NAMES, TokenData, get_loss

LP = [[-1.0, -0.5, -0.2], [-0.3, -2.0]]
SAMPLER = [[-0.9, -0.7, -0.3], [-0.2, -1.5]]
ADV = [[1.0, 1.0, 1.0], [-1.0, -1.0]]


def _batch(**override) -> TokenData:
    f64 = torch.float64
    fields = {
        "logprobs_D": [torch.tensor(x, dtype=f64, requires_grad=True) for x in LP],
        "sampler_logprobs_D": [torch.tensor(x, dtype=f64) for x in SAMPLER],
        "advantages_D": [torch.tensor(x, dtype=f64) for x in ADV],
        "mask_D": [torch.ones(len(x), dtype=f64) for x in LP],
    }
    fields.update(override)
    return TokenData(**fields)


@pytest.mark.parametrize(
    ("override", "match"),
    [
        (
            {
                "advantages_D": [
                    torch.zeros(3, dtype=torch.float64),
                    torch.zeros(3, dtype=torch.float64),
                ]
            },
            r"datum 1: advantages_D has length 3 but logprobs_D has 2",
        ),
        ({"mask_D": [torch.ones(3)]}, r"mask_D has 1 entries but logprobs_D has 2"),
        (
            {"logprobs_D": [torch.tensor([-1, 0, 0]), torch.tensor([0, 0])]},
            r"logprobs_D\[0\] has dtype torch.int64",
        ),
        (
            {"advantages_D": [torch.tensor([1, 1, 1]), torch.tensor([1, 1])]},
            r"advantages_D\[0\] has dtype torch.int64",
        ),
        (
            {
                "logprobs_D": [
                    torch.zeros(3, dtype=torch.float64),
                    torch.zeros(2, dtype=torch.float32),
                ]
            },
            r"logprobs_D\[1\] has dtype torch.float32 but logprobs_D\[0\] has torch.float64",
        ),
        (
            {
                "sampler_logprobs_D": [
                    torch.zeros(1, 3, dtype=torch.float64),
                    torch.zeros(2, dtype=torch.float64),
                ]
            },
            r"sampler_logprobs_D\[0\] has shape \(1, 3\), expected a 1-D tensor",
        ),
        (
            {"advantages_D": [[1.0, 1.0, 1.0], torch.zeros(2)]},
            r"advantages_D\[0\] is list, expected a torch.Tensor",
        ),
        (
            {"mask_D": [torch.tensor([1.0, -1.0, 1.0]), torch.ones(2)]},
            r"mask_D\[0\] has value -1.0 at position 1",
        ),
        (
            {"mask_D": [torch.tensor([1.0, math.nan, 1.0]), torch.ones(2)]},
            r"mask_D\[0\] has value nan at position 1",
        ),
        (
            {"logprobs_D": [], "sampler_logprobs_D": [], "advantages_D": [], "mask_D": []},
            "no datums",
        ),
    ],
)
def test_bad_input_is_a_clear_value_error(override, match):
    with pytest.raises(ValueError, match=match):
        get_loss("ppo")(_batch(**override))


@pytest.mark.parametrize("field", ["logprobs_D", "sampler_logprobs_D", "advantages_D"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_at_a_kept_position_names_datum_and_position(field, bad):
    values = {"logprobs_D": LP, "sampler_logprobs_D": SAMPLER, "advantages_D": ADV}[field]
    tensors = [torch.tensor(x, dtype=torch.float64) for x in values]
    tensors[1][1] = bad
    with pytest.raises(ValueError, match=rf"{field}\[1\] has a non-finite value .* at position 1"):
        get_loss("dppo_binary_tv")(_batch(**{field: tensors}))


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_garbage_at_masked_positions_never_leaks(name):
    """NaN/inf at masked positions of every input: same loss and gradient as zeros there."""
    mask_D = [
        torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64),
        torch.tensor([0.0, 1.0], dtype=torch.float64),
    ]
    clean = _batch(mask_D=mask_D)
    dirty_lp = [
        torch.tensor([-1.0, math.nan, -0.2], dtype=torch.float64, requires_grad=True),
        torch.tensor([math.inf, -2.0], dtype=torch.float64, requires_grad=True),
    ]
    dirty = _batch(
        logprobs_D=dirty_lp,
        sampler_logprobs_D=[
            torch.tensor([-0.9, -math.inf, -0.3], dtype=torch.float64),
            torch.tensor([math.nan, -1.5], dtype=torch.float64),
        ],
        advantages_D=[
            torch.tensor([1.0, math.inf, 1.0], dtype=torch.float64),
            torch.tensor([math.nan, -1.0], dtype=torch.float64),
        ],
        mask_D=mask_D,
    )
    a, b = get_loss(name)(clean), get_loss(name)(dirty)
    a.loss.backward()
    b.loss.backward()
    assert b.loss.item() == pytest.approx(a.loss.item(), abs=1e-12)
    for x, y in zip(clean.logprobs_D, dirty_lp, strict=True):
        assert torch.isfinite(y.grad).all()
        torch.testing.assert_close(x.grad, y.grad)
    assert y.grad[0].item() == 0.0  # masked position: exactly zero gradient


@pytest.mark.parametrize("name", LOSS_NAMES)
@pytest.mark.parametrize("reduction", ["sum", "token-mean", "seq-mean-token-mean"])
def test_empty_masks_give_zero_loss_and_a_zero_gradient_for_every_datum(name, reduction):
    lp = [torch.tensor([-1.0, -2.0], requires_grad=True), torch.zeros(0, requires_grad=True)]
    batch = TokenData(
        logprobs_D=lp,
        sampler_logprobs_D=[torch.tensor([-0.5, -1.0]), torch.zeros(0)],
        advantages_D=[torch.tensor([1.0, -1.0]), torch.zeros(0)],
        mask_D=[torch.zeros(2), torch.zeros(0)],
    )
    out = get_loss(name, reduction=reduction)(batch)
    out.loss.backward()
    assert out.loss.item() == 0.0
    assert lp[0].grad is not None and lp[0].grad.tolist() == [0.0, 0.0]
    assert lp[1].grad is not None and lp[1].grad.shape == (0,)  # Tinker's SDK needs a grad here


def test_bool_and_int_masks_are_accepted():
    a = get_loss("ppo")(
        _batch(mask_D=[torch.tensor([True, False, True]), torch.tensor([True, True])])
    )
    b = get_loss("ppo")(_batch(mask_D=[torch.tensor([1, 0, 1]), torch.tensor([1, 1])]))
    assert a.loss.item() == b.loss.item()
    assert a.metrics["loss/tokens"] == 4


# ----- TokenData.from_datums -------------------------------------------------------------------


def _datum(n: int, **inputs) -> tinker.Datum:
    return tinker.Datum(
        model_input=tinker.ModelInput.from_ints(list(range(n))),
        loss_fn_inputs={"target_tokens": list(range(1, n + 1)), **inputs},
    )


def test_from_datums_reads_mask_weights_or_spindle_default():
    lp = [torch.tensor([0.0, -0.5, -0.2], requires_grad=True)] * 3
    base = {"logprobs": [0.0, -0.7, -0.3], "advantages": [0.0, 1.0, -1.0]}
    with_mask = _datum(3, **base, mask=np.array([1.0, 1.0, 0.0], dtype=np.float32))
    with_weights = _datum(3, **base, weights=[0.0, 0.0, 1.0])
    neither = _datum(3, **base)  # Spindle: advantages != 0 | sampler != 0 -> (0, 1, 1)
    batch = TokenData.from_datums([with_mask, with_weights, neither], lp)
    assert [m.tolist() for m in batch.mask_D] == [[1, 1, 0], [0, 0, 1], [0, 1, 1]]
    assert batch.sampler_logprobs_D[0].tolist() == pytest.approx([0.0, -0.7, -0.3])
    assert batch.old_logprobs_D is None
    assert batch.logprobs_D[0] is lp[0]


def test_from_datums_old_logprobs_and_errors():
    lp = [torch.zeros(2, requires_grad=True), torch.zeros(2, requires_grad=True)]
    base = {"logprobs": [-0.1, -0.2], "advantages": [1.0, 1.0]}
    old = np.array([-0.3, -0.4], dtype=np.float32)
    batch = TokenData.from_datums([_datum(2, **base, old_logprobs=old)] * 2, lp)
    assert batch.old_logprobs_D[1].tolist() == pytest.approx([-0.3, -0.4])
    with pytest.raises(
        ValueError, match=r"'old_logprobs' is present in some datums but missing in \[1\]"
    ):
        TokenData.from_datums([_datum(2, **base, old_logprobs=old), _datum(2, **base)], lp)
    with pytest.raises(ValueError, match="datum 0: loss_fn_inputs has no 'advantages'"):
        TokenData.from_datums([_datum(2, logprobs=[0.0, 0.0])] * 2, lp)
    with pytest.raises(ValueError, match="got 2 datums but 1 logprob tensors"):
        TokenData.from_datums([_datum(2, **base)] * 2, lp[:1])


def test_from_datums_without_policy_inputs_for_cross_entropy():
    lp = [torch.tensor([-0.2, -0.4], requires_grad=True)]
    batch = TokenData.from_datums([_datum(2, weights=[1.0, 0.5])], lp, require_policy_inputs=False)
    assert batch.advantages_D[0].tolist() == [0.0, 0.0]
    out = get_loss("cross_entropy")(batch)  # -(1·(-.2) + .5·(-.4)) = 0.4
    assert out.loss.item() == pytest.approx(0.4, abs=1e-7)
