"""The main of a child process, whichever way it was started.

An entry module (``shardsink.cluster.roles`` for a cluster) maps role names to
functions ``payload -> exit status`` and calls :func:`main` under
``__main__``. ``python -m ENTRY PARENT spawn ROLE`` runs one role with the
payload read from stdin; ``python -m ENTRY PARENT zygote FD`` serves forks on the
socket at descriptor ``FD`` (see :mod:`.zygote`). Either way the process first arranges to
die with ``PARENT``.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import traceback
from collections.abc import Callable, Mapping

from .parent import die_with_parent

#: A role: the child's main, given its payload; returns the exit status.
Role = Callable[[bytes], int]
Roles = Mapping[str, Role]


def run_role(roles: Roles, role: str, payload: bytes) -> int:
    """Run ``role``: its exit status, or 1 with the traceback on stderr."""
    try:
        main = roles[role]
    except KeyError:
        print(f"unknown role {role!r}; known: {', '.join(sorted(roles))}", file=sys.stderr)
        return 2
    try:
        return main(payload)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
        return 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()


def main(roles: Roles, argv: list[str]) -> int:
    """``PARENT spawn ROLE`` or ``PARENT zygote FD`` (see the module doc)."""
    parent, how, *rest = argv
    die_with_parent(int(parent))
    if how == "spawn":
        (role,) = rest
        return run_role(roles, role, sys.stdin.buffer.read())
    if how == "zygote":
        from .zygote import serve

        (fd,) = rest
        serve(roles, socket.socket(fileno=int(fd)), parent=int(parent))
        return 0
    raise SystemExit(f"unknown start {how!r}: spawn or zygote")


def exit_with(status: int) -> None:
    """Leave a forked child at once: no atexit hooks or finalizers of the
    parent's objects run twice."""
    os._exit(status)
