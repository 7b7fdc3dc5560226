"""The executed configuration: what a training client says it runs, held against the plan.

Read from the client before its first step (`get_info()`: base model and LoRA rank;
`optimizer_config()`: the AdamW values the next `optim_step` uses), so a service that silently
serves another model or ignores the planned optimizer stops the run before it trains.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from losslab.backends.restoration import OPTIMIZER_KEYS
from losslab.checks import Check, PhaseResult


def compare_config(
    values: Mapping[str, Mapping[str, Any]],
    arm: str,
    reported: Mapping[str, Any] | None = None,
) -> PhaseResult:
    """`{key: {"plan", "executed"}}` -> the arm's record (each entry gains `match`) and one
    check `<arm>.<key>` per entry: the executed value must equal the planned one. `reported`
    values (what the backend says it runs where the plan names nothing, e.g. its kernels) join
    the record with `plan` and `match` None and no check."""
    record = {k: {**v, "match": v.get("plan") == v.get("executed")} for k, v in values.items()}
    checks = [
        Check(f"{arm}.{k}", v.get("executed"), f"== {v.get('plan')!r} (the plan)", v["match"])
        for k, v in record.items()
    ]
    for key, value in (reported or {}).items():
        record[key] = {"plan": None, "executed": value, "match": None}
    return PhaseResult(record, checks=checks)


def reported_by_backend(client: Any) -> dict[str, str]:
    """`{"kernel.<function>": implementation}` from the client's `describe()` where it names
    the kernels its linear-attention layers dispatch to (the local backend on a Gated-DeltaNet
    model: flash-linear-attention / causal-conv1d on CUDA when installed, else torch paths),
    and `cpu_allocator` where it says which pages its CPU tensors get (the local backend on the
    CPU: `memory.cpu_allocator`); empty for a client that reports none (Tinker)."""
    describe = getattr(client, "describe", None)
    if not callable(describe):
        return {}
    described = describe()
    kernels = described.get("linear_attention_kernels") or {}
    rows = {f"kernel.{name}": str(impl) for name, impl in kernels.items()}
    if described.get("cpu_allocator"):
        rows["cpu_allocator"] = str(described["cpu_allocator"])
    return rows


def executed_config(
    client: Any, arm: str, *, base_model: str, lora_rank: int, adam: Mapping[str, Any]
) -> PhaseResult:
    """The arm's executed configuration (base model, LoRA rank and, where the client reports
    it, AdamW's `OPTIMIZER_KEYS`) against the planned `base_model`, `lora_rank` and `adam`."""
    info = client.get_info()
    model_data = getattr(info, "model_data", None)
    executed_model = getattr(model_data, "model_name", None) or getattr(info, "model_name", None)
    values: dict[str, dict[str, Any]] = {
        "base_model": {"plan": base_model, "executed": executed_model},
        "lora_rank": {"plan": lora_rank, "executed": getattr(info, "lora_rank", None)},
    }
    read_back = getattr(client, "optimizer_config", None)
    if callable(read_back):
        actual = read_back()
        for key in OPTIMIZER_KEYS:
            values[f"adam.{key}"] = {"plan": adam[key], "executed": actual.get(key)}
    return compare_config(values, arm, reported_by_backend(client))
