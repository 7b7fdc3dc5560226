"""Bit-reproducible training passes on the CPU.

The same plan and seed must give the same numbers on CPU. One op broke that: the backward of
advanced indexing `x[idx]` with repeated indices (the prefix trie gathers a shared prompt's keys
once per completion) accumulates rows with `index_put_(accumulate=True)`, whose multi-threaded
CPU kernel adds them in thread order, so the last bits of the gradient, then a sampled token,
then an eval file, changed from run to run (measured: 8 different gradient digests in 8 repeats
of a 200k-row gather backward at 2 threads; 1 with this mode on). torch's deterministic mode
routes that op (and any other with a deterministic variant) to its ordered implementation.

Only CPU passes are switched: CUDA's deterministic mode needs `CUBLAS_WORKSPACE_CONFIG` and
slows kernels the GPU path relies on, and the CPU is where the project promises determinism.

The mode also makes every `torch.empty` fill its memory with NaN first
(`torch.utils.deterministic.fill_uninitialized_memory`), so that a kernel reading memory it
never wrote would read the same garbage each run. No op of these passes reads unwritten memory
(the digests in tests/backends/test_determinism.py are the check), and the fill cost 0.40 s of
a Qwen3.5 bench step's ~10 s of training (10,164 fills, 34 ms for each (49,152 x 256) logits
chunk; `torch.profiler`, 2026-12-06), so it is off inside the block.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.utils.deterministic


@contextmanager
def deterministic_kernels(device: torch.device | str) -> Iterator[None]:
    """Run the body with torch's deterministic algorithms on when `device` is the CPU; the
    caller's setting is restored afterwards (the flag is process-wide)."""
    if torch.device(device).type != "cpu":
        yield
        return
    was_on = torch.are_deterministic_algorithms_enabled()
    was_warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    was_filling = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was_on, warn_only=was_warn_only)
        torch.utils.deterministic.fill_uninitialized_memory = was_filling
