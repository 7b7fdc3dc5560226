"""`import losslab` puts torch's CPU tensors on transparent huge pages unless the environment
or an earlier `import torch` decided (`losslab.THP_SET_BY_LOSSLAB`), and `cpu_allocator` says
which pages a process got, for the executed config."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import losslab
from losslab.backends.local.memory import KERNEL_THP, cpu_allocator

ENV = losslab.THP_ENV


def _python(code: str, **env: str) -> str:
    child = {k: v for k, v in os.environ.items() if k != ENV}
    child.update(env)
    out = subprocess.run(
        [sys.executable, "-c", code], env=child, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


REPORT = (
    "import os, losslab; from losslab.backends.local.memory import cpu_allocator; "
    f"print(os.environ.get({ENV!r}), losslab.THP_SET_BY_LOSSLAB, cpu_allocator(), sep='|')"
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
    assert cpu_allocator(path).startswith(expected)


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
