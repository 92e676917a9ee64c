"""Roles: what a child runs, named ``package.module:function``.

A role's function is the child's main: given the launch's payload, it returns
the exit status. The child imports it by its name (:func:`resolve`), so this
floor starts the mains of the floors above (a worker, a builder, the
consensus server) without importing them; a zygote imports the roles it
serves before it forks any (:mod:`.zygote`).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import runpy
import signal
import sys
import traceback
from collections.abc import Callable

import msgspec

#: A child's main: given its payload, returns its exit status.
Main = Callable[[bytes], int]

#: The role running any ``python -m`` command (payload: :func:`module_payload`).
MODULE = "shardsink.process.roles:run_module"


def resolve(role: str) -> Main:
    """The function ``role`` names, its module imported; ``ValueError`` for a
    name not of the form ``package.module:function``, ``ImportError`` or
    ``AttributeError`` if there is no such module or function."""
    module, sep, name = role.partition(":")
    if not (sep and module and name):
        raise ValueError(f"a role is named package.module:function, not {role!r}")
    return getattr(importlib.import_module(module), name)


def run_role(role: str, payload: bytes) -> int:
    """Run ``role``: its exit status; 2 with a line on stderr if there is no
    such role; 1 with the traceback on stderr if it raised."""
    try:
        main = resolve(role)
    except (ValueError, ImportError, AttributeError) as exc:
        print(f"unknown role {role!r}: {exc}", file=sys.stderr)
        return 2
    try:
        return main(payload)
    except SystemExit as exc:
        return _status(exc)
    except BaseException:
        traceback.print_exc()
        return 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()


def enter_member(role: str, name: str) -> None:
    """Set up a cluster member's process (a builder, a worker): SIGINT ignored
    (its coordinator handles Ctrl-C and tells it to stop), named
    ``shardsink ROLE NAME`` in ``ps``, the fault points its environment names
    armed (:mod:`shardsink.faults`), and logging to its stderr (its log file)
    with its name on every line."""
    from setproctitle import setproctitle

    from .. import faults

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    setproctitle(f"shardsink {role} {name}")
    faults.arm_from_env(role=f"{role} {name}")
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s {name} %(levelname)s %(name)s: %(message)s",
    )


def module_payload(module: str, args: list[str]) -> bytes:
    """The payload of :data:`MODULE` running ``python -m MODULE ARGS``."""
    return msgspec.json.encode([module, *args])


def run_module(payload: bytes) -> int:
    """``python -m MODULE ARGS`` in this process (payload: :func:`module_payload`);
    its exit status."""
    module, *args = msgspec.json.decode(payload, type=list[str])
    sys.argv = [module, *args]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        return _status(exc)
    return 0


def _status(exc: SystemExit) -> int:
    return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
