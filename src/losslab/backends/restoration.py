"""Restoration preflight: do the arms start from the same state with the planned optimizer?

The plan's `restoration_preflight` asks, before the first update, for (1) log-probs of a fixed
tokenized batch from every arm's freshly created client, bitwise equal or within 1e-6 of the
first arm's, and (2) each arm's optimizer to be AdamW with the planned learning_rate, beta1,
beta2 and eps. `check_restoration` checks clients you already hold (the ones you will train);
`restoration_preflight` creates fresh ones from one base model and seed. Both return a JSON-able
dict with `passed` and the `problems` found; `restoration_phase` is the run's phase: that dict as
the artifact (restoration.json) and one `Check` per comparison.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from tinker import types

from losslab.checks import Check, PhaseResult

TOLERANCE = 1e-6
OPTIMIZER_KEYS = ("learning_rate", "beta1", "beta2", "eps")
ADAMW_NAMES = frozenset({"adam", "adamw"})  # Tinker's Adam is decoupled weight decay (AdamW)

# Fixed GSM8K-style texts (written for this check; no dataset needed) for the default batch.
FIXED_TEXTS = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips "
    "in May. How many clips did Natalia sell altogether in April and May?",
    "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of "
    "babysitting. How much did she earn?",
    "Betty is saving money for a new wallet which costs $100. Betty has only half of the "
    "money she needs. How much more money does Betty need to buy the wallet?",
    "What is 7 + 5? Answer with just the number.",
)


def fixed_batch(tokenizer: Any, texts: Sequence[str] = FIXED_TEXTS, max_tokens: int = 64):
    """Token ids of `texts` (no special tokens added), each cut to `max_tokens`."""
    out = []
    for text in texts:
        ids = list(tokenizer.encode(text, add_special_tokens=False))[:max_tokens]
        if len(ids) < 2:
            raise ValueError(f"fixed text {text!r} tokenizes to {len(ids)} tokens; need >= 2")
        out.append(ids)
    return out


def _datums(batch_tokens: Sequence[Sequence[int]]) -> list[types.Datum]:
    data = []
    for i, seq in enumerate(batch_tokens):
        seq = [int(t) for t in seq]
        if len(seq) < 2:
            raise ValueError(f"batch_tokens[{i}] has {len(seq)} tokens; expected at least 2")
        data.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(seq[:-1]),
                loss_fn_inputs={"target_tokens": seq[1:], "weights": [0.0] * (len(seq) - 1)},
            )
        )
    return data


def _arm_fields(arm: Mapping[str, Any], i: int) -> tuple[str, str, dict[str, float]]:
    for key in ("name", "optimizer_config"):
        if key not in arm:
            raise ValueError(
                f"arms[{i}] has no {key!r}; expected name, optimizer, optimizer_config"
            )
    config = arm["optimizer_config"]
    missing = [k for k in OPTIMIZER_KEYS if k not in config]
    if missing:
        raise ValueError(f"arms[{i}].optimizer_config lacks {missing}; expected {OPTIMIZER_KEYS}")
    return (
        str(arm["name"]),
        str(arm.get("optimizer", "adamw")).lower(),
        {k: float(config[k]) for k in OPTIMIZER_KEYS},
    )


def _optimizer_report(name: str, family: str, planned: dict[str, float], client: Any) -> dict:
    problems: list[str] = []
    if family not in ADAMW_NAMES:
        problems.append(f"arm {name}: planned optimizer {family!r} is not AdamW")
    if hasattr(client, "optimizer_config"):
        actual = dict(client.optimizer_config())
    else:  # a bare SDK client: only the family is visible
        actual = {"type": getattr(client.get_info().optimizer_config, "type", "unknown")}
    if actual.get("type") != "adamw":
        problems.append(f"arm {name}: client optimizer type is {actual.get('type')!r}, not 'adamw'")
    for key, want in planned.items():
        got = actual.get(key)
        if got is None:
            problems.append(f"arm {name}: optimizer {key} cannot be read from the client")
        elif not math.isclose(float(got), want, rel_tol=1e-12, abs_tol=0.0):
            problems.append(f"arm {name}: optimizer {key} is {got!r}, planned {want!r}")
    return {
        "arm": name,
        "planned": {"type": family, **planned},
        "actual": actual,
        "ok": not problems,
        "problems": problems,
    }


def check_restoration(
    clients: Mapping[str, Any],
    arms: Sequence[Mapping[str, Any]],
    batch_tokens: Sequence[Sequence[int]] | None = None,
    tolerance: float = TOLERANCE,
) -> dict[str, Any]:
    """Compare the arms' clients (keyed by arm name) on a fixed batch and check optimizers.

    Args:
        clients: training clients by arm name, freshly created (no step taken yet).
        arms: the plan's `restoration_preflight.groups[*].arms` entries: `name`, `optimizer`
            ("adam"/"adamw"), `optimizer_config` {learning_rate, beta1, beta2, eps}.
        batch_tokens: fixed token sequences; default `fixed_batch(tokenizer of the first arm)`.
        tolerance: the largest allowed |log-prob difference| (plan: 1e-6).
    """
    if not arms:
        raise ValueError("arms is empty; expected at least two arms to compare")
    parsed = [_arm_fields(a, i) for i, a in enumerate(arms)]
    for name, _, _ in parsed:
        if name not in clients:
            raise ValueError(f"no client for arm {name!r}; clients has {sorted(clients)}")
    first = clients[parsed[0][0]]
    if batch_tokens is None:
        batch_tokens = fixed_batch(first.get_tokenizer())
    data = _datums(batch_tokens)
    logprobs: dict[str, np.ndarray] = {}
    for name, _, _ in parsed:
        out = clients[name].forward(data, "cross_entropy").result()
        logprobs[name] = np.concatenate(
            [np.asarray(o["logprobs"].data, dtype=np.float32) for o in out.loss_fn_outputs]
        )
    ref_name = parsed[0][0]
    ref = logprobs[ref_name]
    comparisons, problems = [], []
    for name, _, _ in parsed[1:]:
        lp = logprobs[name]
        diff = (
            float(np.max(np.abs(lp.astype(np.float64) - ref)))
            if lp.shape == ref.shape
            else math.inf
        )
        bitwise = lp.shape == ref.shape and lp.tobytes() == ref.tobytes()
        ok = bitwise or diff <= tolerance
        comparisons.append({"arm": name, "max_abs_diff": diff, "bitwise_equal": bitwise, "ok": ok})
        if not ok:
            problems.append(
                f"arm {name}: log-probs differ from arm {ref_name} by {diff:.3e} > {tolerance:g}"
            )
    optimizers = [_optimizer_report(n, f, p, clients[n]) for n, f, p in parsed]
    for rep in optimizers:
        problems.extend(rep["problems"])
    finite = bool(all(np.isfinite(v).all() for v in logprobs.values()))
    if not finite:
        problems.append("non-finite log-probs on the fixed batch")
    return {
        "passed": not problems,
        "tolerance": tolerance,
        "logprobs": {
            "reference_arm": ref_name,
            "num_sequences": len(data),
            "num_tokens": int(ref.size),
            "max_abs_diff": max((c["max_abs_diff"] for c in comparisons), default=0.0),
            "bitwise_equal": all(c["bitwise_equal"] for c in comparisons),
            "finite": finite,
            "comparisons": comparisons,
        },
        "optimizers": optimizers,
        "problems": problems,
        "unverified": [
            "server-side model identity cannot be introspected; only log-probs are compared"
        ],
    }


def create_arm_clients(
    service_client: Any,
    *,
    base_model: str,
    rank: int,
    seed: int | None,
    arms: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    """One fresh LoRA training client per arm, same base and seed, created with the arm's
    planned AdamW configuration (other AdamParams fields keep Tinker's defaults)."""
    clients = {}
    for i, arm in enumerate(arms):
        name, _, planned = _arm_fields(arm, i)
        clients[name] = service_client.create_lora_training_client(
            base_model, rank=rank, seed=seed, adam_params=types.AdamParams(**planned)
        ).result()
    return clients


def restoration_preflight(
    service_client: Any,
    *,
    base_model: str,
    rank: int,
    seed: int | None,
    arms: Sequence[Mapping[str, Any]],
    batch_tokens: Sequence[Sequence[int]] | None = None,
    tolerance: float = TOLERANCE,
) -> dict[str, Any]:
    """Create every arm's client fresh (same base, rank, seed) and run `check_restoration`."""
    clients = create_arm_clients(
        service_client, base_model=base_model, rank=rank, seed=seed, arms=arms
    )
    report = check_restoration(clients, arms, batch_tokens, tolerance)
    report["setup"] = {
        "base_model": base_model,
        "rank": rank,
        "seed": seed,
        "arms": [str(a["name"]) for a in arms],
    }
    return report


def restoration_checks(report: Mapping[str, Any], seeds: Sequence[int]) -> tuple[Check, ...]:
    """One row per log-prob comparison, one for the log-probs being finite, one per optimizer,
    and (only when they differ) one for the arms' seeds, which must be one seed."""
    lp = report["logprobs"]
    rows = [
        Check(
            name=f"log-probs {c['arm']} vs {lp['reference_arm']} (fixed batch)",
            measured=c["max_abs_diff"],
            bound=f"bitwise or <= {report['tolerance']:g}",
            passed=bool(c["ok"]),
            note="bitwise equal" if c["bitwise_equal"] else "",
        )
        for c in lp["comparisons"]
    ]
    rows.append(
        Check("log-probs finite (fixed batch)", lp["finite"], "finite", passed=bool(lp["finite"]))
    )
    rows += [
        Check(
            name=f"optimizer {opt['arm']}",
            measured=opt["actual"],
            bound=opt["planned"],
            passed=not opt["problems"],
            note="; ".join(opt["problems"]),
        )
        for opt in report["optimizers"]
    ]
    if len(set(seeds)) > 1:
        rows.append(
            Check(
                "arm seeds",
                sorted(set(seeds)),
                "one seed",
                passed=False,
                note="arms must start from the same seed",
            )
        )
    return tuple(rows)


def restoration_phase(
    service_client: Any,
    *,
    base_model: str,
    rank: int,
    seeds: Sequence[int],
    arms: Sequence[Mapping[str, Any]],
    tolerance: float = TOLERANCE,
) -> PhaseResult:
    """The run's restoration preflight: fresh clients from the smallest of the arms' `seeds`
    (they must all be one seed, a check of its own), compared by `restoration_checks`."""
    report = restoration_preflight(
        service_client,
        base_model=base_model,
        rank=rank,
        seed=min(seeds),
        arms=arms,
        tolerance=tolerance,
    )
    return PhaseResult(report, checks=restoration_checks(report, seeds))
