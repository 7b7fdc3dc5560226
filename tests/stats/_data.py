"""Paired binary outcomes with chosen counts, for hand-computable tests."""

from __future__ import annotations

import numpy as np


def paired_counts(n: int, b: int, c: int, both: int) -> tuple[np.ndarray, np.ndarray]:
    """Arrays (x_pos_N, x_neg_N): b items only pos right, c only neg right, `both` both right."""
    assert b + c + both <= n
    pos_N = np.zeros(n)
    neg_N = np.zeros(n)
    pos_N[:b] = 1
    neg_N[b : b + c] = 1
    pos_N[b + c : b + c + both] = 1
    neg_N[b + c : b + c + both] = 1
    return pos_N, neg_N
