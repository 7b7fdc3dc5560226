"""losslab.backends: Tinker-shaped clients, local (transformers + PEFT) or the Tinker service.

The registry `BACKENDS` (`registry.py`, stdlib only, so `plan check` reads it) is the one place
that names the backends. `get_backend(name)` returns the backend module's `BACKEND` object (`losslab.backends.protocols.Backend`): it creates the service
client and answers the runner's questions (device, checkpoints, which base model it executes).
`create_service_client(name, **kwargs)` is `get_backend(name).create_service_client(**kwargs)`.
Adding a backend is one module with a `BACKEND` plus one line in `registry.py`
(docs/backends.md).
"""

from __future__ import annotations

import importlib
from typing import Any

from losslab.backends.protocols import Backend, ServiceClient
from losslab.backends.registry import BACKENDS, DEFAULT_BACKEND


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
