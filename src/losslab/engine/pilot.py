"""Activation-gate measurements from the first k steps of the treatment arm.

The pilot is not a separate run: it is the treatment arm's first `pilot_steps` steps, with the
side losses the gate needs attached (`ArmConfig.side_losses`, e.g. `{"baseline": <baseline
loss>}`), so the same steps are kept and the arm continues from step k.

What each gate metric averages is declared in a table (`losslab.plan.GATE_METRICS`: logged
key, which update, which side loss); `pilot_metrics` reads whatever table it is given, so no
loss family is recognised by name here. The engine does not import `plan` (layering): the runner
passes the table in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

__all__ = ["GateSource", "pilot_metrics", "side_losses_for"]


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
