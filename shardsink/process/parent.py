"""Children die with their parent: ``PR_SET_PDEATHSIG``, checked against a race.

The kernel sends the signal when the thread that forked the child exits, so
a child must check, after the ``prctl``, that its parent is still the one it
was started by: a parent that died in between left it re-parented already.
A zygote's children name the zygote; the zygote names the coordinator, so
the chain holds whoever forked whom.

A parent that starts a child from a thread other than its main one would
kill it when that thread ends; such a child watches its parent's pidfd from a
thread of its own instead (``watch``).

This is the one place that sets the signal: for shardsink's own children
(:func:`die_with`) and, between fork and exec, for the servers the tests
start (:func:`dies_with_this_process`).
"""

from __future__ import annotations

import ctypes
import functools
import os
import select
import signal
import threading
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1
# Resolved at import, never in a child between fork and exec: loading a
# library there can deadlock.
_prctl = ctypes.CDLL(None, use_errno=True).prctl


def die_with_parent(parent: int, *, watch: bool = False, sig: int = signal.SIGKILL) -> None:
    """Get ``sig`` when the parent exits (with ``watch``: exit with status 1
    when the process ``parent`` exits, whichever thread started us); exit
    now (status 1) if the parent is no longer ``parent``. ``OSError`` if the
    kernel refuses."""
    if watch:
        pidfd = os.pidfd_open(parent)
        threading.Thread(target=_exit_with, args=(pidfd,), daemon=True, name="parent").start()
    elif _prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:
        os._exit(1)


def dies_with_this_process(sig: int = signal.SIGKILL) -> Callable[[], None]:
    """A ``preexec_fn`` for ``subprocess.Popen``: the child gets ``sig`` when
    the thread that starts it exits, or exits at once if this process is
    already gone. It runs after ``Popen`` changed the child's user (a change
    of credentials clears the signal) and makes two system calls, no
    imports. Start the child from the main thread."""
    return functools.partial(die_with_parent, os.getpid(), sig=sig)


def parent_token() -> str:
    """How a child names this process as its parent: the pid, with
    ``/watch`` when this is not the main thread (see the module doc)."""
    watch = threading.current_thread() is not threading.main_thread()
    return f"{os.getpid()}/watch" if watch else str(os.getpid())


def die_with(token: str) -> None:
    """:func:`die_with_parent` as :func:`parent_token` named the parent."""
    pid, _, how = token.partition("/")
    die_with_parent(int(pid), watch=how == "watch")


def _exit_with(pidfd: int) -> None:
    select.select([pidfd], [], [])
    os._exit(1)
