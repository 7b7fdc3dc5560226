"""Dispatch fingerprint: the backend computes, on the backend itself, the loss the plan declares.

The correctness preflight checks the loss OBJECTS on fixtures, on this machine. What the arms
actually train is whatever the backend executes when the arm's loss is dispatched: the custom
loss on the log-probs the backend hands it, or, with `engine.loss_path: builtin`, the server's
own built-in named by a string (`forward_backward(data, "ppo", {"clip_low_threshold": ...})`),
which nothing else in losslab can see into. Before the pilot, each arm's path runs ONE
forward-backward on a small probe batch and the result is compared with the declared objective
computed client-side:

* custom path: the log-probs the backend hands the loss equal a plain `forward`'s, the per-token
  gradient weights it backpropagates (dL/dℓ, the weights the SDK sends back) equal the declared
  loss's gradient on the probe as built here, and its `loss:sum` equals the declared value;
* built-in path: the backend reports no gradient, so the per-token losses are compared: its
  `elementwise_loss` where it returns one (SkyRL's server does), else its `loss:sum`, and on a
  mismatch one no-gradient `forward` per loss token, each with only that token live, finds the
  first differing token.

The probe: three short sequences of fixed token ids (< 256, valid in every vocabulary), the first
`PROMPT_TARGETS` targets a prompt (advantage 0, weight 0), sampler log-probs set from the
backend's own log-probs so the ratios e^(ℓ − q) are `PROBE_RATIOS` (inside, near and beyond the
usual clip bounds 0.8 / 1.2 on both sides), advantages +1, −1, +0.5. A built-in `ppo` with other
clip bounds, a per-sequence mean instead of Tinker's sum, a dropped mask: each changes a token.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tinker import types

from losslab.checks import Check, PhaseResult
from losslab.losses import TokenData, as_tinker_loss_fn

__all__ = [
    "PROBE_RATIOS",
    "PROBE_TOKENS",
    "FingerprintResult",
    "dispatch_phase",
    "fingerprint",
    "probe_datums",
]

PROBE_TOKENS: tuple[tuple[int, ...], ...] = (
    tuple(range(10, 22)),
    (5, 77, 200, 3, 9, 250, 100, 41, 12, 13),
    tuple(range(100, 111)),
)
PROMPT_TARGETS = 3
PROBE_RATIOS = (0.5, 0.85, 0.95, 1.05, 1.15, 1.5, 2.0, 0.7)
PROBE_ADVANTAGES = (1.0, -1.0, 0.5)
LOGPROB_ATOL = 1e-3
"""Log-probs handed to the custom loss vs a plain forward's (the same weights, the same tokens;
measured 0 on the local backend, float32 round-off on SkyRL's server)."""
RTOL, ATOL = 1e-4, 1e-5
"""Declared vs executed loss values and gradient weights (float32 on both sides)."""


@dataclass(frozen=True)
class FingerprintResult:
    """One arm's fingerprint: what ran, whether it matched, and the first differing token."""

    arm: str
    path: str  # "custom" or "builtin:<loss_fn>"
    passed: bool
    measured: dict[str, Any]
    first_difference: tuple[int, int] | None
    note: str

    def check(self) -> Check:
        bound = f"log-probs atol {LOGPROB_ATOL:g}; values rtol {RTOL:g}, atol {ATOL:g}"
        return Check(f"{self.arm}.dispatch", self.measured, bound, self.passed, self.note)


def _tensor(values: Sequence[float]) -> types.TensorData:
    return types.TensorData.from_torch(torch.tensor(list(values), dtype=torch.float32))


def _plain_datums() -> list[types.Datum]:
    return [
        types.Datum(
            model_input=types.ModelInput.from_ints(list(tokens[:-1])),
            loss_fn_inputs={
                "target_tokens": types.TensorData.from_torch(torch.tensor(list(tokens[1:])))
            },
        )
        for tokens in PROBE_TOKENS
    ]


def probe_datums(
    logprobs_D: Sequence[torch.Tensor], live: tuple[int, int] | None = None
) -> list[types.Datum]:
    """The RL probe on top of the backend's log-probs `logprobs_D` (module docstring).

    With `live=(d, t)` only target t of datum d carries its advantage, weight and off-policy
    sampler log-prob; every other target has advantage 0, weight 0 and q = ℓ, so it adds 0 to
    every built-in's loss (the per-token probes of a built-in mismatch).
    """
    out = []
    for d, (tokens, lp_T) in enumerate(zip(PROBE_TOKENS, logprobs_D, strict=True)):
        n = len(tokens) - 1
        lp = [float(x) for x in lp_T.reshape(-1)]
        q, adv, weights = [], [], []
        for t in range(n):
            response = t >= PROMPT_TARGETS
            on = response and (live is None or live == (d, t))
            r = PROBE_RATIOS[(t - PROMPT_TARGETS + d) % len(PROBE_RATIOS)]
            if on:
                q.append(lp[t] - math.log(r))
            else:
                q.append(lp[t] if live is not None else 0.0)
            adv.append(PROBE_ADVANTAGES[d] if on else 0.0)
            weights.append(1.0 if on else 0.0)
        out.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(list(tokens[:-1])),
                loss_fn_inputs={
                    "target_tokens": types.TensorData.from_torch(torch.tensor(list(tokens[1:]))),
                    "logprobs": _tensor(q),
                    "advantages": _tensor(adv),
                    "weights": _tensor(weights),
                },
            )
        )
    return out


def _output_logprobs(result: Any) -> list[torch.Tensor]:
    return [o["logprobs"].to_torch().to(torch.float32).reshape(-1) for o in result.loss_fn_outputs]


def _declared(
    loss: Callable[..., Any], data: list[types.Datum], logprobs_D: Sequence[torch.Tensor]
) -> tuple[float, list[torch.Tensor]]:
    """(value, per-datum dL/dℓ) of the declared loss on `data` at `logprobs_D`, client-side."""
    lp_D = [x.detach().clone().to(torch.float32).requires_grad_(True) for x in logprobs_D]
    batch = TokenData.from_datums(
        data, lp_D, require_policy_inputs=getattr(loss, "needs_policy_inputs", True)
    )
    value = loss(batch).loss
    grads = torch.autograd.grad(value, lp_D, allow_unused=True)
    grad_D = [
        torch.zeros_like(x) if g is None else g.detach() for g, x in zip(grads, lp_D, strict=True)
    ]
    return float(value.detach()), grad_D


def _first_mismatch(
    ours_D: Sequence[torch.Tensor], theirs_D: Sequence[torch.Tensor], atol: float, rtol: float
) -> tuple[tuple[int, int] | None, float]:
    """(first (datum, token) outside atol + rtol·|ours|, max |difference|)."""
    first, worst = None, 0.0
    for d, (a, b) in enumerate(zip(ours_D, theirs_D, strict=True)):
        a, b = a.double().reshape(-1), b.double().reshape(-1)
        if a.shape != b.shape:
            return (d, min(len(a), len(b))), math.inf
        diff = (a - b).abs()
        worst = max(worst, float(diff.max()) if diff.numel() else 0.0)
        bad = ~(diff <= atol + rtol * a.abs())
        if first is None and bool(bad.any()):
            first = (d, int(bad.nonzero()[0, 0]))
    return first, worst


def _value_ok(ours: float, theirs: float) -> bool:
    return math.isfinite(theirs) and abs(ours - theirs) <= ATOL + RTOL * abs(ours)


def _result(
    arm: str, path: str, label: str, measured: dict[str, Any], first: tuple[int, int] | None,
    what: str,
) -> FingerprintResult:  # fmt: skip
    if first is None and not what:
        note = f"the backend's {path} path computes the declared {label}"
        return FingerprintResult(arm, path, True, measured, None, note)
    where = f" first at datum {first[0]} token {first[1]}" if first else ""
    note = f"arm {arm!r}: the backend's {path} path is not the declared {label}:{where} ({what})"
    return FingerprintResult(arm, path, False, measured, first, note)


def _custom(arm: str, client: Any, loss: Any, label: str) -> FingerprintResult:
    forward_lp_D = _output_logprobs(client.forward(_plain_datums(), "cross_entropy").result())
    data = probe_datums(forward_lp_D)
    custom = as_tinker_loss_fn(loss)
    seen: dict[str, Any] = {}

    def capture(batch: list[types.Datum], logprobs_list: list[torch.Tensor]) -> Any:
        value, metrics = custom(batch, logprobs_list)
        grads = torch.autograd.grad(value, logprobs_list, retain_graph=True, allow_unused=True)
        seen["logprobs"] = [x.detach().clone() for x in logprobs_list]
        seen["weights"] = [
            torch.zeros_like(x) if g is None else g.detach()
            for g, x in zip(grads, logprobs_list, strict=True)
        ]
        return value, metrics

    result = client.forward_backward_custom(data, capture).result()
    if "logprobs" not in seen:
        return _result(arm, "custom", label, {}, None, "the backend never called the loss")
    want_value, want_grad_D = _declared(loss, data, forward_lp_D)
    lp_first, lp_err = _first_mismatch(forward_lp_D, seen["logprobs"], LOGPROB_ATOL, 0.0)
    g_first, g_err = _first_mismatch(want_grad_D, seen["weights"], ATOL, RTOL)
    reported = float((getattr(result, "metrics", None) or {}).get("loss:sum", math.nan))
    measured = {
        "path": "custom",
        "logprob_max_abs_diff": lp_err,
        "gradient_weight_max_abs_diff": g_err,
        "loss_sum": reported,
        "declared_loss": want_value,
    }
    if lp_first is not None:
        what = f"the log-probs handed to the loss differ from a forward's by up to {lp_err:.3g}"
        return _result(arm, "custom", label, measured, lp_first, what)
    if g_first is not None:
        d, t = g_first
        what = (
            f"gradient weight {float(seen['weights'][d][t]):.6g}, declared "
            f"{float(want_grad_D[d][t]):.6g}"
        )
        return _result(arm, "custom", label, measured, g_first, what)
    if math.isfinite(reported) and not _value_ok(want_value, reported):
        what = f"loss:sum {reported:.6g}, declared {want_value:.6g}"
        return _result(arm, "custom", label, measured, None, what)
    return _result(arm, "custom", label, measured, None, "")


def _per_token_declared(
    loss: Any, forward_lp_D: Sequence[torch.Tensor], lp_D: Sequence[torch.Tensor]
) -> list[torch.Tensor]:
    """The declared per-token losses: the (summed) loss with one target live at a time."""
    out = []
    for d, tokens in enumerate(PROBE_TOKENS):
        row = torch.zeros(len(tokens) - 1)
        for t in range(PROMPT_TARGETS, len(tokens) - 1):
            data = probe_datums(forward_lp_D, live=(d, t))
            row[t] = _declared(loss, data, lp_D)[0]
        out.append(row)
    return out


def _builtin(
    arm: str, client: Any, loss: Any, label: str, request: tuple[str, Mapping[str, float]]
) -> FingerprintResult:
    loss_fn, config = request
    path = f"builtin:{loss_fn}"
    forward_lp_D = _output_logprobs(client.forward(_plain_datums(), "cross_entropy").result())
    data = probe_datums(forward_lp_D)
    result = client.forward_backward(data, loss_fn, dict(config)).result()
    lp_D = _output_logprobs(result)
    want_value, _ = _declared(loss, data, lp_D)
    reported = float((getattr(result, "metrics", None) or {}).get("loss:sum", math.nan))
    measured: dict[str, Any] = {
        "path": path,
        "loss_fn_config": dict(config),
        "loss_sum": reported,
        "declared_loss": want_value,
    }
    outputs = result.loss_fn_outputs
    if all("elementwise_loss" in o for o in outputs):
        theirs_D = [o["elementwise_loss"].to_torch().to(torch.float32).reshape(-1) for o in outputs]
        ours_D = _per_token_declared(loss, forward_lp_D, lp_D)
        first, err = _first_mismatch(ours_D, theirs_D, ATOL, RTOL)
        measured["elementwise_max_abs_diff"] = err
        if first is not None:
            d, t = first
            what = (
                f"elementwise loss {float(theirs_D[d][t]):.6g}, declared {float(ours_D[d][t]):.6g}"
            )
            return _result(arm, path, label, measured, first, what)
        return _result(arm, path, label, measured, None, "")
    if _value_ok(want_value, reported):
        return _result(arm, path, label, measured, None, "")
    what = f"loss:sum {reported:.6g}, declared {want_value:.6g}"
    for d, tokens in enumerate(PROBE_TOKENS):  # locate: one live token per no-gradient forward
        for t in range(PROMPT_TARGETS, len(tokens) - 1):
            probe = probe_datums(forward_lp_D, live=(d, t))
            theirs = float(
                client.forward(probe, loss_fn, dict(config)).result().metrics["loss:sum"]
            )
            ours = _declared(loss, probe, lp_D)[0]
            if not _value_ok(ours, theirs):
                measured["first_token"] = {"backend": theirs, "declared": ours}
                what += f"; at that token the backend gives {theirs:.6g}, declared {ours:.6g}"
                return _result(arm, path, label, measured, (d, t), what)
    return _result(arm, path, label, measured, None, what + "; no single token differs")


def fingerprint(
    arm: str,
    client: Any,
    loss: Any,
    builtin: tuple[str, Mapping[str, float]] | None = None,
) -> FingerprintResult:
    """One arm's fingerprint on `client` (a Tinker-shaped training client, local or remote):
    the custom path of `loss` (a `LossFn`), or the backend built-in `builtin` =
    (`loss_fn`, `loss_fn_config`) that the plan declares computes `loss`. The client's
    accumulated gradient is left behind: use a client that never steps."""
    label = getattr(loss, "spec", None) or getattr(loss, "name", "loss")
    if builtin is None:
        return _custom(arm, client, loss, label)
    return _builtin(arm, client, loss, label, builtin)


def dispatch_phase(
    client: Any, arms: Mapping[str, tuple[Any, tuple[str, Mapping[str, float]] | None]]
) -> PhaseResult:
    """The fingerprint of every arm (`{arm: (loss, builtin request or None)}`) on one probe
    client: one `Check` per arm (`<arm>.dispatch`); the artifact holds each arm's record."""
    results = [fingerprint(arm, client, loss, builtin) for arm, (loss, builtin) in arms.items()]
    artifact = {
        "probe": {
            "tokens": [list(t) for t in PROBE_TOKENS],
            "prompt_targets": PROMPT_TARGETS,
            "ratios": list(PROBE_RATIOS),
            "advantages": list(PROBE_ADVANTAGES),
        },
        "arms": {
            r.arm: {
                **r.measured,
                "passed": r.passed,
                "first_difference": list(r.first_difference) if r.first_difference else None,
                "note": r.note,
            }
            for r in results
        },
    }
    return PhaseResult(artifact, checks=tuple(r.check() for r in results))
