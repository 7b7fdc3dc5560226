"""losslab.backends: Tinker-shaped clients, local (transformers + PEFT) or the Tinker service.

`create_service_client(backend="local"|"tinker", **kwargs)` returns a `LocalServiceClient`
(kwargs: device, dtype, state_dir, num_threads, ...) or a `TinkerServiceClient` (API key only
from the TINKER_API_KEY environment variable). Both create training clients with
`create_lora_training_client(base_model, rank, seed)` and use `tinker.types` throughout.
"""

from __future__ import annotations

from typing import Any

BACKENDS = ("local", "tinker")


def create_service_client(backend: str = "local", **kwargs: Any) -> Any:
    """A service client for `backend` ("local" or "tinker")."""
    if backend == "local":
        from losslab.backends.local import LocalServiceClient

        return LocalServiceClient(**kwargs)
    if backend == "tinker":
        from losslab.backends.tinker import TinkerServiceClient

        return TinkerServiceClient(**kwargs)
    raise ValueError(f"backend={backend!r}; expected one of {list(BACKENDS)}")


__all__ = ["BACKENDS", "create_service_client"]
