"""The backends' names, as data: stdlib only, so `losslab plan check` checks `engine.backend`
without importing a backend (as `losses.declarations` and `tasks.registry` do for losses and
tasks). `losslab.backends` re-exports both names; nothing else names a backend.
"""

from __future__ import annotations

BACKENDS: dict[str, tuple[str, str]] = {
    "local": ("losslab.backends.local.backend", "the embedded model on this machine (CPU or GPU)"),
    "tinker": ("losslab.backends.tinker", "the Tinker service (reads TINKER_API_KEY from the env)"),
}
"""`--backend` name -> (module holding its `BACKEND`, one-line description for the CLI help).
Modules are imported only when the backend is used."""

DEFAULT_BACKEND = next(iter(BACKENDS))
"""The backend a run uses when none is named (the first registry entry)."""
