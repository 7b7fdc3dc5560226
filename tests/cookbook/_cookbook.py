"""Import guard for the parity tests: tinker-cookbook 0.6.1 and the `cookbook` extra.

`make install-cookbook` installs the extra (the cookbook's import-time requirements) and then
tinker-cookbook itself with `--no-deps` (its `tml-renderers` requirement does not resolve here).
"""

from __future__ import annotations

import importlib.util

import pytest

COOKBOOK_VERSION = "0.6.1"


def require_cookbook() -> None:
    """Skip the calling module unless tinker-cookbook 0.6.1 and its grader's libraries import."""
    if importlib.util.find_spec("tinker_cookbook") is None:
        pytest.skip(
            "tinker-cookbook is not installed (the `cookbook` test extra); run "
            "`make install-cookbook` to run the parity tests",
            allow_module_level=True,
        )
    from importlib.metadata import version

    found = version("tinker-cookbook")
    if found != COOKBOOK_VERSION:
        pytest.skip(
            f"tinker-cookbook {found} is installed; the parity tests pin {COOKBOOK_VERSION}",
            allow_module_level=True,
        )
    for module in ("chz", "sympy", "pylatexenc"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(
                f"{module} (needed by the cookbook's code) is missing; `make install-cookbook`",
                allow_module_level=True,
            )
