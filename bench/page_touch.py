"""What the first write to fresh anonymous memory costs here: 4 KB pages vs transparent huge pages.

    .venv/bin/python bench/page_touch.py [--mib 512] [--rounds 3]

Why it matters: the first full-size RL step of a process writes memory no earlier step did
(the merged sampling weights, the decode caches, the training activations), and torch's CPU
allocator puts its large blocks on huge pages (`THP_MEM_ALLOC_ENABLE=1`, set by `import
losslab`; see `losslab.backends.local.memory`). Each variant runs in a fresh process (rounds
alternate the order) that maps `--mib` MiB, 2 MB aligned, `madvise`s it `MADV_HUGEPAGE` or
not, and writes one byte per 4 KB page: the wall time is the page faults plus the kernel's
zeroing (and, in a virtual machine, the host backing guest memory it had not backed yet).
Reports the median ms per MiB, minor faults and system seconds per variant, and the ratio of
huge pages to 4 KB pages; `runs` has every process, since on a virtual machine the cost moves
with what the host still backs (2026-12-03 here: 0.08-3.4 ms/MiB between processes seconds
apart; docs/benchmarks.md, "Why the first measured step is slower"). Whether huge pages pay
overall is a different question (fewer TLB misses afterwards): `bench/ab_rl_step.py --variant
"4 KB|THP_MEM_ALLOC_ENABLE=0"` answers it.
"""

from __future__ import annotations

import argparse
import json
import mmap
import resource
import statistics
import subprocess
import sys
import time

MIB = 1 << 20
HUGE = 2 * MIB
VARIANTS = ("4kb", "huge")


def touch(mib: int, huge: bool) -> dict[str, float]:
    """Map `mib` MiB (2 MB aligned), advise huge pages or not, write a byte per 4 KB page."""
    import torch

    region = mmap.mmap(-1, mib * MIB + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    bytes_ = torch.frombuffer(region, dtype=torch.uint8)
    start = -bytes_.data_ptr() % HUGE  # the first 2 MB boundary inside the mapping
    if huge:
        region.madvise(mmap.MADV_HUGEPAGE)
    pages = bytes_[start : start + mib * MIB : 4096]
    before, t = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    pages.fill_(1)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_SELF)
    del pages, bytes_
    region.close()
    return {
        "ms_per_mib": wall * 1e3 / mib,
        "minor_faults": after.ru_minflt - before.ru_minflt,
        "system_s": after.ru_stime - before.ru_stime,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=512, help="MiB written per process")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    for flag, value in (("--mib", args.mib), ("--rounds", args.rounds)):
        if value < 1:
            raise SystemExit(f"page_touch: {flag} {value}: expected an integer >= 1")
    if args.worker:
        print(json.dumps(touch(args.mib, args.worker == "huge")))
        return
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    for r in range(args.rounds):
        for variant in VARIANTS if r % 2 == 0 else VARIANTS[::-1]:
            cmd = [sys.executable, __file__, "--worker", variant, "--mib", str(args.mib)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            runs[variant].append(json.loads(out))
    summary = {
        v: {k: statistics.median(run[k] for run in runs[v]) for k in runs[v][0]} for v in VARIANTS
    }
    summary["huge_over_4kb_ms_per_mib"] = (
        summary["huge"]["ms_per_mib"] / summary["4kb"]["ms_per_mib"]
    )
    summary["runs"] = runs
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
