"""The loss registry's names, stdlib only so that every layer may read them.

`losslab.losses.registry` binds each name to its function in `losslab.losses.policy`; `losslab.plan`
(which may not import `losses`, it would pull in torch) checks a plan's registry specs against the
same names. Adding a loss: its function in `losses/policy.py` plus one line here.
"""

from __future__ import annotations

LOSS_FUNCTIONS: dict[str, str] = {
    "importance_sampling": "importance_sampling",
    "ppo": "ppo",
    "cispo": "cispo",
    "dro": "dro",
    "cross_entropy": "cross_entropy_loss",
    "dppo_binary_tv": "dppo_binary_tv",
    "dppo_binary_kl": "dppo_binary_kl",
}
"""Registry name (as plans and `get_loss` spell it; Tinker's names for its built-ins) -> the name
of its function in `losslab.losses.policy`."""
