"""Subprocess entry point: execute extracted pinned reference source on a fixture.

Run as `python -I pinned_runner.py INPUT.json OUTPUT.json` by `losslab.conformance.pinned`; it
imports only the standard library and torch (never losslab), disables sockets, executes the
extracted definitions unchanged, calls the reference through its framework's layout adapter
(the text of `call_reference` from `losslab.conformance.frameworks.<name>`, sent in the payload)
and writes the loss, per-sequence losses and the gradient w.r.t. current log-probs as JSON.

The adapter is called as `call_reference(fn, payload, space, rt)`: `fn` the pinned function,
`space` the executed namespace of the reference file (for extra roots), and `rt` the
helpers below (`rt.pad`, `rt.Config`, `rt.call`, `rt.first`, `rt.split`, `rt.numeric`,
`rt.padded_outputs`). Its text is compiled alone (`adapter_code`) and executed with builtins
only, so it must be self-contained; `frameworks.base.Framework` checks that with the same
`adapter_code` when a framework is defined.
"""

from __future__ import annotations
import __future__

import builtins
import inspect
import json
import socket
import sys
import types
from typing import Any


def _no_network(*args: Any, **kwargs: Any) -> Any:
    raise OSError("network access is disabled while running pinned reference source")


class _Stub:
    """An inert stand-in for a heavy/type-only module (ray, loguru, jaxtyping, ...): attribute
    access, calls, subscripts and decorators give stubs back, so module-level uses at definition
    time work; anything that relies on a real value fails visibly further on."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> _Stub:
        return _Stub(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:  # used as a decorator
            return args[0]
        return _Stub(f"{self._name}(...)")

    def __getitem__(self, item: Any) -> _Stub:
        return _Stub(f"{self._name}[...]")

    def __repr__(self) -> str:
        return f"<losslab stub for {self._name}>"


def _load(payload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spaces: dict[str, dict[str, Any]] = {}
    for mod in payload["modules"]:
        # a real module object in sys.modules: dataclasses looks the defining module up there
        module = types.ModuleType(f"pinned.{mod['module']}")
        sys.modules[module.__name__] = module
        g: dict[str, Any] = module.__dict__
        g["__builtins__"] = builtins
        for b in mod["bindings"]:
            if b["kind"] == "stub":
                g[b["name"]] = _Stub(b["module"])
            elif b["kind"] == "stub_class":
                g[b["name"]] = type(b["name"], (), {"__doc__": "losslab type-only stub"})
            elif b["kind"] == "namespace":
                src = spaces[b["module"]]
                g[b["name"]] = types.SimpleNamespace(**{a: src[a] for a in b["attrs"]})
            else:
                g[b["name"]] = spaces[b["module"]][b["attr"]]
        code = (
            "from __future__ import annotations\n" + "\n".join(mod["imports"]) + "\n" + mod["code"]
        )
        exec(compile(code, f"<pinned {mod['path']}>", "exec"), g)  # noqa: S102 - user-pointed source
        spaces[mod["module"]] = g
    return spaces


class Config:
    """Attribute-and-`.get` config standing in for a framework's config object (`rt.Config`, and
    the `config` of a researcher's verl-layout loss, `conformance.user_loss`); nested dicts
    become nested configs (SkyRL's `config.dppo.delta_low`), verl's batch info stays a dict."""

    def __init__(self, fields: dict[str, Any]) -> None:
        for key, value in fields.items():
            self.__dict__[key] = (
                Config(value) if isinstance(value, dict) and key != ("global_batch_info") else value
            )

    def get(self, key: str, default: Any = None) -> Any:
        return self.__dict__.get(key, default)

    def __getitem__(self, key: str) -> Any:
        return self.__dict__[key]

    def __contains__(self, key: str) -> bool:
        return key in self.__dict__


def _call(fn: Any, kwargs: dict[str, Any]) -> Any:
    accepted = inspect.signature(fn).parameters
    return fn(**{k: v for k, v in kwargs.items() if k in accepted})


def _first(result: Any) -> Any:
    if isinstance(result, (tuple, list)):
        return result[0]
    return getattr(result, "loss", result)


def _pad(rows: list[list[float]], width: int) -> Any:
    import torch

    out = torch.zeros(len(rows), width, dtype=torch.float32)  # [B, T]
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.float32)
    return out


def _batch(rows: list[dict[str, Any]], width: int) -> types.SimpleNamespace:
    """The fixture rows as padded [B, T] tensors, as every padded adapter feeds its framework:
    `current` (the leaf the gradient is taken of), `sampler`, `old` (the old log-probs, the
    sampler's where a row has none), `mask`, and `advantages` (the row's advantage on its loss
    tokens, 0 elsewhere)."""
    import torch

    mask = _pad([r["loss_mask"] for r in rows], width)
    return types.SimpleNamespace(
        current=_pad([r["current_logprobs"] for r in rows], width).requires_grad_(True),
        sampler=_pad([r["sampler_logprobs"] for r in rows], width),
        old=_pad([r.get("old_logprobs") or r["sampler_logprobs"] for r in rows], width),
        mask=mask,
        advantages=mask
        * torch.tensor([r["advantage"] for r in rows], dtype=torch.float32)[:, None],
    )


def _grad(loss: Any, leaf: Any) -> Any:
    """d loss / d leaf, zeros where the loss does not depend on the leaf at all (a fully masked
    batch, a per-sequence call on a sequence without loss tokens)."""
    import torch

    (grad,) = torch.autograd.grad(loss, leaf, allow_unused=True)
    return torch.zeros_like(leaf) if grad is None else grad


def _split(flat: Any, lengths: list[int]) -> list[list[float]]:
    out, start = [], 0
    for n in lengths:
        out.append(flat[start : start + n].tolist())
        start += n
    return out


def _numeric(metrics: Any) -> dict[str, float]:
    """A reference's own scalar metrics (its names), for the report's native-metrics column."""
    return {k: float(v) for k, v in dict(metrics).items() if isinstance(v, (int, float))}


def _padded_outputs(run: Any, seqs: list[dict[str, Any]]) -> dict[str, Any]:
    """The output of a padded-[B, T] adapter: `run(indices) -> (loss, grad_B_T, native)` on the
    whole batch, then on each sequence alone for its per-sequence loss."""
    loss, grad, native = run(list(range(len(seqs))))
    per_seq = [float(run([i])[0]) for i in range(len(seqs))]
    return {
        "loss": float(loss),
        "per_sequence_loss": per_seq,
        "native_metrics": native,
        "grad_D": [grad[i, : len(s["sampler_logprobs"])].tolist() for i, s in enumerate(seqs)],
    }


RUNTIME = types.SimpleNamespace(
    pad=_pad,
    batch=_batch,
    grad=_grad,
    Config=Config,
    call=_call,
    first=_first,
    split=_split,
    numeric=_numeric,
    padded_outputs=_padded_outputs,
)


def adapter_code(source: str) -> types.CodeType:
    """An adapter's `call_reference` text compiled as it runs here: alone, with lazy annotations
    (so type hints name nothing), to be executed in a namespace holding only builtins."""
    flags = __future__.annotations.compiler_flag
    return compile(source, "<losslab adapter>", "exec", flags=flags, dont_inherit=True)


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
    adapter: dict[str, Any] = {"__builtins__": builtins}
    exec(adapter_code(payload["call_source"]), adapter)  # noqa: S102
    out = adapter[payload["call_name"]](fn, payload, root, RUNTIME)
    with open(argv[2], "w", encoding="utf-8") as fh:
        json.dump(out, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
