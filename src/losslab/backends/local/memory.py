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

Freed memory stays in the heap between the flushes (`keep_freed_memory`). glibc serves a large
block (over its mmap threshold, at most 32 MB) from a fresh `mmap` and unmaps it on free, and
trims the heap's top whenever 128 KB+ lie free there; so a decode step's (64, 49152) logits and
their softmax, cumsum and exp (12.6 MB each) faulted in anew at every step: ~20 ms a tensor on
this VM against ~1.7 ms for the same op into a reused buffer (measured inside a bench sampling
run, 2026-12-03), ~60 ms of a ~300 ms decode step. With mmap off (`M_MMAP_MAX=0`) and automatic
trimming off (`M_TRIM_THRESHOLD` at its maximum), every block comes from the heap and is reused;
the explicit `release_free_memory` after each sampling flush still gives the pages back, so the
training phase's peak is as before. `LocalServiceClient` sets this on the CPU; a process whose
environment already sets `MALLOC_MMAP_MAX_` or `MALLOC_TRIM_THRESHOLD_` keeps its own choice.
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
def _glibc_function(symbol: str, int_args: int) -> Callable[..., int] | None:
    """The C library's `symbol` taking `int_args` ints and returning an int (`malloc_trim`,
    `mallopt`); None where there is none (glibc only: musl and macOS lack both)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        function = getattr(ctypes.CDLL(name), symbol)
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int] * int_args
    function.restype = ctypes.c_int
    return function


def release_free_memory() -> bool:
    """Return the allocator's free pages to the OS; False where the C library cannot."""
    trim = _glibc_function("malloc_trim", 1)
    if trim is None:
        return False
    trim(0)
    return True


# mallopt parameters (glibc's malloc.h)
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
MALLOC_ENV = ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_")
_heap_kept: bool | None = None  # decided once per process, by keep_freed_memory


def keep_freed_memory() -> bool:
    """Serve every block from glibc's heap and keep freed ones there for reuse (no per-block
    `mmap`, no automatic trimming; see the module docstring). Once per process; False where the
    C library has no `mallopt` or the environment already chose (`MALLOC_MMAP_MAX_`, ...)."""
    global _heap_kept
    if _heap_kept is not None:
        return _heap_kept
    mallopt = _glibc_function("mallopt", 2)
    chosen_by_env = any(name in os.environ for name in MALLOC_ENV)
    _heap_kept = bool(
        mallopt is not None
        and not chosen_by_env
        and mallopt(M_MMAP_MAX, 0) == 1
        and mallopt(M_TRIM_THRESHOLD, 2**31 - 1) == 1
    )
    return _heap_kept


def heap_policy() -> str:
    """How freed host memory is handled in this process, for the executed config."""
    if _heap_kept:
        return "freed blocks kept in the heap (mmap off, trimmed after each sampling flush)"
    chosen = [f"{n}={os.environ[n]}" for n in MALLOC_ENV if n in os.environ]
    if chosen:
        return f"glibc defaults as the environment set them ({', '.join(chosen)})"
    return "glibc defaults (large blocks mmapped and unmapped on free)"


def cpu_allocator(kernel_thp: Path = KERNEL_THP) -> str:
    """Which pages torch's CPU tensors get in this process and what happens to freed ones, for
    the executed config: `"<pages>; <heap_policy()>"`."""
    return f"{cpu_pages(kernel_thp)}; {heap_policy()}"


def cpu_pages(kernel_thp: Path = KERNEL_THP) -> str:
    """Huge pages when `THP_MEM_ALLOC_ENABLE=1` reached torch (set by `import losslab`, or by
    the environment) and the kernel allows `madvise` huge pages; else 4 KB pages, with why."""
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
