"""A throwaway backend for tests/runner/test_errands.py, written as docs/contributing.md's "Add a
backend" errand says: one module with a `BACKEND` satisfying `losslab.backends.protocols.Backend`.

It serves the local backend's clients under its own name and counts the service clients the
run asks it for, so a test can tell that `--backend errand` went through this module.
"""

from __future__ import annotations

from typing import Any

from losslab.backends.local.backend import LocalBackend
from losslab.backends.protocols import ServiceClient


class ErrandBackend(LocalBackend):
    name = "errand"

    def __init__(self) -> None:
        self.service_clients = 0

    def create_service_client(self, **kwargs: Any) -> ServiceClient:
        self.service_clients += 1
        return super().create_service_client(**kwargs)


BACKEND = ErrandBackend()
