"""Activation-gate measurements from the first k steps of the treatment arm.

The pilot is not a separate run: it is `train_arm` on the treatment arm for `pilot_steps` steps,
with the baseline loss attached as a side loss (`ArmConfig.side_losses={"baseline": ...}`), so
the same steps can be kept and the arm continued from step k.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = ["BASELINE_SIDE", "pilot_metrics"]

BASELINE_SIDE = "baseline"


def _mean_of(step_metrics: Sequence[dict[str, Any]], key: str) -> float:
    missing = [int(m.get("step", -1)) for m in step_metrics if key not in m]
    if missing:
        raise KeyError(
            f"pilot metric source {key!r} is missing at steps {missing}: the pilot needs "
            "updates_per_batch >= the measured update and, for the baseline, "
            f"side_losses={{'{BASELINE_SIDE}': <baseline loss>}} on the treatment arm"
        )
    return sum(float(m[key]) for m in step_metrics) / len(step_metrics)


def pilot_metrics(
    step_metrics: Sequence[dict[str, Any]],
    *,
    base_model: str,
    update: int = 2,
    baseline_side: str = BASELINE_SIDE,
) -> dict[str, float | str]:
    """The activation gate's metrics, each a mean over the pilot steps at minibatch `update`.

    - `dppo_masked_token_fraction`: the treatment loss's `loss/clip_fraction` (share of loss
      tokens its divergence mask zeroed) at update `update`.
    - `policy_drift_abs_p_q90`: q90 of |p_current - p_sampler| over loss tokens at that update.
    - `grpo_clip_fraction`: the baseline loss's `loss/clip_fraction` evaluated on the same
      minibatch and current log-probs, without stepping.
    - `executed_updates_per_batch`: optim_step calls per batch as logged; NaN (failing any
      min/max check) when the pilot steps disagree, with the per-step counts in
      `executed_updates_per_batch_detail`.
    - `executed_base_model`: `base_model`, the name the training client reported
      (`get_info().model_data.model_name`).
    """
    if not step_metrics:
        raise ValueError("pilot_metrics needs at least one pilot step")
    if update < 1:
        raise ValueError(f"update is 1-based, got {update}")
    prefix = f"update{update}/"
    counts = [float(m["optim/steps_executed"]) for m in step_metrics]
    executed = counts[0] if len(set(counts)) == 1 else math.nan
    return {
        "dppo_masked_token_fraction": _mean_of(step_metrics, prefix + "loss/clip_fraction"),
        "policy_drift_abs_p_q90": _mean_of(step_metrics, prefix + "drift/abs_p_q90"),
        "grpo_clip_fraction": _mean_of(step_metrics, f"{prefix}{baseline_side}/loss/clip_fraction"),
        "executed_updates_per_batch": executed,
        "executed_updates_per_batch_detail": ",".join(str(int(c)) for c in counts),
        "executed_base_model": base_model,
        "pilot_steps": float(len(step_metrics)),
    }
