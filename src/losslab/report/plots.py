"""The report's figures as PNG bytes (matplotlib, Agg backend: no display, no network)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
from matplotlib.ticker import MaxNLocator  # noqa: E402

CURVE_METRICS: dict[str, str] = {
    "reward/mean": "mean reward",
    "loss/clip_fraction": "clip fraction (loss tokens)",
    "dppo/mask_fraction": "DPPO mask fraction (loss tokens)",
    "policy/drift_vs_sampler_q90": "drift |p - p_sampler|, q90 (engine, every loss alike)",
    "loss/value": "loss (sum over the batch)",
}
"""Training curves drawn per arm, by stable metric name (docs/interfaces.md)."""

BASE_LABEL = "base model"
"""The initial policy's bar in the accuracy plot (drawn grey, first)."""

_DPI = 96
_ARM_COLORS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b2", "#937860"]


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    # metadata={"Software": None}: no matplotlib version stamp, so equal data gives equal bytes
    fig.savefig(buf, format="png", dpi=_DPI, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def curve_png(metric: str, series: dict[str, Sequence[tuple[int, float]]]) -> bytes:
    """One training curve: `series` maps arm name -> [(step, value), ...]."""
    fig, ax = plt.subplots(figsize=(5.2, 3.0))
    for arm, points in series.items():
        xs = [s + 1 for s, _ in points]
        ys = [v for _, v in points]
        ax.plot(xs, ys, marker="o", markersize=3, linewidth=1.5, label=arm)
    ax.set_xlabel("RL step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(CURVE_METRICS.get(metric, metric), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _png(fig)


def efficiency_png(series: dict[str, Sequence[Sequence[float]]]) -> bytes:
    """Accuracy on the efficiency subset against trained tokens: unit -> [[tokens, acc], ...]."""
    fig, ax = plt.subplots(figsize=(5.2, 3.0))
    for unit, points in series.items():
        ax.plot([x for x, _ in points], [y for _, y in points], marker="o", markersize=3,
                linewidth=1.5, label=unit)  # fmt: skip
    ax.set_xlabel("completion tokens trained on")
    ax.set_ylabel("accuracy (subset)")
    ax.set_title("efficiency: accuracy vs training tokens", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _png(fig)


def accuracy_png(accuracy: dict[str, tuple[float, int, int]]) -> bytes:
    """Evaluation accuracy per arm: arm -> (accuracy, correct, n)."""
    fig, ax = plt.subplots(figsize=(4.2, 3.0))
    names = list(accuracy)
    values = [accuracy[a][0] for a in names]
    arm_colors = iter(_ARM_COLORS * (1 + len(names) // len(_ARM_COLORS)))
    colors = ["#9e9e9e" if a == BASE_LABEL else next(arm_colors) for a in names]
    bars = ax.bar(names, values, color=colors)
    for bar, a in zip(bars, names, strict=True):
        acc, k, n = accuracy[a]
        ax.annotate(
            f"{acc:.3f}\n({k}/{n})",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.set_ylim(0, max([1.0, *values]) * 1.15)
    ax.set_ylabel("accuracy")
    ax.set_title("evaluation accuracy per arm", fontsize=10)
    if len(names) > 3:
        ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    return _png(fig)


def feasibility_png(minutes: dict[str, float]) -> bytes:
    """Wall minutes: projected (from the pilot), measured (this run) and the budget."""
    fig, ax = plt.subplots(figsize=(4.2, 3.0))
    names = list(minutes)
    bars = ax.bar(names, [minutes[k] for k in names], color=["#8172b2", "#4c72b0", "#937860"])
    for bar, k in zip(bars, names, strict=True):
        ax.annotate(
            f"{minutes[k]:.1f}",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.set_ylabel("wall minutes")
    ax.set_title("feasibility: projected vs measured vs budget", fontsize=10)
    return _png(fig)
