"""Reading `tinker.Datum`s into tensors, with errors that name the datum and field."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import torch
from tinker import types

# Keys each built-in loss reads (besides target_tokens); config keys it accepts. Mirrors the
# Tinker docs table (https://tinker-docs.thinkingmachines.ai/losses).
BUILTIN_INPUTS: dict[str, tuple[str, ...]] = {
    "cross_entropy": ("weights",),
    "importance_sampling": ("logprobs", "advantages"),
    "ppo": ("logprobs", "advantages"),
    "cispo": ("logprobs", "advantages"),
    "dro": ("logprobs", "advantages"),
    "gspo": ("logprobs", "advantages", "sequence_ratio_mask"),
    "stable_reinforce": ("logprobs", "advantages"),
}
BUILTIN_CONFIG: dict[str, tuple[str, ...]] = {
    "cross_entropy": (),
    "importance_sampling": (),
    "ppo": ("clip_low_threshold", "clip_high_threshold"),
    "cispo": ("clip_low_threshold", "clip_high_threshold"),
    "dro": ("beta",),
    "gspo": ("clip_low_threshold", "clip_high_threshold"),
    "stable_reinforce": ("kl_coeff",),
}


def check_data(data: Sequence[types.Datum], arg: str = "data") -> list[types.Datum]:
    if not isinstance(data, Sequence) or isinstance(data, str | bytes):
        raise ValueError(f"{arg} must be a list of tinker.types.Datum, got {type(data).__name__}")
    if len(data) == 0:
        raise ValueError(f"{arg} is empty; expected at least one tinker.types.Datum")
    for i, d in enumerate(data):
        if not isinstance(d, types.Datum):
            raise ValueError(f"{arg}[{i}] is {type(d).__name__}, expected tinker.types.Datum")
    return list(data)


def datum_tokens(datum: types.Datum, index: int) -> tuple[list[int], torch.Tensor]:
    """(input token ids, target ids (N,)) of one datum, validated to the same length N."""
    try:
        inputs = datum.model_input.to_ints()
    except Exception as exc:  # image chunks etc.
        raise ValueError(
            f"data[{index}].model_input cannot be read as token ids ({exc}); the local backend "
            "supports encoded-text chunks only"
        ) from exc
    if "target_tokens" not in datum.loss_fn_inputs:
        raise ValueError(
            f"data[{index}].loss_fn_inputs has no 'target_tokens' "
            f"(keys: {sorted(datum.loss_fn_inputs)}); expected targets aligned with model_input"
        )
    targets = datum.loss_fn_inputs["target_tokens"].to_torch()
    if targets.dim() != 1:
        raise ValueError(
            f"data[{index}].loss_fn_inputs['target_tokens'] has shape {tuple(targets.shape)}; "
            "the local backend supports 1-D targets (N,) only (no multi-target (N, K))"
        )
    if targets.shape[0] != len(inputs):
        raise ValueError(
            f"data[{index}]: target_tokens has length {targets.shape[0]} but model_input has "
            f"{len(inputs)} tokens; expected equal lengths (targets = full[1:], input = full[:-1])"
        )
    if len(inputs) == 0:
        raise ValueError(f"data[{index}].model_input is empty; expected at least one token")
    return inputs, targets.to(torch.long)


def check_vocab(inputs: list[list[int]], targets: list[torch.Tensor], vocab_size: int) -> None:
    for i, (x, y) in enumerate(zip(inputs, targets, strict=True)):
        bad = [t for t in x if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(
                f"data[{i}].model_input has token id {bad[0]} outside the vocabulary "
                f"[0, {vocab_size})"
            )
        if y.numel() and (int(y.min()) < 0 or int(y.max()) >= vocab_size):
            raise ValueError(
                f"data[{i}].target_tokens has an id outside the vocabulary [0, {vocab_size}): "
                f"min {int(y.min())}, max {int(y.max())}"
            )


def check_builtin(
    loss_fn: str, data: list[types.Datum], loss_fn_config: Mapping[str, float] | None
) -> dict[str, float]:
    """Validate a built-in loss name, its inputs and config; return the config as floats."""
    if loss_fn not in BUILTIN_INPUTS:
        raise ValueError(
            f"loss_fn {loss_fn!r} is not a built-in loss of the local backend; expected one of "
            f"{sorted(BUILTIN_INPUTS)} (use forward_backward_custom for anything else)"
        )
    config = dict(loss_fn_config or {})
    allowed = BUILTIN_CONFIG[loss_fn]
    for key, value in config.items():
        if key not in allowed:
            raise ValueError(
                f"loss_fn_config key {key!r} is not accepted by {loss_fn!r}; "
                f"expected keys {list(allowed) or 'none'}"
            )
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise ValueError(f"loss_fn_config[{key!r}] = {value!r}; expected a number")
    required = BUILTIN_INPUTS[loss_fn]
    for i, d in enumerate(data):
        for key in required:
            if key == "weights" and loss_fn == "cross_entropy":
                continue  # missing weights read as ones below, like a plain NLL
            if key not in d.loss_fn_inputs:
                raise ValueError(
                    f"data[{i}].loss_fn_inputs has no {key!r} (keys: "
                    f"{sorted(d.loss_fn_inputs)}); loss_fn {loss_fn!r} needs {list(required)}"
                )
    return {k: float(v) for k, v in config.items()}


def tinker_visible(datum: types.Datum, loss_fn: str) -> types.Datum:
    """The datum as a built-in loss on the Tinker service sees it: `target_tokens` plus the keys
    that loss reads. Client-only keys (`mask`, `old_logprobs`, ...) are dropped, as the cookbook's
    `_remove_mask` does before `forward_backward`; provenance spans are kept (stable_reinforce
    reads them)."""
    keep = ("target_tokens", *BUILTIN_INPUTS[loss_fn])
    return dataclasses.replace(
        datum, loss_fn_inputs={k: v for k, v in datum.loss_fn_inputs.items() if k in keep}
    )
