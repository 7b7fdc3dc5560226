"""What the engine and the runner call on a backend, as Protocols (the Tinker SDK's shapes).

The clients are the subset of `tinker.ServiceClient` / `TrainingClient` / `SamplingClient` that
losslab uses, with `tinker.types` as the data format; a backend's clients satisfy them
structurally (no base class). `Backend` is what a backend module answers about itself, so no
caller branches on a backend's name: device description, training-client options, checkpoint
save/load, and whether it executes the plan's `engine.local_base_model`.

Adding a backend: one module with a `BACKEND` object satisfying `Backend`, plus one line in
`losslab.backends.BACKENDS` (docs/backends.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:  # annotations only: importing the registry must not load torch or the SDK
    from tinker import types

    from losslab.losses.tinker_adapter import CustomLossFn

__all__ = [
    "Backend",
    "Future",
    "SamplingClient",
    "ServiceClient",
    "TrainingClient",
]

T_co = TypeVar("T_co", covariant=True)


class Future(Protocol[T_co]):
    """A Tinker future (`APIFuture`): `.result()` blocks for the value."""

    def result(self, timeout: float | None = None) -> T_co: ...


@runtime_checkable
class SamplingClient(Protocol):
    def sample(
        self,
        prompt: types.ModelInput,
        num_samples: int,
        sampling_params: types.SamplingParams,
    ) -> Future[types.SampleResponse]: ...


@runtime_checkable
class TrainingClient(Protocol):
    """The training-client calls of the engine (one RL step), the restoration preflight and the
    runner (executed config, checkpoints)."""

    def forward(
        self, data: Sequence[types.Datum], loss_fn: str = ..., loss_fn_config: Any = ...
    ) -> Future[Any]: ...

    def forward_backward_custom(
        self, data: Sequence[types.Datum], loss_fn: CustomLossFn
    ) -> Future[Any]: ...

    def optim_step(self, adam_params: types.AdamParams) -> Future[Any]: ...

    def save_weights_and_get_sampling_client(self) -> Future[SamplingClient]: ...

    def get_info(self) -> types.GetInfoResponse: ...

    def get_tokenizer(self) -> Any: ...

    def save_state(self, name: str) -> Future[types.SaveWeightsResponse]: ...

    def load_state_with_optimizer(self, path: str) -> Future[Any]: ...

    def optimizer_config(self) -> dict[str, Any]:
        """Optimizer read-back: {"type", learning_rate, beta1, beta2, eps, weight_decay, ...}
        the next `optim_step` uses (losslab extension; both backends implement it)."""
        ...


@runtime_checkable
class ServiceClient(Protocol):
    def create_lora_training_client(
        self,
        base_model: str,
        rank: int = ...,
        seed: int | None = ...,
        *,
        adam_params: types.AdamParams | None = ...,
    ) -> Future[TrainingClient]: ...


@runtime_checkable
class Backend(Protocol):
    """One backend's answers to the questions the runner asks. See `losslab.backends.BACKENDS`.

    Attributes:
        name: the `--backend` value (the registry key).
        executes_local_base_model: whether the plan's `engine.local_base_model` replaces
            `base_model` on this backend (an embedded small model instead of the served one).
    """

    name: str
    executes_local_base_model: bool

    def create_service_client(self, **kwargs: Any) -> ServiceClient: ...

    def device(self) -> str:
        """Where training runs, for the run record (e.g. `cpu`, `cuda: <name>`, a service)."""
        ...

    def gpus(self) -> float:
        """GPUs this process occupies while training (the feasibility projection's GPU-hours)."""
        ...

    def save_checkpoint(self, client: TrainingClient, folder: Path, name: str) -> dict[str, Any]:
        """Save weights + optimizer state for the run checkpoint in `folder`; `name` is a
        run-unique label. Returns the JSON-safe reference `load_checkpoint` reads back."""
        ...

    def load_checkpoint(self, client: TrainingClient, folder: Path, info: dict[str, Any]) -> None:
        """Restore weights AND optimizer moments saved by `save_checkpoint`."""
        ...
