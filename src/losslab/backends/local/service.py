"""`LocalServiceClient`: the in-process stand-in for `tinker.ServiceClient` (no network)."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any

import torch
from tinker import types

from losslab.backends.futures import CompletedFuture, run_eagerly
from losslab.backends.local.models import (
    load_base_model,
    load_tokenizer,
    losslab_cache_dir,
    resolve_model,
)
from losslab.backends.local.sampling import LocalSamplingClient, derive_seed
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
            it buys; families that cannot share (linear-attention, sliding-window) never do.
    Other keyword arguments of `tinker.ServiceClient` (api_key, base_url, ...) are accepted and
    ignored, so code written for Tinker constructs this unchanged.
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
        self.state_dir = Path(state_dir) if state_dir else losslab_cache_dir() / "states"
        if num_threads is not None:
            if not isinstance(num_threads, int) or num_threads < 1:
                raise ValueError(f"num_threads must be a positive integer, got {num_threads!r}")
            torch.set_num_threads(num_threads)
        if max_tokens_per_batch is None:
            max_tokens_per_batch = 4096 if self.device.type == "cpu" else 32768
        for name, value in (
            ("max_tokens_per_batch", max_tokens_per_batch),
            ("max_batch_rows", max_batch_rows),
        ):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.max_tokens_per_batch = max_tokens_per_batch
        self.max_batch_rows = max_batch_rows
        self.share_prefix = bool(share_prefix)

    def __repr__(self) -> str:
        return f"LocalServiceClient(device={str(self.device)!r}, dtype={self.dtype})"

    def __enter__(self) -> LocalServiceClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self, status: str = "success") -> None:
        """Nothing to release (kept for `tinker.ServiceClient` compatibility)."""

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
    ) -> CompletedFuture[LocalTrainingClient]:
        """A LoRA training client on `base_model` (see `models.resolve_model` for names).

        `seed=None` means seed 0 (the local backend is deterministic). `adam_params` (local
        extension) sets the AdamW configuration the client starts with (default
        `tinker.types.AdamParams()`); `optimizer` accepts only `AdamOptimizerConfig` / None.
        """

        def run() -> LocalTrainingClient:
            if optimizer is not None and not isinstance(optimizer, types.AdamOptimizerConfig):
                raise ValueError(
                    f"optimizer={optimizer!r}; the local backend supports AdamW only "
                    "(tinker.types.AdamOptimizerConfig() or None)"
                )
            resolved, base, tok = self._load(base_model)
            return LocalTrainingClient(
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
            )

        return run_eagerly(run)

    def create_training_client_from_state(
        self, path: str, user_metadata: dict[str, str] | None = None
    ) -> CompletedFuture[LocalTrainingClient]:
        """Weights from a `save_state` checkpoint, fresh optimizer."""
        return run_eagerly(lambda: self._from_state(path, with_optimizer=False))

    def create_training_client_from_state_with_optimizer(
        self, path: str, user_metadata: dict[str, str] | None = None
    ) -> CompletedFuture[LocalTrainingClient]:
        """Weights and AdamW state from a `save_state` checkpoint."""
        return run_eagerly(lambda: self._from_state(path, with_optimizer=True))

    def _from_state(self, path: str, *, with_optimizer: bool) -> LocalTrainingClient:
        meta = _read_meta(path)
        tc = self.create_lora_training_client(
            meta["base_model"],
            rank=meta["rank"],
            seed=meta["seed"],
            train_attn=bool(meta["train_attn"]),
            train_mlp=bool(meta["train_mlp"]),
        ).result()
        tc._load(path, with_optimizer=with_optimizer)
        return tc

    def create_sampling_client(
        self,
        model_path: str | None = None,
        base_model: str | None = None,
        retry_config: Any = None,
        record_stability_info: bool = False,
    ) -> CompletedFuture[LocalSamplingClient]:
        """A sampling client on a base model, or on LoRA weights saved by
        `save_weights_for_sampler` / `save_state` (`model_path`)."""

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
                )
            meta = _read_meta(model_path)
            tc = self._from_state(model_path, with_optimizer=False)
            client = tc.save_weights_and_get_sampling_client().result()
            client._label = f"checkpoint/{Path(str(model_path)).name}"
            client._seed = derive_seed(int(meta["seed"]), 1 << 20)
            return client

        return run_eagerly(run)

    def _make_sampling_client(
        self, *, model: torch.nn.Module, base_model: str, tokenizer: Any, seed: int, label: str
    ) -> LocalSamplingClient:
        return LocalSamplingClient(
            model=model,
            base_model=base_model,
            tokenizer=tokenizer,
            seed=seed,
            label=label,
            max_batch_rows=self.max_batch_rows,
            max_tokens_per_batch=self.max_tokens_per_batch,
        )

    def get_server_capabilities(self) -> dict[str, Any]:
        return {"backend": "local", "device": str(self.device), "supported_models": "local only"}


def _read_meta(path: str) -> dict[str, Any]:
    meta_path = Path(str(path)).expanduser() / "meta.json"
    if not meta_path.is_file():
        raise ValueError(f"path {path!r} is not a local checkpoint (no meta.json)")
    return json.loads(meta_path.read_text())
