"""Roles: what a child runs, by name, given its payload."""

from __future__ import annotations

import contextlib
import runpy
import sys
import traceback
from collections.abc import Callable, Mapping

import msgspec

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


def module_payload(module: str, args: list[str]) -> bytes:
    """The payload of :func:`run_module` running ``python -m MODULE ARGS``."""
    return msgspec.json.encode([module, *args])


def run_module(payload: bytes) -> int:
    """``python -m MODULE ARGS`` in this process (payload: :func:`module_payload`);
    its exit status."""
    module, *args = msgspec.json.decode(payload, type=list[str])
    sys.argv = [module, *args]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0
