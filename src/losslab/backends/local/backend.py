"""The local backend's answers to the runner (`losslab.backends.protocols.Backend`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from losslab.backends.protocols import ServiceClient, TrainingClient

NAME = "local"


class LocalBackend:
    """In-process transformers + PEFT clients (`LocalServiceClient`), CPU or CUDA.

    Checkpoints live inside the run directory (the runner's checkpoint folder), so a run
    directory alone resumes; the plan's `engine.local_base_model` replaces `base_model` here.
    """

    name = NAME
    executes_local_base_model = True

    def create_service_client(self, **kwargs: Any) -> ServiceClient:
        from losslab.backends.local.service import LocalServiceClient

        return LocalServiceClient(**kwargs)

    def device(self) -> str:
        import torch

        return f"cuda: {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else "cpu"

    def gpus(self) -> float:
        import torch

        return 1.0 if torch.cuda.is_available() else 0.0

    def save_checkpoint(self, client: TrainingClient, folder: Path, name: str) -> dict[str, Any]:
        client.save_state(str(folder.resolve()), overwrite=True).result()  # type: ignore[call-arg]
        return {"backend": NAME, "path": "trainer"}

    def load_checkpoint(self, client: TrainingClient, folder: Path, info: dict[str, Any]) -> None:
        client.load_state_with_optimizer(str(folder.resolve())).result()


BACKEND = LocalBackend()
