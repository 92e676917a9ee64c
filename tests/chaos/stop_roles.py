"""A coordinator whose stop fails, for tests of a chaos run's stop: a role
(``module:function``) run by :class:`shardsink.process.Child`."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

EXIT_AT_SIGINT = "tests.chaos.stop_roles:exit_at_sigint"


def exit_at_sigint(payload: bytes) -> int:
    """Exit with the status ``payload`` names (``CODE PATH``) at SIGINT, as a
    coordinator that fails while it stops; ``PATH`` is made once the
    handler is in place."""
    code, path = payload.decode().split(" ", 1)
    signal.signal(signal.SIGINT, lambda *_: os._exit(int(code)))
    Path(path).touch()
    time.sleep(120)  # until the SIGINT
    return 0
