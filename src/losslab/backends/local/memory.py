"""What happens to freed host memory between the phases of an RL step on the CPU.

Freed memory stays in glibc's heap for the next phase (`keep_freed_memory`, set by the CPU
`LocalServiceClient`). By default glibc serves a large block (over its mmap threshold, at most
32 MB) from a fresh `mmap`, unmaps it on free, and trims the heap's top whenever 128 KB+ lie
free there; so a decode step's (64, 49152) logits and their softmax, cumsum and exp (12.6 MB
each) faulted in anew at every step: ~20 ms a tensor on this VM against ~1.7 ms for the same
op into a reused buffer (measured inside a bench sampling run, 2026-12-03), ~60 ms of a ~300
ms decode step. With mmap off (`M_MMAP_MAX=0`) and automatic trimming off (`M_TRIM_THRESHOLD`
at its maximum) every block comes from the heap and is reused.

With the heap kept, the sampling flush does not return its pages either (`after_sampling`):
the training pass that follows reuses them. Returning them (`malloc_trim(0)`, of the whole
heap since glibc 2.8) made that pass fault its activations in anew: on the Qwen3.5 bench step
(`bench/profile_rl_step.py --arch qwen3_5`, 3 steps, 2026-12-03) the first minibatch's
`forward_backward_custom` took 393k minor faults and 9.7 s of system time with the trim,
79k and 4.2 s without; peak RSS 2.58 vs 2.54 GiB (`bench/ab_rl_step.py --threads 2 --rounds 2`,
0.989x the CPU seconds), and on SmolLM2 2.18 GiB either way (1.001x). The trim was added
(2026-12-01) when glibc's defaults held: then large blocks went back to the OS on free, and
what stayed resident after sampling was heap fragments training could not reuse (the training
phase peaked at 2.93 GiB with 1.57 GiB still resident from sampling, 2.4-2.5 GiB with the
trim). So it still runs after each flush where the heap is not kept (the environment chose
`MALLOC_MMAP_MAX_` / `MALLOC_TRIM_THRESHOLD_`, or no `mallopt`). Forcing every large tensor
onto mmap (`M_MMAP_THRESHOLD`) bounds RSS too but made the step ~40% slower from page faults.

Page faults are also why CPU tensors go on transparent huge pages (`cpu_allocator`): torch's
CPU allocator, with `THP_MEM_ALLOC_ENABLE=1`, aligns allocations to 2 MB and `madvise`s the
large ones `MADV_HUGEPAGE`, so the 50 MB logits chunks and the activations of a pass fault in
2 MB at a time instead of 4 KB (512x fewer faults, fewer TLB misses). Measured on the Qwen3.5
bench step (`bench/ab_rl_step.py --threads 2 --rounds 2`, 2026-12-02): 0.866x the CPU seconds,
peak RSS 2.60 vs 2.66 GiB; again with the heap kept (`--rounds 3 --steps 1`, 2026-12-03): 4 KB
pages took 1.150x the CPU seconds, sampling 15.2 vs 11.8 s. A first write to a huge page is not
cheaper per byte on this VM (`bench/page_touch.py`); the gain is fewer TLB misses in every
pass over those pages. `import losslab` sets it when neither the environment nor an earlier
`import torch` decided.
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


def after_sampling() -> bool:
    """End of a sampling flush: where the heap is kept (`keep_freed_memory`), its freed pages
    stay for the training pass that follows; otherwise they go back to the OS. True when the
    pages were returned."""
    return False if _heap_kept else release_free_memory()


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
    """How freed host memory is handled in this process, for the executed config (the same
    words in any process: the bench's TRL worker reports with it too)."""
    if _heap_kept:
        return "freed blocks kept in the heap for the next phase (mmap off, no trimming)"
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
