"""`import losslab` puts torch's CPU tensors on transparent huge pages unless the environment
or an earlier `import torch` decided (`losslab.THP_SET_BY_LOSSLAB`), and `cpu_pages` says
which pages a process got, for the executed config; `keep_freed_memory` (set by the CPU
`LocalServiceClient`) keeps freed blocks in glibc's heap, so a block freed and asked for again
faults no page in, and `cpu_allocator` reports both."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import losslab
from losslab.backends.local.memory import KERNEL_THP, cpu_pages

ENV = losslab.THP_ENV


def _python(code: str, *argv: str, **env: str) -> str:
    """`code` in a fresh interpreter whose environment holds no THP or glibc malloc choice
    but `env`'s."""
    child = {k: v for k, v in os.environ.items() if k != ENV and not k.startswith("MALLOC_")}
    child.update(env)
    out = subprocess.run(
        [sys.executable, "-c", code, *argv], env=child, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


REPORT = (
    "import os, losslab; from losslab.backends.local.memory import cpu_pages; "
    f"print(os.environ.get({ENV!r}), losslab.THP_SET_BY_LOSSLAB, cpu_pages(), sep='|')"
)


KERNEL_GIVES_HUGE_PAGES = KERNEL_THP.exists() and "[never]" not in KERNEL_THP.read_text()


def test_import_sets_huge_pages_when_nothing_decided():
    value, by_us, report = _python(REPORT).split("|")
    assert (value, by_us) == ("1", "True")
    if KERNEL_GIVES_HUGE_PAGES:
        assert report == f"transparent huge pages ({ENV}=1, set by losslab)"


def test_an_environment_value_is_left_alone():
    value, by_us, report = _python(REPORT, **{ENV: "0"}).split("|")
    assert (value, by_us, report) == ("0", "False", f"4 KB pages ({ENV}=0)")


def test_torch_imported_first_is_reported_as_small_pages():
    value, by_us, report = _python("import torch; " + REPORT).split("|")
    assert (value, by_us) == ("None", "False")
    assert report == f"4 KB pages (torch was imported before losslab, {ENV}=unset)"


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("always [madvise] never\n", "transparent huge pages"),
        ("always madvise [never]\n", "4 KB pages (the kernel's transparent huge pages are off"),
        (None, "4 KB pages (no "),
    ],
)
def test_the_kernel_setting_decides_when_the_variable_is_on(monkeypatch, tmp_path, mode, expected):
    monkeypatch.setenv(ENV, "1")
    path = tmp_path / "enabled"
    if mode is not None:
        path.write_text(mode)
    assert cpu_pages(path).startswith(expected)


@pytest.mark.skipif(
    not KERNEL_GIVES_HUGE_PAGES, reason="this kernel has no transparent huge pages to give"
)
def test_a_large_tensor_really_lands_on_huge_pages():
    """The mechanism, not only the variable: a 256 MB tensor allocated after `import losslab`
    is backed by huge pages (AnonHugePages in the process's smaps), and with the variable at 0
    it is not. Both in fresh processes, since torch reads the variable once."""
    probe = (
        "import losslab, torch, re; x = torch.ones(64 * 2**20); "
        "s = open('/proc/self/smaps_rollup').read(); "
        "print(int(re.search(r'AnonHugePages:\\s+(\\d+)', s).group(1)))"
    )
    assert int(_python(probe)) >= 64 * 2**10  # kB: at least a quarter of the 256 MB tensor
    assert int(_python(probe, **{ENV: "0"})) < 64 * 2**10


GLIBC = sys.platform.startswith("linux") and os.confstr("CS_GNU_LIBC_VERSION") is not None
# A decode step's logits at the bench size, (64 rows, 49152 vocabulary) float32: 12.6 MB, over
# the 128 KB where glibc's mmap threshold starts, so by default each such block is a fresh mmap.
REFAULT_PROBE = """
import resource, sys, losslab, torch
from losslab.backends.local import memory
kept = memory.keep_freed_memory() if sys.argv[1] == "keep" else False
for _ in range(3):  # first touches, then freed: the heap's steady state
    torch.ones(64, 49152).sum()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(8):  # each freed before the next; nothing small kept alive in between, which
    torch.ones(64, 49152).sum()  # could take a piece of the freed block (a list of the sums did)
after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
print(kept, after - before, memory.cpu_allocator(), sep="|")
"""


def _refaults(mode: str, **env: str) -> tuple[str, int, str]:
    kept, faults, report = _python(REFAULT_PROBE, mode, **env).split("|")
    return kept, int(faults), report


@pytest.mark.skipif(not GLIBC, reason="mallopt and page-fault counts are glibc / Linux facts")
def test_kept_heap_reuses_a_freed_block_without_faulting_it_in():
    """With the glibc defaults, each of the 8 tensors is a fresh mapping: at least one fault per
    2 MB huge page (12.6 MB -> 7) or per 4 KB page (3072), 8 times over (4146-4189 measured
    here). Kept in the heap, the freed block is handed back as it is (0 measured after the three
    warm-up allocations; 39-41 without them, once 558 when a small object took part of it)."""
    kept, faults_kept, report = _refaults("keep")
    assert kept == "True"
    assert report.endswith(
        "; freed blocks kept in the heap for the next phase (mmap off, no trimming)"
    )
    _, faults_default, default_report = _refaults("default")
    assert default_report.endswith("; glibc defaults (large blocks mmapped and unmapped on free)")
    assert faults_default >= 8 * 7  # every tensor faulted in anew
    # kept: at most one of the 8 blocks faulted in again, under a quarter of the default's faults
    assert faults_kept * 4 < faults_default


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's")
def test_an_environment_malloc_choice_is_left_alone():
    kept, _, report = _refaults("keep", MALLOC_MMAP_MAX_="65536")
    assert kept == "False"
    assert report.endswith("; glibc defaults as the environment set them (MALLOC_MMAP_MAX_=65536)")


AFTER_SAMPLING_PROBE = """
import os, losslab, torch
from losslab.backends.local import memory
memory.keep_freed_memory()
def resident_kib():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
x = torch.ones(64, 49152); del x  # a sampling flush's 12.6 MB block, freed
before = resident_kib()
returned = memory.after_sampling()
print(returned, before - resident_kib(), sep="|")
"""


@pytest.mark.skipif(not GLIBC, reason="malloc_trim and page-fault counts are glibc / Linux facts")
def test_after_sampling_keeps_the_pages_only_where_the_heap_is_kept():
    """The same heap either way (mmap off, no automatic trim; once set by losslab, once by the
    environment, which `keep_freed_memory` then leaves alone): only `after_sampling` differs.
    Kept, the freed 12.6 MB block stays resident (the process's resident set shrinks by less
    than 1 MB); otherwise `malloc_trim` returns its pages (at least 10 MB of its 12.3 MiB)."""
    returned, dropped_kib = _python(AFTER_SAMPLING_PROBE).split("|")
    assert returned == "False" and int(dropped_kib) < 1024
    env = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(2**31 - 1)}
    returned, dropped_kib = _python(AFTER_SAMPLING_PROBE, **env).split("|")
    assert returned == "True" and int(dropped_kib) >= 10 * 1024


def test_the_cpu_service_keeps_freed_memory():
    from losslab.backends.local import LocalServiceClient, memory

    LocalServiceClient(device="cpu")
    assert memory._heap_kept is not None  # decided, and keep_freed_memory repeats it
    assert memory._heap_kept == memory.keep_freed_memory()
    if GLIBC and not any(n in os.environ for n in memory.MALLOC_ENV):
        assert memory._heap_kept is True
