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

Page faults are also why CPU tensors go on transparent huge pages (`cpu_allocator`): torch's
CPU allocator, with `THP_MEM_ALLOC_ENABLE=1`, aligns allocations to 2 MB and `madvise`s the
large ones `MADV_HUGEPAGE`, so the 50 MB logits chunks, the activations of a pass and the
memory `malloc_trim` gave back fault in 2 MB at a time instead of 4 KB (512x fewer faults,
fewer TLB misses). Measured on the Qwen3.5 bench step (`bench/ab_rl_step.py --threads 2
--rounds 2`, 2026-12-02): 0.866x the CPU seconds, peak RSS 2.60 vs 2.66 GiB. `import losslab`
sets it when neither the environment nor an earlier `import torch` decided.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from collections.abc import Callable
from pathlib import Path

import losslab

KERNEL_THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


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


def cpu_allocator(kernel_thp: Path = KERNEL_THP) -> str:
    """Which pages torch's CPU tensors get in this process, for the executed config: huge
    pages when `THP_MEM_ALLOC_ENABLE=1` reached torch (set by `import losslab`, or by the
    environment) and the kernel allows `madvise` huge pages; else 4 KB pages, with the reason."""
    value = os.environ.get(losslab.THP_ENV)
    if value is None and losslab.TORCH_IMPORTED_FIRST:
        return f"4 KB pages (torch was imported before losslab, {losslab.THP_ENV}=unset)"
    if value != "1":
        return f"4 KB pages ({losslab.THP_ENV}={value or 'unset'})"
    try:
        mode = kernel_thp.read_text()
    except OSError:
        return f"4 KB pages (no {kernel_thp}: the kernel has no transparent huge pages)"
    if "[never]" in mode:
        return f"4 KB pages (the kernel's transparent huge pages are off: {mode.strip()})"
    source = "set by losslab" if losslab.THP_SET_BY_LOSSLAB else "from the environment"
    return f"transparent huge pages ({losslab.THP_ENV}=1, {source})"
