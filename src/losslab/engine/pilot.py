"""Activation-gate measurements from the first k steps of the treatment arm.

The pilot is not a separate run: it is the treatment arm's first `pilot_steps` steps, with the
side losses the gate needs attached (`ArmConfig.side_losses`, e.g. `{"baseline": <baseline
loss>}`), so the same steps are kept and the arm continues from step k.

What each gate metric averages is declared in a table (`losslab.plan.GATE_METRICS`: logged
key, which update, which side loss); `pilot_metrics` reads whatever table it is given, so no
loss family is recognised by name here. The engine does not import `plan` (layering): the runner
passes the table in.

`pilot_diagnostics` reads the same rows for what a researcher needs to trust the gate
(docs/interfaces.md, "Pilot diagnostics"): the sampler-vs-trainer log-prob gap before any update
(the first minibatch update of each pilot step, whose weights are the sampler snapshot's), the
alignment of sampled and trained positions (`alignment_check`), each trust-region metric at the
first update (mismatch only) beside the last (mismatch + drift), duplicate completions and the
effective group size, the seeds the rows record and the policy-gradient part's gradient norm.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from losslab.checks import Check

__all__ = [
    "ALIGNMENT_ABS_TOL",
    "GateSource",
    "alignment_check",
    "mismatch_vs_drift",
    "pilot_diagnostics",
    "pilot_metrics",
    "side_losses_for",
]

ALIGNMENT_ABS_TOL = 1e-3
"""Mean |log p - log q| (nats) at or below which sampler and trainer agree whatever the
alignment: with such a gap every ratio is 1 to 0.1%, so a shift cannot be told apart (nor
matter to the loss); the local backend's gap is about 0."""

MISMATCH_SHARE = 0.5
"""A trust-region metric whose first-update value (mismatch only) is at least this share of its
last-update value (mismatch + drift) is said to act mostly because of the mismatch."""


class GateSource(Protocol):
    """What the pilot reads of one gate-table entry (`losslab.plan.GateMetric`)."""

    logged_key: str | None
    update: str | None
    side_loss: str | None
    reduce: str


def side_losses_for(table: Mapping[str, GateSource]) -> list[str]:
    """The side losses (arm roles) the table's metrics need on the treatment arm, in order."""
    return list(dict.fromkeys(m.side_loss for m in table.values() if m.side_loss))


def _source_key(source: GateSource, update: int) -> str:
    assert source.logged_key is not None
    key = source.logged_key
    if source.side_loss:
        key = f"{source.side_loss}/{key}"
    if source.update == "last":
        key = f"update{update}/{key}"
    elif source.update is not None:
        raise ValueError(f"gate table: update={source.update!r}; expected 'last' or None")
    return key


def _values(step_metrics: Sequence[dict[str, Any]], key: str, source: GateSource) -> list[float]:
    missing = [int(m.get("step", -1)) for m in step_metrics if key not in m]
    if missing:
        hint = (
            f"side_losses={{'{source.side_loss}': <its loss>}} on the treatment arm"
            if source.side_loss
            else "a loss or engine that logs it"
        )
        raise KeyError(
            f"pilot metric source {key!r} is missing at steps {missing}: the pilot needs "
            f"updates_per_batch >= the measured update and {hint}"
        )
    return [float(m[key]) for m in step_metrics]


def pilot_metrics(
    step_metrics: Sequence[dict[str, Any]],
    table: Mapping[str, GateSource],
    *,
    base_model: str,
    update: int = 2,
) -> dict[str, float | str]:
    """Every metric of the gate `table`, measured on the pilot steps' metric rows.

    - a metric with a `logged_key` and `reduce="mean"`: the mean over pilot steps of that key at
      minibatch `update` (`update="last"`) or at the step level (`update=None`), read from the
      side loss's records when it names one;
    - `reduce="same"`: the value every pilot step logged, or NaN (failing any min/max check)
      when they disagree, with the per-step values in `<name>_detail`;
    - no `logged_key`: `base_model`, the name the training client reported.

    Raises:
        KeyError: a source key is missing at some step (the message names it and why).
    """
    if not step_metrics:
        raise ValueError("pilot_metrics needs at least one pilot step")
    if update < 1:
        raise ValueError(f"update is 1-based, got {update}")
    out: dict[str, float | str] = {}
    for name, source in table.items():
        if source.logged_key is None:
            out[name] = base_model
            continue
        values = _values(step_metrics, _source_key(source, update), source)
        if source.reduce == "same":
            out[name] = values[0] if len(set(values)) == 1 else math.nan
            out[f"{name}_detail"] = ",".join(_compact(v) for v in values)
        else:
            out[name] = sum(values) / len(values)
    out["pilot_steps"] = float(len(step_metrics))
    return out


def _compact(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


# ----------------------------------------------------------------------------- diagnostics


def _num(row: Mapping[str, Any], key: str) -> float | None:
    value = row.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(float(value)) else None


def _weighted_mean(pairs: Sequence[tuple[float, float]]) -> float | None:
    """Mean of values weighted by counts [(value, count)]; None without weight."""
    total = sum(n for _, n in pairs)
    return sum(v * n for v, n in pairs) / total if total > 0 else None


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _mismatch(step_metrics: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The gap at update 1 of each pilot step, pooled: token-weighted mean |Δ|, max |Δ|, and the
    Pearson correlation per step (its minimum and mean)."""
    per_step = []
    for row in step_metrics:
        n = _num(row, "update1/tokens/loss") or 0.0
        per_step.append(
            {
                "step": row.get("step"),
                "tokens": n,
                "abs_logprob_mean": _num(row, "update1/gap/abs_logprob_mean"),
                "abs_logprob_max": _num(row, "update1/gap/abs_logprob_max"),
                "pearson": _num(row, "update1/gap/logprob_pearson"),
                "shift_minus1": _num(row, "update1/gap/abs_logprob_mean_shift_minus1"),
                "shift_plus1": _num(row, "update1/gap/abs_logprob_mean_shift_plus1"),
                "kl_sample_train_v1": _num(row, "update1/gap/kl_sample_train_v1"),
            }
        )

    def pooled(key: str) -> float | None:
        return _weighted_mean([(s[key], s["tokens"]) for s in per_step if s[key] is not None])

    maxima = [s["abs_logprob_max"] for s in per_step if s["abs_logprob_max"] is not None]
    pearsons = [s["pearson"] for s in per_step if s["pearson"] is not None]
    return {
        "measured_at": "update 1 of each pilot step (no optim step since the sampler snapshot)",
        "tokens": sum(s["tokens"] for s in per_step),
        "abs_logprob_mean": pooled("abs_logprob_mean"),
        "abs_logprob_max": max(maxima) if maxima else None,
        "pearson_min": min(pearsons) if pearsons else None,
        "pearson_mean": _mean(pearsons),
        "kl_sample_train_v1": pooled("kl_sample_train_v1"),
        "abs_logprob_mean_shift_minus1": pooled("shift_minus1"),
        "abs_logprob_mean_shift_plus1": pooled("shift_plus1"),
        "per_step": per_step,
    }


def alignment_check(mismatch: Mapping[str, Any]) -> Check:
    """Ratio-is-1 check on sampled vs trained positions: with the right alignment the mean
    |log p - log q| before any update is the sampler/trainer numeric gap, smaller than with the
    sampler's log-probs one position early or late (then each token is compared with its
    neighbour's log-prob). An off-by-one swaps the two, so the check fails on it. A gap of at
    most `ALIGNMENT_ABS_TOL` passes (every ratio is 1 either way); no measurement fails."""
    aligned = mismatch.get("abs_logprob_mean")
    shifted_values = [
        mismatch.get(k) for k in ("abs_logprob_mean_shift_minus1", "abs_logprob_mean_shift_plus1")
    ]
    shifted = [v for v in shifted_values if v is not None]
    nearest = min(shifted) if shifted else None
    bound = f"<= {ALIGNMENT_ABS_TOL:g}, or < the gap one position out of step"
    if nearest is not None:
        bound += f" ({nearest:.4g})"
    if aligned is None:
        return Check("sampler_trainer_alignment", None, bound, False, "no first-update gap logged")
    if aligned <= ALIGNMENT_ABS_TOL:
        return Check("sampler_trainer_alignment", aligned, bound, True, "ratio is 1 at every token")
    if nearest is None:
        note = "no neighbouring loss tokens to compare (one-token completions)"
        return Check("sampler_trainer_alignment", aligned, bound, False, note)
    if aligned < nearest:
        return Check("sampler_trainer_alignment", aligned, bound, True, "aligned")
    note = (
        "the sampler's log-probs match the trainer's better one position out of step: an "
        "off-by-one between sampled and trained positions"
    )
    if aligned <= nearest * (1 + 1e-9):
        note = (
            "the gap is as large one position out of step (log-probs constant along the "
            "sequence?): the alignment cannot be confirmed"
        )
    return Check("sampler_trainer_alignment", aligned, bound, False, note)


def _trust_region_sources(table: Mapping[str, GateSource]) -> list[tuple[str, GateSource]]:
    """The per-update metrics whose first and last update are compared: the gate table's
    (update "last"), then the trained loss's dropped share (A != 0) and the engine's drift."""
    rows = [(n, s) for n, s in table.items() if s.update == "last" and s.logged_key]
    keys = {(s.side_loss, s.logged_key) for _, s in rows}
    extra = {
        "treatment loss: dropped share (A != 0)": "loss/clip_fraction_nonzero_adv",
        "policy drift |p - q| q90 (engine)": "policy/drift_vs_sampler_q90",
    }
    for name, key in extra.items():
        if (None, key) not in keys:
            rows.append((name, _Source(key)))
    return rows


class _Source:
    """A per-update metric of the trained loss or the engine (a `GateSource`)."""

    def __init__(self, logged_key: str) -> None:
        self.logged_key: str | None = logged_key
        self.update: str | None = "last"
        self.side_loss: str | None = None
        self.reduce = "mean"


def mismatch_vs_drift(
    step_metrics: Sequence[Mapping[str, Any]], table: Mapping[str, GateSource], update: int
) -> list[dict[str, Any]]:
    """One row per trust-region metric (`_trust_region_sources`) logged in the rows: its mean at
    update 1 (mismatch only) and at `update` (mismatch + drift), and which made it act."""
    out = []
    for name, source in _trust_region_sources(table):
        first_key = _source_key(source, 1)
        first = [v for r in step_metrics if (v := _num(r, first_key)) is not None]
        if not first:
            continue  # not logged on this arm (a gate metric's absence is the gate's error)
        last = None
        if update > 1:
            last_key = _source_key(source, update)
            values = [v for r in step_metrics if (v := _num(r, last_key)) is not None]
            last = _mean(values)
        out.append(_attribute(name, source, _mean(first), last, update))
    return out


def _attribute(
    name: str, source: GateSource, first: float | None, last: float | None, update: int
) -> dict[str, Any]:
    """One row of the mismatch-vs-drift table, with which of the two made the metric act."""
    row: dict[str, Any] = {
        "metric": name,
        "key": (f"{source.side_loss}/" if source.side_loss else "") + str(source.logged_key),
        "mismatch_only": first,
        "mismatch_and_drift": last,
        "last_update": update,
        "mismatch_share": None,
    }
    if last is None:
        row["acted_because"] = "one update per batch: no drift to measure"
    elif not last and not first:
        row["acted_because"] = "did not act"
    elif not last:
        row["acted_because"] = "mismatch (zero after the policy moved)"
    else:
        share = (first or 0.0) / last
        row["mismatch_share"] = share
        row["acted_because"] = "mostly mismatch" if share >= MISMATCH_SHARE else "mostly drift"
    return row


def _groups(step_metrics: Sequence[Mapping[str, Any]], group_size: int) -> dict[str, Any]:
    means = [
        v for r in step_metrics if (v := _num(r, "data/effective_group_size_mean")) is not None
    ]
    minima = [
        v for r in step_metrics if (v := _num(r, "data/effective_group_size_min")) is not None
    ]
    duplicates = [
        v for r in step_metrics if (v := _num(r, "data/duplicate_completions")) is not None
    ]
    identical = [v for r in step_metrics if (v := _num(r, "data/groups_all_identical")) is not None]
    effective = _mean(means)
    return {
        "planned_group_size": group_size,
        "effective_group_size_mean": effective,
        "effective_group_size_min": min(minima) if minima else None,
        "duplicate_completions": sum(duplicates) if duplicates else None,
        "groups_all_identical": sum(identical) if identical else None,
        "below_plan": effective is not None and effective < group_size,
    }


def _grad_norms(step_metrics: Sequence[Mapping[str, Any]], update: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label, u in (("update1", 1), ("last_update", update)):
        for key, name in (("loss/pg_grad_norm", "pg"), ("grad/logprob_norm", "total")):
            values = [v for r in step_metrics if (v := _num(r, f"update{u}/{key}")) is not None]
            out[f"{name}_{label}"] = _mean(values)
    return out


def _seeds(step_metrics: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    arm = [r.get("seed/arm") for r in step_metrics if "seed/arm" in r]
    first = step_metrics[0].get("data/sampling_seeds") or []
    return {
        "arm": arm[0] if arm and len(set(arm)) == 1 else arm or None,
        "sampling_requests_step0": list(first),
        "sampling_derivation": "sampling_seed(arm seed, step, group): SeedSequence, 31 bits",
    }


def pilot_diagnostics(
    step_metrics: Sequence[dict[str, Any]],
    table: Mapping[str, GateSource],
    *,
    group_size: int,
    update: int,
) -> dict[str, Any]:
    """The pilot's diagnostics from its metrics rows (module docstring); `table` is the gate's
    (`Plan.gate_metrics()`, may be empty), `update` the last minibatch update (updates per
    batch), `group_size` the plan's G. The alignment check's row is `alignment_check(out
    ["mismatch"])`."""
    if not step_metrics:
        raise ValueError("pilot_diagnostics needs at least one pilot step")
    if update < 1:
        raise ValueError(f"update is 1-based, got {update}")
    return {
        "mismatch": _mismatch(step_metrics),
        "trust_region": mismatch_vs_drift(step_metrics, table, update),
        "groups": _groups(step_metrics, group_size),
        "grad_norm": _grad_norms(step_metrics, update),
        "seeds": _seeds(step_metrics),
        "pilot_steps": len(step_metrics),
    }
