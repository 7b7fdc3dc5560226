"""Linears on oneDNN-packed weights (`backends/local/packed.py`): the values of `F.linear`, no
gradient recorded, and switched off by the environment."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from losslab.backends.local import packed

pytestmark = pytest.mark.skipif(
    not packed.packing_available(torch.zeros(1)), reason="this torch build has no oneDNN linear"
)


@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_equals_f_linear_on_any_leading_shape(bias):
    """The expected values are `F.linear`'s (the dense product); oneDNN sums in another order,
    so they agree to float32 round-off, for 2-D, 3-D and empty inputs."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(48, 32, generator=g)
    b = torch.randn(48, generator=g) if bias else None
    layer = packed.PackedLinear(w, b)
    assert (layer.out_features, layer.in_features) == (48, 32)
    for shape in [(5, 32), (2, 3, 32), (0, 32)]:
        x = torch.randn(*shape, generator=g)
        with torch.no_grad():
            out = layer(x)
        assert out.shape == (*shape[:-1], 48)
        assert torch.allclose(out, F.linear(x, w, b), atol=1e-5, rtol=1e-5)


def test_packed_linear_refuses_to_run_where_a_gradient_is_wanted():
    layer = packed.PackedLinear(torch.randn(4, 3), None)
    with pytest.raises(RuntimeError, match="records no gradient"):
        layer(torch.randn(2, 3, requires_grad=True))


def test_switched_off_by_the_environment_and_never_on_other_dtypes(monkeypatch):
    assert not packed.packing_available(torch.zeros(1, dtype=torch.float64))
    monkeypatch.setenv(packed.PACKED_ENV, "0")
    assert not packed.packing_available(torch.zeros(1))
