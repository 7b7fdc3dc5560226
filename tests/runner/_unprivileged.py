"""Running a piece of a test as the unprivileged user `nobody` (where the OS allows it), so
path-confinement and secret checks are shown to hold without root's rights, not only faked
(the `nobody` fixture is in conftest.py)."""

from __future__ import annotations

import json
import os


def as_user(uid: int | None, fn) -> dict:
    """Run `fn()` in a forked child that first drops to `uid` (setgid, setgroups, setuid; None:
    stay as we are); its JSON-able result, or {"error": ...} for an exception.

    Why fork rather than exec a new interpreter as that user: this interpreter may live where the
    user cannot read it (under /root); the fork has every module already imported."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        os.close(read_fd)
        try:
            if uid is not None:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
            result = {"uid": os.geteuid(), **fn()}
        except BaseException as e:  # reported to the parent, which asserts on it
            result = {"error": f"{type(e).__name__}: {e}"}
        os.write(write_fd, json.dumps(result).encode())
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    return json.loads(data or b'{"error": "the child wrote nothing"}')
