"""`LocalTrainingClient`: a Tinker TrainingClient over transformers + PEFT LoRA, in process.

Numerics: the model runs in eval mode (no dropout) in the dtype it was loaded with (float32 on
CPU). Every call runs eagerly, so operations take effect in submission order (Tinker's rule), and
returns a completed future (`.result()`, `await`).

LoRA: PEFT adapters of rank `rank` on every linear projection of the decoder layers
(attention q/k/v/o and the linear-attention projections when `train_attn`, MLP gate/up/down
and the fused routed-expert weights of MoE layers when `train_mlp`; see
`lora_target_modules`), `lora_alpha = 32` for every rank (scaling 32/rank, the fixed-alpha
convention of Thinking Machines' "LoRA Without Regret" that Tinker's rank-independent learning
rates assume), dropout 0, PEFT's default init (A Kaiming-
uniform drawn from `torch.manual_seed(seed)`, B = 0, so a fresh client equals its base model).
The unembedding is tied to the input embedding in the supported models and is never adapted:
`train_unembed` is accepted for signature compatibility and recorded as False in `describe()`.

Built-in losses see a datum as the Tinker server does (`datums.tinker_visible`): only
`target_tokens` and the loss's own inputs, so client-only keys such as `mask` are ignored.

Optimizer: `torch.optim.AdamW` over the LoRA parameters. The client is *created* with an
AdamParams (`adam_params=`, default `tinker.types.AdamParams()`), which is what
`optimizer_config()` reports before any step; `optim_step(params)` applies `params` and records
them as the new configuration; `optim_step()` without params reuses the recorded ones.
"""

from __future__ import annotations

import json
import threading
import warnings
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tinker import types

from losslab.atomic import atomic_dir
from losslab.backends.datums import (
    check_builtin,
    check_data,
    check_vocab,
    datum_tokens,
    tinker_visible,
)
from losslab.backends.futures import CompletedFuture, client_future, run_eagerly
from losslab.backends.local.builtin_losses import LOCAL_BUILTINS, local_builtin_loss
from losslab.backends.local.determinism import deterministic_kernels
from losslab.backends.local.linear_attention import (
    kernel_report,
    kernels_for,
    linear_attention_modules,
)
from losslab.backends.local.logprobs import (
    can_share_prefix,
    causal_lm,
    plan_microbatches,
    sequence_logprobs,
)
from losslab.backends.local.memory import cpu_allocator
from losslab.backends.local.models import clone_sharing_weights
from losslab.backends.local.sdk_surface import TrainingClientSurface, handle_as_callable
from losslab.losses.tinker_adapter import CustomLossFn

LORA_ALPHA = 32


def lora_target_modules(model: torch.nn.Module, train_attn: bool, train_mlp: bool) -> list[str]:
    """Leaf names of the decoder's nn.Linear layers: attention ones live under a module whose
    name contains "attn"; the rest of the layer stack is the MLP. lm_head is never included.
    With `train_mlp`, the fused routed-expert weights of MoE layers (3-D `experts.gate_up_proj`
    / `experts.down_proj` parameters, not nn.Linear) are added as dotted names, which
    `split_targets` hands to PEFT's `target_parameters`; the router is never adapted."""
    if not (train_attn or train_mlp):
        raise ValueError("train_attn and train_mlp are both False; expected at least one True")
    names: set[str] = set()
    for full_name, module in model.named_modules():
        if ".layers." not in f".{full_name}":
            continue
        if isinstance(module, torch.nn.Linear):
            is_attn = "attn" in full_name or "attention" in full_name
            if (is_attn and train_attn) or (not is_attn and train_mlp):
                names.add(full_name.rsplit(".", 1)[-1])
        elif train_mlp and full_name.endswith(".experts"):
            for pname, p in module.named_parameters(recurse=False):
                if p.dim() == 3:  # (experts, out, in): one matrix per routed expert
                    names.add(f"experts.{pname}")
    if not names:
        raise ValueError("found no linear projections under '.layers.' to adapt with LoRA")
    return sorted(names)


def split_targets(targets: list[str]) -> tuple[list[str], list[str]]:
    """(nn.Linear leaf names for `target_modules`, dotted parameter names for
    `target_parameters`) of a `lora_target_modules` list."""
    return [t for t in targets if "." not in t], [t for t in targets if "." in t]


def adam_dict(p: types.AdamParams) -> dict[str, float]:
    return {
        "learning_rate": float(p.learning_rate),
        "beta1": float(p.beta1),
        "beta2": float(p.beta2),
        "eps": float(p.eps),
        "weight_decay": float(p.weight_decay),
        "grad_clip_norm": float(p.grad_clip_norm),
    }


def check_adam(p: Any, arg: str = "adam_params") -> types.AdamParams:
    if not isinstance(p, types.AdamParams):
        raise ValueError(f"{arg} must be tinker.types.AdamParams, got {type(p).__name__}")
    checks = {
        "learning_rate": p.learning_rate >= 0,
        "beta1": 0 <= p.beta1 < 1,
        "beta2": 0 <= p.beta2 < 1,
        "eps": p.eps >= 0,
        "weight_decay": p.weight_decay >= 0,
        "grad_clip_norm": p.grad_clip_norm >= 0,
    }
    for field, ok in checks.items():
        if not ok:
            raise ValueError(
                f"{arg}.{field} = {getattr(p, field)!r}; expected "
                + ("a value in [0, 1)" if field.startswith("beta") else "a value >= 0")
            )
    return p


class LocalTrainingClient(TrainingClientSurface):
    """Tinker-shaped LoRA training client. Create it with
    `LocalServiceClient.create_lora_training_client(...).result()`."""

    _user_metadata: dict[str, str] | None = None  # the run's metadata (set by the service)

    def __init__(
        self,
        *,
        service: Any,
        base_model: str,
        base: torch.nn.Module,
        tokenizer: Any,
        rank: int,
        seed: int,
        train_mlp: bool = True,
        train_attn: bool = True,
        train_unembed: bool = True,
        adam_params: types.AdamParams | None = None,
        model_id: str,
    ) -> None:
        from peft import LoraConfig, get_peft_model

        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
            raise ValueError(f"rank must be a positive integer, got {rank!r}")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ValueError(f"seed must be an integer or None, got {seed!r}")
        self._service = service
        self._base_model = base_model
        self._tokenizer = tokenizer
        self._rank = rank
        self._seed = seed
        self._model_id = model_id
        self._device = next(base.parameters()).device
        self._lock = threading.RLock()
        self._targets = lora_target_modules(base, train_attn, train_mlp)
        self._train_flags = {"train_mlp": train_mlp, "train_attn": train_attn}
        modules, parameters = split_targets(self._targets)
        config = LoraConfig(
            r=rank,
            lora_alpha=LORA_ALPHA,
            lora_dropout=0.0,
            target_modules=modules,
            target_parameters=parameters or None,
            bias="none",
        )
        model = clone_sharing_weights(base)
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # PEFT calls deprecated HF helpers
            torch.manual_seed(seed)
            self._model = get_peft_model(model, config)
        self._model.eval()
        self._params = [p for p in self._model.parameters() if p.requires_grad]
        self._param_names = [n for n, p in self._model.named_parameters() if p.requires_grad]
        self._adam = check_adam(adam_params if adam_params is not None else types.AdamParams())
        self._optimizer = torch.optim.AdamW(self._params, **self._torch_adam_kwargs(self._adam))
        self._steps = 0
        self._snapshots = 0
        # the last snapshot's model and its sampling client (`_snapshot_model` reuses the model
        # once that client is gone)
        self._snapshot_pool: tuple[torch.nn.Module, weakref.ref] | None = None
        self._vocab = int(self._model.get_base_model().get_output_embeddings().weight.shape[0])
        self._share_prefix = service.share_prefix and can_share_prefix(causal_lm(self._model))

    # ------------------------------------------------------------------ info
    def __repr__(self) -> str:
        return (
            f"LocalTrainingClient(model_id={self._model_id!r}, base_model={self._base_model!r}, "
            f"rank={self._rank}, seed={self._seed}, steps={self._steps})"
        )

    def get_info(self) -> types.GetInfoResponse:
        """Tinker's GetInfoResponse: `model_data.model_name` is the base model name."""
        arch = type(self._model.get_base_model()).__name__
        return types.GetInfoResponse(
            model_id=self._model_id,
            model_data=types.ModelData(
                arch=arch, model_name=self._base_model, tokenizer_id=self._base_model
            ),
            optimizer_config=types.AdamOptimizerConfig(),
            is_lora=True,
            lora_rank=self._rank,
            model_name=self._base_model,
        )

    def optimizer_config(self) -> dict[str, Any]:
        """The optimizer the next `optim_step()` uses: {"type": "adamw", learning_rate, beta1,
        beta2, eps, weight_decay, grad_clip_norm}, read back from the torch optimizer itself
        (local extension; the restoration preflight reads it)."""
        group = self._optimizer.param_groups[0]
        return {
            "type": "adamw" if isinstance(self._optimizer, torch.optim.AdamW) else "other",
            "learning_rate": float(group["lr"]),
            "beta1": float(group["betas"][0]),
            "beta2": float(group["betas"][1]),
            "eps": float(group["eps"]),
            "weight_decay": float(group["weight_decay"]),
            "grad_clip_norm": float(self._adam.grad_clip_norm),
        }

    def describe(self) -> dict[str, Any]:
        """JSON-able description: LoRA config, optimizer config, step count, device."""
        return {
            "backend": "local",
            "model_id": self._model_id,
            "base_model": self._base_model,
            "rank": self._rank,
            "lora_alpha": LORA_ALPHA,
            "target_modules": self._targets,
            "train_unembed": False,
            **self._train_flags,
            "seed": self._seed,
            "device": str(self._device),
            "dtype": str(self._params[0].dtype),
            "trainable_params": int(sum(p.numel() for p in self._params)),
            "steps": self._steps,
            "optimizer": self.optimizer_config(),
            "share_prefix": self._share_prefix,
            **({"cpu_allocator": cpu_allocator()} if self._device.type == "cpu" else {}),
            **self._kernels(),
        }

    def _kernels(self) -> dict[str, Any]:
        """For a model with Gated-DeltaNet layers: the implementation each linear-attention
        function dispatches to on this device, and the calls of each so far in this process."""
        if not linear_attention_modules(causal_lm(self._model)):
            return {}
        return {
            "linear_attention_kernels": kernels_for(self._device),
            "linear_attention_calls": kernel_report(),
        }

    def get_tokenizer(self) -> Any:
        return self._tokenizer

    def lora_state(self) -> dict[str, torch.Tensor]:
        """Copies of the LoRA tensors by parameter name (local extension, for tests/inspection)."""
        return {
            n: p.detach().clone().cpu()
            for n, p in zip(self._param_names, self._params, strict=True)
        }

    def lora_grads(self) -> dict[str, torch.Tensor]:
        """Copies of the accumulated LoRA gradients (zeros where none yet)."""
        return {
            n: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)).cpu()
            for n, p in zip(self._param_names, self._params, strict=True)
        }

    # ------------------------------------------------------------------ log-probs
    def _logprobs(self, data: list[types.Datum]) -> list[torch.Tensor]:
        toks = [datum_tokens(d, i) for i, d in enumerate(data)]
        inputs = [t[0] for t in toks]
        targets = [t[1] for t in toks]
        check_vocab(inputs, targets, self._vocab)
        return sequence_logprobs(
            self._model,
            inputs,
            targets,
            device=self._device,
            max_tokens_per_batch=self._service.max_tokens_per_batch,
            share_prefix=self._share_prefix,
        )

    @staticmethod
    def _outputs(lp_D: list[torch.Tensor]) -> list[dict[str, types.TensorData]]:
        return [{"logprobs": types.TensorData.from_torch(lp.detach().float().cpu())} for lp in lp_D]

    def _builtin_loss(
        self, loss_fn: str, data: list[types.Datum], lp_D: list[torch.Tensor], config: dict
    ) -> torch.Tensor:
        """Tinker's built-in losses, all summed over tokens and datums (losslab.losses; gspo
        and stable_reinforce in `local.builtin_losses`)."""
        from losslab.losses import TokenData, get_loss

        if loss_fn in LOCAL_BUILTINS:
            recorded = getattr(self._service, "recorded_stability_info", None)
            return local_builtin_loss(loss_fn, data, lp_D, config, recorded)

        if loss_fn == "cross_entropy":
            # -(lp * weights).sum() inline: Tinker's CE takes signed weights (the custom-loss
            # surrogate sends weights = -dL/dlogp), which losslab.losses' mask must not be.
            total = lp_D[0].new_zeros(())
            for d, lp in zip(data, lp_D, strict=True):
                w = d.loss_fn_inputs.get("weights")
                w_T = (
                    w.to_torch().float().reshape(lp.shape)
                    if w is not None
                    else torch.ones(lp.shape)
                )
                total = total - (lp * w_T.to(lp.device)).sum()
            return total
        batch = TokenData.from_datums(data, lp_D)
        return get_loss(loss_fn, reduction="sum", **config)(batch).loss

    # ------------------------------------------------------------------ training ops
    def forward(
        self,
        data: Sequence[types.Datum],
        loss_fn: str = "cross_entropy",
        loss_fn_config: Mapping[str, float] | None = None,
    ) -> CompletedFuture[types.ForwardBackwardOutput]:
        """Log-probs of every target token (no gradient) and the loss value."""

        def run() -> types.ForwardBackwardOutput:
            batch = check_data(data)
            config = check_builtin(loss_fn, batch, loss_fn_config)
            batch = [tinker_visible(d, loss_fn) for d in batch]
            with self._lock, torch.no_grad():
                lp_D = [lp.float().cpu() for lp in self._logprobs(batch)]
                loss = self._builtin_loss(loss_fn, batch, lp_D, config)
            return types.ForwardBackwardOutput(
                loss_fn_output_type=loss_fn,
                loss_fn_outputs=self._outputs(lp_D),
                metrics={"loss:sum": float(loss)},
            )

        return run_eagerly(run)

    def forward_backward(
        self,
        data: Sequence[types.Datum],
        loss_fn: str,
        loss_fn_config: Mapping[str, float] | None = None,
    ) -> CompletedFuture[types.ForwardBackwardOutput]:
        """Built-in loss (sum convention), gradients accumulated into the LoRA weights until
        `optim_step`. Micro-batches are backpropagated one at a time (the sum is separable)."""

        def run() -> types.ForwardBackwardOutput:
            batch = check_data(data)
            config = check_builtin(loss_fn, batch, loss_fn_config)
            batch = [tinker_visible(d, loss_fn) for d in batch]
            total, lp_all = 0.0, [torch.empty(0)] * len(batch)
            with self._lock, deterministic_kernels(self._device):
                for idx in self._microbatches(batch):
                    chunk = [batch[i] for i in idx]
                    lp_D = [lp.float().cpu() for lp in self._logprobs(chunk)]
                    loss = self._builtin_loss(loss_fn, chunk, lp_D, config)
                    loss.backward()
                    total += float(loss.detach())
                    for i, lp in zip(idx, lp_D, strict=True):
                        lp_all[i] = lp
            return types.ForwardBackwardOutput(
                loss_fn_output_type=loss_fn,
                loss_fn_outputs=self._outputs(lp_all),
                metrics={"loss:sum": total},
            )

        return run_eagerly(run)

    def _microbatches(self, batch: list[types.Datum]) -> list[list[int]]:
        """Datum indices per micro-batch of at most `max_tokens_per_batch` tokens: a prefix trie
        each where the model shares prefixes, else padded rows (`logprobs.plan_microbatches`)."""
        inputs = [d.model_input.to_ints() for d in batch]
        plan = plan_microbatches(inputs, self._service.max_tokens_per_batch, self._share_prefix)
        return [list(mb.members) for mb in plan]

    def forward_backward_custom(
        self, data: Sequence[types.Datum], loss_fn: CustomLossFn, *, loss_type_input: Any = None
    ) -> CompletedFuture[types.ForwardBackwardOutput]:
        """A client-side loss `loss_fn(data, logprobs_list) -> (loss, metrics)` in ONE fused pass.

        The log-probs handed to `loss_fn` are float32 CPU tensors (like the SDK's) that stay
        attached to the model graph. We take `g_d = dL/dlogprobs_d` with `torch.autograd.grad`
        (touching only the user's graph), raise like the SDK if some datum gets no gradient,
        then backpropagate `g` through the model once. The LoRA gradient is therefore
        `sum_d sum_t g_dt * d lp_dt / d theta`, exactly the gradient of Tinker's two-phase
        surrogate (forward, then cross-entropy with weights = -g), at the cost of one step.
        Metrics are the user's metrics plus "loss:sum".

        Prefix sharing: leading tokens that datums share (a GRPO group's prompt, a header common
        to several prompts) run once, as one prefix trie (`logprobs.sequence_logprobs`), with
        the gradient of separate passes (Gated-DeltaNet layers fork the prompt's recurrent state);
        families that cannot share (sliding-window) run one pass per sequence.

        Memory guard: the fused pass keeps the whole batch's activations. When the batch needs
        more than one micro-batch (`max_tokens_per_batch` tokens), it runs Tinker's
        two-phase form instead (no-grad forward, the loss, then one backward per micro-batch
        of `sum(lp * g)`): same gradient, one extra forward.
        """

        def run() -> types.ForwardBackwardOutput:
            batch = check_data(data)
            fn = handle_as_callable(loss_fn, batch, getattr(self._service, "_session_id", None))
            if not callable(fn):
                raise ValueError(f"loss_fn must be callable, got {type(loss_fn).__name__}")
            with self._lock, deterministic_kernels(self._device):
                fused = len(self._microbatches(batch)) == 1
                if fused:
                    lp_D = [lp.float().cpu() for lp in self._logprobs(batch)]
                else:
                    with torch.no_grad():
                        lp_D = [lp.float().cpu() for lp in self._logprobs(batch)]
                    lp_D = [lp.requires_grad_(True) for lp in lp_D]
                loss, user_metrics, grads = self._custom_loss_grads(fn, batch, lp_D)
                if fused:
                    torch.autograd.backward(lp_D, list(grads))
                else:
                    for idx in self._microbatches(batch):
                        lp_chunk = self._logprobs([batch[i] for i in idx])
                        g_chunk = [
                            grads[i].to(lp.device) for i, lp in zip(idx, lp_chunk, strict=True)
                        ]
                        torch.autograd.backward(lp_chunk, g_chunk)
                metrics = {str(k): float(v) for k, v in dict(user_metrics or {}).items()}
                metrics["loss:sum"] = float(loss.detach().sum())
            return types.ForwardBackwardOutput(
                loss_fn_output_type="custom",
                loss_fn_outputs=self._outputs(lp_D),
                metrics=metrics,
            )

        return run_eagerly(run)

    @staticmethod
    def _custom_loss_grads(
        loss_fn: CustomLossFn, batch: list[types.Datum], lp_D: list[torch.Tensor]
    ) -> tuple[torch.Tensor, Any, tuple[torch.Tensor, ...]]:
        """Call the user's loss and return (loss, metrics, dL/dlogprobs per datum)."""
        result = loss_fn(batch, lp_D)
        if not (isinstance(result, tuple) and len(result) == 2):
            raise ValueError(
                "custom loss_fn must return (loss: torch.Tensor, metrics: dict[str, "
                f"float]), got {type(result).__name__}"
            )
        loss, user_metrics = result
        if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
            raise ValueError(
                "custom loss_fn returned a loss that is not a differentiable tensor "
                f"({type(loss).__name__}); it must depend on logprobs_list"
            )
        grads = torch.autograd.grad(loss.sum(), lp_D, allow_unused=True, retain_graph=False)
        missing = [i for i, g in enumerate(grads) if g is None]
        if missing:
            raise ValueError(
                f"No gradient computed for logprob tensor (datums {missing}); "
                "touch unused datums with 0 * logprobs.sum()"
            )
        return loss, user_metrics, grads

    @staticmethod
    def _torch_adam_kwargs(p: types.AdamParams) -> dict[str, Any]:
        return {
            "lr": p.learning_rate,
            "betas": (p.beta1, p.beta2),
            "eps": p.eps,
            "weight_decay": p.weight_decay,
        }

    def optim_step(
        self,
        optim_params: types.AdamParams | None = None,
        *,
        adam_params: types.AdamParams | None = None,
    ) -> CompletedFuture[types.OptimStepResponse]:
        """AdamW step with the accumulated gradient, then zero it. Global-norm clipping first
        when `grad_clip_norm > 0`. Parameters without a gradient step with a zero gradient, so
        Adam moments and weight decay advance uniformly. Metrics: `grad_norm:mean` (before
        clipping), `learning_rate:mean`, `step:max`."""

        def run() -> types.OptimStepResponse:
            params = optim_params if optim_params is not None else adam_params
            with self._lock:
                if params is not None:
                    self._adam = check_adam(params, "optim_params")
                for group in self._optimizer.param_groups:
                    group.update(self._torch_adam_kwargs(self._adam))
                for p in self._params:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                norm = torch.linalg.vector_norm(
                    torch.stack([torch.linalg.vector_norm(p.grad.float()) for p in self._params])
                )
                if self._adam.grad_clip_norm > 0:
                    torch.nn.utils.clip_grad_norm_(self._params, self._adam.grad_clip_norm)
                self._optimizer.step()
                self._optimizer.zero_grad(set_to_none=True)
                self._steps += 1
            return types.OptimStepResponse(
                metrics={
                    "grad_norm:mean": float(norm),
                    "learning_rate:mean": float(self._adam.learning_rate),
                    "step:max": float(self._steps),
                }
            )

        return run_eagerly(run)

    # ------------------------------------------------------------------ sampling
    def save_weights_and_get_sampling_client(
        self,
        name: str | None = None,
        retry_config: Any = None,
        record_stability_info: bool = False,
        kind: str = "snapshot",
    ) -> CompletedFuture[Any]:
        """A sampling client on a frozen copy of the current LoRA weights (base weights shared).
        `record_stability_info=True` marks its sequences for stable_reinforce."""

        def run() -> Any:
            with self._lock:
                snapshot = self._snapshot_model()
                self._snapshots += 1
                seed = int(
                    np.random.SeedSequence([self._seed, self._snapshots]).generate_state(1)[0]
                )
                sampler = self._service._make_sampling_client(
                    model=snapshot,
                    base_model=self._base_model,
                    tokenizer=self._tokenizer,
                    seed=seed,
                    label=f"{self._model_id}/snapshot-{self._snapshots}",
                    record_stability_info=record_stability_info,
                )
                self._snapshot_pool = (snapshot, weakref.ref(sampler))
            return sampler

        return client_future(run)

    def _snapshot_model(self) -> torch.nn.Module:
        """A frozen copy of the model: base weights shared, trainable ones copied. The previous
        snapshot's module tree is reused, its trainable values overwritten, once its sampling
        client is gone (no one can see the change): the deep copy of ~500 modules took 0.15 s
        of a Qwen3.5 bench step (2026-12-06), and an RL loop drops each step's sampler."""
        reused = self._reusable_snapshot()
        if reused is not None:
            return reused
        frozen = {id(p): p for p in self._model.parameters() if not p.requires_grad}
        import copy

        snapshot = copy.deepcopy(self._model, frozen)
        for p in snapshot.parameters():
            p.requires_grad_(False)
        snapshot.eval()
        return snapshot

    def _reusable_snapshot(self) -> torch.nn.Module | None:
        """The pooled snapshot model with the current trainable values, when its sampling client
        no longer exists and its trainable parameters match the model's by name and shape (and
        none of them is a tensor the snapshot shares, a weight frozen when it was copied)."""
        if self._snapshot_pool is None or self._snapshot_pool[1]() is not None:
            return None
        snapshot = self._snapshot_pool[0]
        self._snapshot_pool = None
        copies = dict(snapshot.named_parameters())
        trainable = [(n, p) for n, p in self._model.named_parameters() if p.requires_grad]
        if any(
            n not in copies or copies[n] is p or copies[n].shape != p.shape for n, p in trainable
        ):
            return None
        with torch.no_grad():
            for name, p in trainable:
                copies[name].copy_(p)
        return snapshot

    def save_weights_for_sampler(
        self, name: str, ttl_seconds: int | None = None, user_metadata: Any = None
    ) -> CompletedFuture[types.SaveWeightsForSamplerResponse]:
        """Save the LoRA weights only; the path opens with `create_sampling_client(path)`."""

        def run() -> types.SaveWeightsForSamplerResponse:
            path = self._write_checkpoint(name, with_optimizer=False, folder="sampler_weights")
            return types.SaveWeightsForSamplerResponse(path=str(path))

        return run_eagerly(run)

    def create_sampling_client(
        self, model_path: str, retry_config: Any = None, record_stability_info: bool = False
    ) -> Any:
        return self._service.create_sampling_client(
            model_path=model_path, record_stability_info=record_stability_info
        )

    # ------------------------------------------------------------------ checkpoints
    def _checkpoint_dir(self, name: str, folder: str = "") -> Path:
        """`name` itself when absolute, else `<state_dir>/<model_id>/[folder/]<name>` (sampler
        weights go to `sampler_weights/`, so a state and a sampler save of one name coexist,
        as Tinker's `weights/` and `sampler_weights/` paths do)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string, got {name!r}")
        path = Path(name).expanduser()
        if path.is_absolute():
            return path
        if "/" in name or name in (".", ".."):
            raise ValueError(f"name {name!r} must be a plain name or an absolute path")
        return self._service.state_dir / self._model_id / folder / name

    def _write_checkpoint(self, name: str, *, with_optimizer: bool, folder: str = "") -> Path:
        from safetensors.torch import save_file

        target = self._checkpoint_dir(name, folder)
        with self._lock, atomic_dir(target) as tmp:  # an existing target is replaced whole
            save_file(
                {n: t.contiguous() for n, t in self.lora_state().items()},
                str(tmp / "adapter.safetensors"),
            )
            if with_optimizer:
                torch.save(self._optimizer.state_dict(), tmp / "optimizer.pt")
            meta = {
                "format": "losslab-local-checkpoint/1",
                "model_id": self._model_id,
                "user_metadata": self._user_metadata,
                "base_model": self._base_model,
                "rank": self._rank,
                "lora_alpha": LORA_ALPHA,
                "target_modules": self._targets,
                **self._train_flags,
                "seed": self._seed,
                "steps": self._steps,
                "snapshots": self._snapshots,
                "adam_params": adam_dict(self._adam),
                "with_optimizer": with_optimizer,
            }
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        return target

    def save_state(
        self,
        name: str,
        ttl_seconds: int | None = None,
        overwrite: bool = False,
        user_metadata: Any = None,
    ) -> CompletedFuture[types.SaveWeightsResponse]:
        """Save LoRA weights + AdamW state + step counters to `<state_dir>/<model_id>/<name>`
        (or to `name` itself when it is an absolute path); `.path` is that directory."""

        def run() -> types.SaveWeightsResponse:
            target = self._checkpoint_dir(name)
            if target.exists() and not overwrite and (target / "meta.json").exists():
                raise ValueError(f"checkpoint {target} exists; pass overwrite=True to replace it")
            return types.SaveWeightsResponse(
                path=str(self._write_checkpoint(name, with_optimizer=True))
            )

        return run_eagerly(run)

    def load_state(
        self, path: str, weights_access_token: str | None = None
    ) -> CompletedFuture[Any]:
        """Load weights and optimizer state saved by `save_state` (continues identically)."""
        return run_eagerly(lambda: self._load(path, with_optimizer=True))

    def load_state_with_optimizer(self, path: str, weights_access_token: str | None = None):
        return self.load_state(path)

    def _load(self, path: str, *, with_optimizer: bool) -> types.LoadWeightsResponse:
        from safetensors.torch import load_file

        root = Path(str(path)).expanduser()
        meta_path = root / "meta.json"
        if not meta_path.is_file():
            raise ValueError(f"path {path!r} is not a local checkpoint (no meta.json)")
        meta = json.loads(meta_path.read_text())
        for key, mine in (("base_model", self._base_model), ("rank", self._rank)):
            if meta.get(key) != mine:
                raise ValueError(
                    f"checkpoint {path!r} has {key}={meta.get(key)!r} but this client has {mine!r}"
                )
        if meta.get("target_modules") != self._targets:
            raise ValueError(
                f"checkpoint {path!r} adapts {meta.get('target_modules')} but this client "
                f"adapts {self._targets}"
            )
        tensors = load_file(str(root / "adapter.safetensors"))
        with self._lock, torch.no_grad():
            if set(tensors) != set(self._param_names):
                raise ValueError(f"checkpoint {path!r} LoRA tensor names do not match this model")
            for n, p in zip(self._param_names, self._params, strict=True):
                p.copy_(tensors[n].to(p.device, p.dtype))
                p.grad = None
            self._steps = int(meta.get("steps", 0))
            self._snapshots = int(meta.get("snapshots", 0))
            self._adam = types.AdamParams(**meta["adam_params"])
            if with_optimizer:
                opt_path = root / "optimizer.pt"
                if not opt_path.is_file():
                    raise ValueError(f"checkpoint {path!r} has no optimizer state")
                state = torch.load(opt_path, map_location=self._device, weights_only=True)
                self._optimizer.load_state_dict(state)
            else:
                self._optimizer = torch.optim.AdamW(
                    self._params, **self._torch_adam_kwargs(self._adam)
                )
        return types.LoadWeightsResponse(path=str(root))
