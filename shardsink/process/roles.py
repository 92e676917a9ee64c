"""Roles: what a child runs, by name, given its payload."""

from __future__ import annotations

import contextlib
import sys
import traceback
from collections.abc import Callable, Mapping

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
