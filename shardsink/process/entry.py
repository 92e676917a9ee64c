"""The main of a child process, whichever way it was started.

An entry module (``shardsink.cluster.roles`` for a cluster) maps role names to
functions ``payload -> exit status`` and calls :func:`main` under
``__main__``. ``python -m ENTRY PARENT spawn ROLE`` runs one role with the
payload read from stdin; ``python -m ENTRY PARENT zygote FD`` serves forks on
the socket at descriptor ``FD`` (see :mod:`.zygote`). Either way the process
first arranges to die with ``PARENT`` (a pid, ``/watch`` if the parent
started it from a thread that may end first: see :mod:`.parent`).
"""

from __future__ import annotations

import socket
import sys

from .parent import die_with
from .roles import Roles, run_role
from .zygote import serve


def main(roles: Roles, argv: list[str]) -> int:
    """``PARENT spawn ROLE`` or ``PARENT zygote FD`` (see the module doc)."""
    parent, how, *rest = argv
    die_with(parent)
    if how == "spawn":
        (role,) = rest
        return run_role(roles, role, sys.stdin.buffer.read())
    if how == "zygote":
        (fd,) = rest
        serve(roles, socket.socket(fileno=int(fd)))
        return 0
    raise SystemExit(f"unknown start {how!r}: spawn or zygote")
