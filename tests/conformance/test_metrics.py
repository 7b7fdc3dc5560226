"""Comparison metrics and the tolerance rule |a-b| <= atol + rtol*|b| (b = reference)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from losslab.conformance.metrics import Tolerance, check_tolerance, compare


def test_compare_vector_by_hand() -> None:
    # a = (3, 4), b = (3, 0): diff (0, 4) -> max 4, ||diff|| = 4, ||b|| = 3 -> rel 4/3;
    # cos = <a,b>/(|a||b|) = 9 / (5 * 3) = 0.6
    m = compare(np.array([3.0, 4.0]), np.array([3.0, 0.0]))
    assert m.max_abs_error == 4.0
    assert m.reference_max_abs == 3.0
    assert m.relative_l2_error == pytest.approx(4 / 3)
    assert m.cosine_similarity == pytest.approx(0.6)


def test_compare_scalar_sign_and_ragged_lists() -> None:
    # a scalar's cosine is the sign agreement
    assert compare(-2.0, 2.0).cosine_similarity == -1.0
    assert compare(torch.tensor(2.5), 2.0).max_abs_error == 0.5
    # ragged per-datum lists are concatenated in datum order
    m = compare([np.array([1.0]), torch.tensor([2.0, 3.0])], [[1.0], [2.0, 5.0]])
    assert m.max_abs_error == 2.0


def test_compare_zero_reference_and_zero_vectors() -> None:
    both_zero = compare(np.zeros(3), np.zeros(3))
    assert (both_zero.relative_l2_error, both_zero.cosine_similarity) == (0.0, 1.0)
    only_ref_zero = compare(np.ones(3), np.zeros(3))
    assert math.isinf(only_ref_zero.relative_l2_error) and only_ref_zero.cosine_similarity == 0.0


def test_compare_float64_not_float32() -> None:
    # 1 + 1e-9 is 1 in float32; in float64 the difference survives
    assert compare(np.float64(1 + 1e-9), 1.0).max_abs_error > 0


def test_compare_shape_mismatch_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="actual has 2 values, reference has 3"):
        compare([1.0, 2.0], [1.0, 2.0, 3.0])


def test_tolerance_elementwise_rule() -> None:
    tol = Tolerance(atol=1e-5, rtol=1e-3)
    ref = np.array([100.0, 0.0])
    # bounds: 1e-5 + 1e-3*100 = 0.10001 and 1e-5
    assert check_tolerance(ref + [0.1, 0.0], ref, tol).passed
    failed = check_tolerance(ref + [0.0, 2e-5], ref, tol)
    assert not failed.passed and failed.violations == 1 and failed.worst_index == 1
    assert failed.worst_excess == pytest.approx(1e-5)


def test_tolerance_min_cosine_and_nan() -> None:
    tol = Tolerance(atol=10.0, rtol=0.0, min_cosine=0.9999)
    # within atol elementwise but pointing elsewhere: cos((1,0),(0,1)) = 0
    chk = check_tolerance([1.0, 0.0], [0.0, 1.0], tol)
    assert chk.violations == 0 and not chk.cosine_ok and not chk.passed
    assert not check_tolerance([float("nan")], [0.0], Tolerance(1.0, 1.0)).passed


def test_tolerance_from_plan_block_validation() -> None:
    tol = Tolerance.from_dict({"atol": 1e-5, "rtol": 1e-3, "min_cosine": 0.9999})
    assert tol.to_dict() == {"atol": 1e-5, "rtol": 1e-3, "min_cosine": 0.9999}
    with pytest.raises(ValueError, match=r"reference_loss.atol = -1"):
        Tolerance.from_dict({"atol": -1, "rtol": 0}, where="reference_loss")
    with pytest.raises(ValueError, match="unknown keys"):
        Tolerance.from_dict({"atol": 0, "rtol": 0, "tol": 1})
