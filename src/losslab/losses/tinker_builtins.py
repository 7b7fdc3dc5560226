"""Which losslab losses a Tinker server-side built-in computes, and the request that names it.

Stdlib only (the plan layer reads it without torch). A plan with `engine.loss_path: "builtin"`
trains each arm with `forward_backward(data, loss_fn, loss_fn_config)` instead of the client-side
custom loss; that is possible only where a built-in's documented objective
(https://tinker-docs.thinkingmachines.ai/losses, a SUM over tokens and datums) is the arm's loss:

| losslab loss | built-in | loss_fn_config | the other parameters must be |
| --- | --- | --- | --- |
| `importance_sampling` | `importance_sampling` | none | surrogate ratio, clip_ratio_c inf |
| `ppo` | `ppo` | clip_low_threshold, clip_high_threshold | surrogate clipped (zero_adv: diagnostics only) |
| `cispo` | `cispo` | clip_low_threshold, clip_high_threshold | - |
| `dro` | `dro` | beta | - |
| `cross_entropy` | `cross_entropy` | none | - |

and `reduction` is `sum`, `norm_constant` unset, for all of them. The dispatch fingerprint
(`losslab.backends.fingerprint`) checks on the backend itself that the built-in computes this.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["BUILTIN_OF", "builtin_request"]

_REQUIRED: dict[str, dict[str, Any]] = {
    "importance_sampling": {"surrogate": "ratio", "clip_ratio_c": math.inf},
    "ppo": {"surrogate": "clipped", "clip_ratio_c": math.inf},
    "cispo": {},
    "dro": {},
    "cross_entropy": {},
}
_CONFIG: dict[str, tuple[str, ...]] = {
    "importance_sampling": (),
    "ppo": ("clip_low_threshold", "clip_high_threshold"),
    "cispo": ("clip_low_threshold", "clip_high_threshold"),
    "dro": ("beta",),
    "cross_entropy": (),
}
_IGNORED = frozenset({"zero_adv"})  # changes only diagnostics (kept_D, clip fractions)

BUILTIN_OF: dict[str, str] = {name: name for name in _CONFIG}
"""losslab loss name -> the Tinker built-in `loss_fn` that computes it (same names)."""


def builtin_request(name: str, params: Mapping[str, Any]) -> tuple[str, dict[str, float]]:
    """(`loss_fn`, `loss_fn_config`) of the Tinker built-in that computes loss `name` with the
    resolved `params` (every parameter, defaults included).

    Raises:
        ValueError: no built-in computes it; the message names the loss, the parameter, its
            value and what the built-in needs.
    """
    if name not in _CONFIG:
        raise ValueError(
            f"loss {name!r} has no Tinker built-in; engine.loss_path 'builtin' takes one of "
            f"{', '.join(_CONFIG)} (use loss_path 'custom')"
        )
    needed = {**_REQUIRED[name], "reduction": "sum", "norm_constant": None}
    for key, value in params.items():
        if key in _CONFIG[name] or key in _IGNORED:
            continue
        if key not in needed:
            raise ValueError(
                f"loss {name!r}: parameter {key}={value!r} has no counterpart in Tinker's "
                f"built-in {name!r} (use engine.loss_path 'custom')"
            )
        if value != needed[key]:
            raise ValueError(
                f"loss {name!r}: {key}={value!r}, but Tinker's built-in {name!r} computes "
                f"{key}={needed[key]!r} (use engine.loss_path 'custom')"
            )
    return name, {key: float(params[key]) for key in _CONFIG[name] if key in params}
