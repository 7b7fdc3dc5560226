"""Subprocess entry point: execute extracted pinned reference source on a fixture.

Run as `python -I pinned_runner.py INPUT.json OUTPUT.json` by `losslab.conformance.pinned`; it
imports only the standard library and torch (never losslab), disables sockets, executes the
extracted definitions unchanged, calls the reference through a layout adapter and writes the
loss, per-sequence losses and the gradient w.r.t. current log-probs as JSON.
"""

from __future__ import annotations

import builtins
import inspect
import json
import socket
import sys
import types
from typing import Any


def _no_network(*args: Any, **kwargs: Any) -> Any:
    raise OSError("network access is disabled while running pinned reference source")


def _load(payload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spaces: dict[str, dict[str, Any]] = {}
    for mod in payload["modules"]:
        g: dict[str, Any] = {"__name__": f"pinned.{mod['module']}", "__builtins__": builtins}
        for b in mod["bindings"]:
            src = spaces[b["module"]]
            if b["kind"] == "namespace":
                g[b["name"]] = types.SimpleNamespace(**{a: src[a] for a in b["attrs"]})
            else:
                g[b["name"]] = src[b["attr"]]
        code = (
            "from __future__ import annotations\n" + "\n".join(mod["imports"]) + "\n" + mod["code"]
        )
        exec(compile(code, f"<pinned {mod['path']}>", "exec"), g)  # noqa: S102 - user-pointed source
        spaces[mod["module"]] = g
    return spaces


class _Config:
    """Attribute-and-`.get` config standing in for verl's ActorConfig (only the fields set)."""

    def __init__(self, fields: dict[str, Any]) -> None:
        self.__dict__.update(fields)

    def get(self, key: str, default: Any = None) -> Any:
        return self.__dict__.get(key, default)

    def __getitem__(self, key: str) -> Any:
        return self.__dict__[key]


def _call(fn: Any, kwargs: dict[str, Any]) -> Any:
    accepted = inspect.signature(fn).parameters
    return fn(**{k: v for k, v in kwargs.items() if k in accepted})


def _first(result: Any) -> Any:
    return result[0] if isinstance(result, (tuple, list)) else result


def _verl_padded(fn: Any, payload: dict[str, Any]) -> dict[str, Any]:
    import torch

    seqs, p = payload["sequences"], payload["params"]
    width = max(len(s["sampler_logprobs"]) for s in seqs)

    def pad(rows: list[list[float]]) -> torch.Tensor:
        out = torch.zeros(len(rows), width, dtype=torch.float32)  # [B, T]
        for i, row in enumerate(rows):
            out[i, : len(row)] = torch.tensor(row, dtype=torch.float32)
        return out

    config = _Config(payload["config_fields"])

    def run(idx: list[int]) -> tuple[Any, Any, dict[str, float]]:
        rows = [seqs[i] for i in idx]
        log_prob = pad([r["current_logprobs"] for r in rows]).requires_grad_(True)
        rollout = pad([r["sampler_logprobs"] for r in rows])
        mask = pad([r["loss_mask"] for r in rows])
        adv = mask * torch.tensor([r["advantage"] for r in rows], dtype=torch.float32)[:, None]
        zeros = torch.zeros_like(rollout)
        result = _call(
            fn,
            {
                "old_log_prob": rollout,
                "log_prob": log_prob,
                "advantages": adv,
                "response_mask": mask,
                "loss_agg_mode": p["loss_agg_mode"],
                "config": config,
                "rollout_is_weights": None,
                "rollout_log_prob": rollout,
                "topk_kl": zeros,
                "topk_tv": zeros,
                "entropy": zeros,
                "loss_mode": p["loss_mode"],
            },
        )
        loss = _first(result)
        (grad,) = torch.autograd.grad(loss, log_prob)
        metrics = result[1] if isinstance(result, (tuple, list)) and len(result) > 1 else {}
        native = {k: float(v) for k, v in dict(metrics).items() if isinstance(v, (int, float))}
        return loss, grad, native

    loss, grad, native = run(list(range(len(seqs))))
    per_seq = [float(run([i])[0]) for i in range(len(seqs))]
    return {
        "loss": float(loss),
        "per_sequence_loss": per_seq,
        "native_metrics": native,
        "grad_D": [grad[i, : len(s["sampler_logprobs"])].tolist() for i, s in enumerate(seqs)],
    }


def _spindle_packed(fn: Any, payload: dict[str, Any], spaces: dict[str, Any]) -> dict[str, Any]:
    import torch

    seqs, p = payload["sequences"], payload["params"]
    config = dict(p["loss_config"])
    if "_loss_config" in payload["extra_roots"]:  # the reference's own validation
        config = spaces["_loss_config"](
            p["loss_name"], {k: v for k, v in config.items() if k in payload["raw_config_keys"]}
        )

    def cat(idx: list[int], key: str) -> torch.Tensor:
        return torch.tensor([x for i in idx for x in seqs[i][key]], dtype=torch.float32)

    def run(idx: list[int]) -> tuple[Any, Any]:
        logprobs = cat(idx, "current_logprobs").requires_grad_(True)  # packed [sum L]
        mask = cat(idx, "loss_mask")
        adv = torch.tensor(
            [seqs[i]["advantage"] * m for i in idx for m in seqs[i]["loss_mask"]],
            dtype=torch.float32,
        )
        batch = {
            "loss_mask": mask,
            "sampling_logprobs": cat(idx, "sampler_logprobs"),
            "advantages": adv,
            "loss_name": p["loss_name"],
            "loss_config": config,
        }
        loss = _first(fn(logprobs, batch))
        (grad,) = torch.autograd.grad(loss, logprobs)
        return loss, grad

    loss, grad = run(list(range(len(seqs))))
    per_seq = [float(run([i])[0]) for i in range(len(seqs))]
    grads, start = [], 0
    for s in seqs:
        n = len(s["sampler_logprobs"])
        grads.append(grad[start : start + n].tolist())
        start += n
    return {
        "loss": float(loss),
        "per_sequence_loss": per_seq,
        "grad_D": grads,
        "native_metrics": {},
    }


def main(argv: list[str]) -> int:
    with open(argv[1], encoding="utf-8") as fh:
        payload = json.load(fh)
    import torch

    for name in ("connect", "connect_ex", "sendto", "bind"):
        setattr(socket.socket, name, _no_network)
    socket.create_connection = _no_network  # type: ignore[assignment]

    torch.manual_seed(0)
    torch.set_num_threads(1)
    spaces = _load(payload)
    root = spaces[payload["root_module"]]
    fn = root[payload["function"]]
    if payload["adapter"] == "verl_padded":
        out = _verl_padded(fn, payload)
    elif payload["adapter"] == "spindle_packed":
        out = _spindle_packed(fn, payload, root)
    else:
        raise SystemExit(f"unknown adapter {payload['adapter']!r}")
    with open(argv[2], "w", encoding="utf-8") as fh:
        json.dump(out, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
