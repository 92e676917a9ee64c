"""The main of a child process, whichever way it was started:
``python -m shardsink.process PARENT spawn ROLE`` runs one role (see
:mod:`.roles`) with the payload read from stdin; ``python -m shardsink.process
PARENT zygote FD ROLE...`` serves forks of those roles on the socket at
descriptor ``FD`` (see :mod:`.zygote`). Either way the process first arranges
to die with ``PARENT`` (a pid, ``/watch`` if the parent started it from a
thread that may end first: see :mod:`.parent`).
"""

from __future__ import annotations

import socket
import sys

from .parent import die_with
from .roles import run_role
from .zygote_server import serve


def main(argv: list[str]) -> int:
    """``PARENT spawn ROLE`` or ``PARENT zygote FD ROLE...`` (see the module doc)."""
    parent, how, *rest = argv
    die_with(parent)
    if how == "spawn":
        (role,) = rest
        return run_role(role, sys.stdin.buffer.read())
    if how == "zygote":
        fd, *roles = rest
        serve(roles, socket.socket(fileno=int(fd)))
        return 0
    raise SystemExit(f"unknown start {how!r}: spawn or zygote")
