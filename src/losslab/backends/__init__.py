"""losslab.backends: Tinker-shaped clients, local (transformers + PEFT) or the Tinker service.

The registry below is the one place that names the backends. `get_backend(name)` returns the
backend module's `BACKEND` object (`losslab.backends.protocols.Backend`): it creates the service
client and answers the runner's questions (device, checkpoints, which base model it executes).
`create_service_client(name, **kwargs)` is `get_backend(name).create_service_client(**kwargs)`.
Adding a backend is one module with a `BACKEND` plus one line here (docs/backends.md).
"""

from __future__ import annotations

import importlib
from typing import Any

from losslab.backends.protocols import Backend, ServiceClient

BACKENDS: dict[str, tuple[str, str]] = {
    "local": ("losslab.backends.local.backend", "the embedded model on this machine (CPU or GPU)"),
    "tinker": ("losslab.backends.tinker", "the Tinker service (reads TINKER_API_KEY from the env)"),
}
"""`--backend` name -> (module holding its `BACKEND`, one-line description for the CLI help).
Modules are imported only when the backend is used."""

DEFAULT_BACKEND = next(iter(BACKENDS))
"""The backend a run uses when none is named (the first registry entry)."""


def backend_names() -> tuple[str, ...]:
    return tuple(BACKENDS)


def get_backend(name: str) -> Backend:
    """The registered backend `name`; ValueError naming the valid ones otherwise."""
    if name not in BACKENDS:
        raise ValueError(f"--backend {name!r}: expected one of {', '.join(map(repr, BACKENDS))}")
    return importlib.import_module(BACKENDS[name][0]).BACKEND


def create_service_client(backend: str = DEFAULT_BACKEND, **kwargs: Any) -> ServiceClient:
    """A service client for `backend` (a `BACKENDS` name)."""
    return get_backend(backend).create_service_client(**kwargs)


__all__ = [
    "BACKENDS",
    "DEFAULT_BACKEND",
    "Backend",
    "backend_names",
    "create_service_client",
    "get_backend",
]
