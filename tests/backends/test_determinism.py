"""Bit-reproducible CPU training passes (`backends/local/determinism.py`).

The demo's DPPO eval file changed between two runs of the same plan and seed on one machine:
the backward of a repeated-index gather (`x[idx]`, the prefix trie's shared keys) summed its
rows in thread order. These tests pin the mode on where gradients are formed and show the op
itself is stable under it.
"""

from __future__ import annotations

import hashlib

import torch
import torch.utils.deterministic
from tinker import types

from losslab.backends.local.determinism import deterministic_kernels

from .conftest import rl_batch


def _gather_backward_digest(x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> str:
    leaf = x.clone().requires_grad_(True)
    (leaf[idx] * w).sum().backward()
    return hashlib.md5(leaf.grad.numpy().tobytes()).hexdigest()


def test_repeated_index_gather_backward_is_bit_stable_with_deterministic_kernels():
    # 200k gathered rows over 4096 (each row repeated ~49 times) at 2 threads: without the
    # mode this gave 8 different gradient digests in 8 repeats on this 2-core machine
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 64, generator=g)
    idx = torch.randint(0, 4096, (200_000,), generator=g)
    w = torch.randn(200_000, 64, generator=g)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with deterministic_kernels("cpu"):
            digests = {_gather_backward_digest(x, idx, w) for _ in range(6)}
    finally:
        torch.set_num_threads(threads)
    assert len(digests) == 1


def test_mode_is_scoped_and_restores_the_callers_setting():
    """On for the block, and without NaN-filling every `torch.empty` (the flag's default is
    on); both restored afterwards."""
    assert not torch.are_deterministic_algorithms_enabled()
    assert torch.utils.deterministic.fill_uninitialized_memory  # torch's default
    with deterministic_kernels("cpu"):
        assert torch.are_deterministic_algorithms_enabled()
        assert not torch.utils.deterministic.fill_uninitialized_memory
    assert not torch.are_deterministic_algorithms_enabled()
    assert torch.utils.deterministic.fill_uninitialized_memory
    with deterministic_kernels("meta"):  # any non-CPU device: left as the caller set it
        assert not torch.are_deterministic_algorithms_enabled()


def test_training_passes_run_with_deterministic_kernels_and_repeat_bit_for_bit(service, tiny_llama):
    seen: list[bool] = []

    def probe(data, logprobs_list):  # a custom loss records the mode it is called under
        seen.append(torch.are_deterministic_algorithms_enabled())
        loss = sum(
            -(lp * d.loss_fn_inputs["advantages"].to_torch()).sum()
            for d, lp in zip(data, logprobs_list, strict=True)
        )
        return loss, {}

    grads = []
    for _ in range(2):
        tc = service.create_lora_training_client(tiny_llama, rank=4, seed=0).result()
        tc.forward_backward(rl_batch(1), "importance_sampling").result()
        tc.optim_step(types.AdamParams(learning_rate=0.05)).result()
        tc.forward_backward_custom(rl_batch(2), probe).result()
        grads.append({k: v.clone() for k, v in tc.lora_grads().items()})
    assert seen == [True, True]
    assert not torch.are_deterministic_algorithms_enabled()  # restored after the pass
    assert grads[0].keys() == grads[1].keys()
    assert all(torch.equal(grads[0][k], grads[1][k]) for k in grads[0])
