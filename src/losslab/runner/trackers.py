"""Optional experiment trackers: `--tracker wandb|trackio` mirrors metrics.jsonl rows.

The run directory stays the record; a tracker only shows the same rows where people already
look. Neither package is a dependency: the module is imported when a run asks for it, and a
missing package is a one-line error before the run directory is written. Each trained arm (each
unit, with several seeds) is one tracker run, grouped under the run directory's name, because
every arm's steps start at 0. Offline modes are the tracker's own: WANDB_MODE=offline (or
`wandb offline`) keeps wandb local, and trackio is local unless its space is configured; losslab
sets neither. Nothing the tracker returns (URLs, keys) is written into the run directory.
"""

from __future__ import annotations

import importlib
from typing import Any

from losslab.runner.errors import RunError

TRACKERS = ("wandb", "trackio")


class MetricsMirror:
    """Forward each step's metrics row to a tracker module with wandb's init/log/finish calls.

    Args:
        name: "wandb" or "trackio".
        module: the imported package (both expose `init(project=, name=, group=, config=)`,
            `log(dict, step=)` and `finish()` at module level).
    """

    def __init__(self, name: str, module: Any) -> None:
        self.name, self.module = name, module
        self._group: str | None = None
        self._config: dict[str, Any] = {}
        self._unit: str | None = None

    def start(self, group: str, config: dict[str, Any]) -> None:
        self._group, self._config = group, dict(config)

    def log(self, unit: str, row: dict[str, Any]) -> None:
        """Log one metrics row of `unit` at its step (numbers only; lists and text stay in the
        run directory)."""
        if unit != self._unit:
            self._finish()
            self.module.init(
                project="losslab",
                name=f"{self._group}/{unit}",
                group=self._group,
                config={**self._config, "unit": unit},
            )
            self._unit = unit
        numbers = {
            k: float(v)
            for k, v in row.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and k != "step"
        }
        self.module.log(numbers, step=int(row["step"]))

    def _finish(self) -> None:
        if self._unit is not None:
            self.module.finish()
            self._unit = None

    def close(self) -> None:
        self._finish()


def open_tracker(name: str | None) -> MetricsMirror | None:
    """The mirror for `--tracker name`, or None without one; a clear RunError if it is missing."""
    if name is None:
        return None
    if name not in TRACKERS:
        raise RunError(f"--tracker {name!r}: expected one of {', '.join(TRACKERS)}")
    try:
        module = importlib.import_module(name)
    except ImportError as e:
        raise RunError(
            f"--tracker {name}: the {name} package is not installed ({e}); install it "
            f"(pip install {name}) or run without --tracker"
        ) from e
    return MetricsMirror(name, module)
