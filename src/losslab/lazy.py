"""Lazy package exports (PEP 562), stdlib only.

A package whose `__init__` would otherwise import heavy modules (torch, tinker) lists its public
names with the submodule defining each; a name is imported on first use. Then a stdlib-only
submodule (the losses' declarations, the task table) can be imported without the rest:

    _EXPORTS = {"get_loss": "registry", ...}
    __all__ = sorted(_EXPORTS)
    __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`(__getattr__, __dir__)` for `package`: `exports` maps a public name to its submodule."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{exports[name]}"), name)
        setattr(sys.modules[package], name, value)  # imported once; later lookups skip this
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *exports})

    return __getattr__, __dir__
