"""Giving freed host memory back to the operating system between the phases of an RL step.

glibc's allocator keeps freed heap chunks for reuse. A sampling phase (merged decode weights,
KV caches, 50 MB logits chunks) and a training phase (activations of one fused micro-batch)
free hundreds of MB of differently sized tensors, and the heap keeps most of them resident:
on SmolLM2-135M at the bench settings (8 x 8 x 32, 53-token prompts) the training phase peaked
at 2.93 GiB RSS with 1.57 GiB still resident from sampling, and at 2.4-2.5 GiB when that
memory was returned first (`bench/bench_vs_trl.py`, measured 2026-12-01). `malloc_trim(0)`
returns the free pages (of the whole heap, not only its top, since glibc 2.8). It is called
after each sampling flush only: after a training pass it cost ~0.16 s a call (walking ~1 GB of
freed activations) and did not lower the step's peak, since the next pass reuses that memory
(`bench/profile_rl_step.py`: 2.59 GiB with, 2.57 GiB without). Forcing every large tensor onto
mmap instead (`M_MMAP_THRESHOLD`) also bounds RSS but made the step ~40% slower from page
faults, so it is not used.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name).malloc_trim  # glibc only; musl and macOS have none
    except (OSError, AttributeError):
        return None


def release_free_memory() -> bool:
    """Return the allocator's free pages to the OS; False where the C library cannot."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
