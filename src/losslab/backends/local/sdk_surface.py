"""The rest of the Tinker SDK 0.38 client surface on the local clients.

`LocalTrainingClient` and `LocalSamplingClient` implement the synchronous core (forward,
forward_backward, sample, ...). These mixins add what the SDK's `TrainingClient` and
`SamplingClient` also expose, with the SDK's signatures and return types:

* the `*_async` methods. As in the SDK, a training op's `*_async` returns (when awaited) the
  op's future, which is awaited again (`await (await tc.forward_backward_async(...))`); the
  sampling client's `sample_async` / `compute_logprobs_async` return the value itself, and the
  sampling-client factories' `*_async` return the client;
* `get_telemetry()` (None: nothing is sent anywhere) and `on_queue_state_change` (there is no
  queue locally, so the callback has nothing to report);
* `forward_backward_custom` also takes a `LossHandle` from `create_custom_loss`, run through the
  SDK's own client-side path (`handle_as_callable`);
* the methods that need the Tinker service (external weights, sampler handles that reopen the
  sampler in another process, the Tinker Console) raise `NotAvailableLocally`, which says so and
  what to do instead.
"""

from __future__ import annotations

from typing import Any

from tinker import types
from tinker.lib.public_interfaces.custom_loss import (
    LossHandle,
    check_loss_inputs,
    run_loss_handle,
)


class NotAvailableLocally(NotImplementedError):
    """A Tinker SDK feature that needs the Tinker service and has no local equivalent."""

    def __init__(self, what: str, instead: str) -> None:
        super().__init__(
            f"{what} needs the Tinker service and does not exist on the local backend; {instead}"
        )


def handle_as_callable(loss_fn: Any, data: list[types.Datum], session_id: str | None) -> Any:
    """A `create_custom_loss` handle as the callable `forward_backward_custom` runs: the SDK's
    own client-side path (its session check, `check_loss_inputs` and `run_loss_handle`: the
    traced per-datum loss summed over datums, metrics reduced by their :sum/:mean suffix).
    Anything else is returned unchanged."""
    if not isinstance(loss_fn, LossHandle):
        return loss_fn
    if loss_fn.session_id != session_id:
        raise ValueError(
            f"LossHandle {loss_fn.name!r} was created in session {loss_fn.session_id}; it can "
            "only be used by clients of that session (create it with this client's "
            "LocalServiceClient.create_custom_loss)"
        )
    check_loss_inputs(loss_fn, data)
    handle: LossHandle = loss_fn

    def run(batch: list[types.Datum], logprobs_list: list[Any]) -> Any:
        return run_loss_handle(handle, batch, logprobs_list)

    return run


class TrainingClientSurface:
    """`tinker.TrainingClient` methods built on the local client's synchronous ones."""

    async def forward_async(
        self, data: list[types.Datum], loss_fn: str, loss_fn_config: Any = None
    ) -> Any:
        return self.forward(data, loss_fn, loss_fn_config)  # type: ignore[attr-defined]

    async def forward_backward_async(
        self, data: list[types.Datum], loss_fn: str, loss_fn_config: Any = None
    ) -> Any:
        return self.forward_backward(data, loss_fn, loss_fn_config)  # type: ignore[attr-defined]

    async def forward_backward_custom_async(
        self, data: list[types.Datum], loss_fn: Any, *, loss_type_input: Any = None
    ) -> Any:
        return self.forward_backward_custom(  # type: ignore[attr-defined]
            data, loss_fn, loss_type_input=loss_type_input
        )

    async def optim_step_async(
        self,
        optim_params: types.AdamParams | None = None,
        *,
        adam_params: types.AdamParams | None = None,
    ) -> Any:
        return self.optim_step(optim_params, adam_params=adam_params)  # type: ignore[attr-defined]

    async def save_state_async(
        self,
        name: str,
        ttl_seconds: int | None = None,
        overwrite: bool = False,
        user_metadata: dict[str, str] | None = None,
    ) -> Any:
        return self.save_state(name, ttl_seconds, overwrite, user_metadata)  # type: ignore[attr-defined]

    async def load_state_async(self, path: str, weights_access_token: str | None = None) -> Any:
        return self.load_state(path, weights_access_token)  # type: ignore[attr-defined]

    async def load_state_with_optimizer_async(
        self, path: str, weights_access_token: str | None = None
    ) -> Any:
        return self.load_state_with_optimizer(path, weights_access_token)  # type: ignore[attr-defined]

    async def save_weights_for_sampler_async(
        self,
        name: str,
        ttl_seconds: int | None = None,
        user_metadata: dict[str, str] | None = None,
    ) -> Any:
        return self.save_weights_for_sampler(name, ttl_seconds, user_metadata)  # type: ignore[attr-defined]

    def save_weights_external(
        self,
        name: str,
        ttl_seconds: int | None = None,
        age_encryption_recipients: list[str] | None = None,
    ) -> Any:
        raise NotAvailableLocally(
            "save_weights_external (encrypted weights for download)",
            "the local checkpoint folders of save_state / save_weights_for_sampler already hold "
            "the LoRA weights as adapter.safetensors",
        )

    async def save_weights_external_async(
        self,
        name: str,
        ttl_seconds: int | None = None,
        age_encryption_recipients: list[str] | None = None,
    ) -> Any:
        return self.save_weights_external(name, ttl_seconds, age_encryption_recipients)

    async def get_info_async(self) -> types.GetInfoResponse:
        return self.get_info()  # type: ignore[attr-defined]

    async def create_sampling_client_async(
        self, model_path: str, retry_config: Any = None, record_stability_info: bool = False
    ) -> Any:
        return await self.create_sampling_client(  # type: ignore[attr-defined]
            model_path, retry_config=retry_config, record_stability_info=record_stability_info
        )

    async def save_weights_and_get_sampling_client_async(
        self,
        name: str | None = None,
        retry_config: Any = None,
        record_stability_info: bool = False,
        kind: str = "snapshot",
    ) -> Any:
        return await self.save_weights_and_get_sampling_client(  # type: ignore[attr-defined]
            name, retry_config, record_stability_info, kind
        )

    def get_telemetry(self) -> None:
        return None

    def get_console_url(self) -> str:
        raise NotAvailableLocally(
            "get_console_url (the Tinker Console)",
            "the local run's state is on disk: see describe() and the service's state_dir",
        )


class SamplingClientSurface:
    """`tinker.SamplingClient` methods built on the local client's `sample`."""

    async def sample_async(
        self,
        prompt: types.ModelInput,
        num_samples: int,
        sampling_params: types.SamplingParams,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
        topk_sample_logprobs: int = 0,
        target_prompt_logprobs: types.TensorData | None = None,
        prompt_alt_tokens_k: int = 0,
        prompt_logprobs_last_n: int | None = None,
    ) -> types.SampleResponse:
        return await self.sample(  # type: ignore[attr-defined]
            prompt,
            num_samples,
            sampling_params,
            include_prompt_logprobs,
            topk_prompt_logprobs,
            topk_sample_logprobs=topk_sample_logprobs,
            target_prompt_logprobs=target_prompt_logprobs,
            prompt_alt_tokens_k=prompt_alt_tokens_k,
            prompt_logprobs_last_n=prompt_logprobs_last_n,
        )

    async def compute_logprobs_async(
        self, prompt: types.ModelInput, prompt_logprobs_last_n: int | None = None
    ) -> list[float | None]:
        return await self.compute_logprobs(prompt, prompt_logprobs_last_n)  # type: ignore[attr-defined]

    async def get_base_model_async(self) -> str:
        return self.get_base_model()  # type: ignore[attr-defined]

    def get_telemetry(self) -> None:
        return None

    def on_queue_state_change(self, queue_state: Any, queue_state_reason: str | None) -> None:
        """The SDK logs server queue pauses here; local sampling never queues, so nothing to do."""

    def get_sampler_handle(self) -> str:
        raise NotAvailableLocally(
            "get_sampler_handle (reopening this sampler in another process)",
            "the local sampler lives in this process: pass the client itself to threads or "
            "tasks, or save_weights_for_sampler(name) and open its path with "
            "create_sampling_client(model_path) in the other process",
        )

    @staticmethod
    def from_sampler_handle(handle: str, *, api_key: str | None = None) -> Any:
        raise NotAvailableLocally(
            "SamplingClient.from_sampler_handle",
            "open a saved sampler path with LocalServiceClient().create_sampling_client(path)",
        )
