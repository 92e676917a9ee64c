"""Starting and stopping the delay nemesis's packet holder.

The holder (:mod:`._delay_handler`) runs inside the delayed host's namespace
and is bound to its queue before the rule that fills the queue is added; it
is stopped after that rule is removed, by closing its standard input, so
that it lets every packet it holds go before it unbinds.
"""

from __future__ import annotations

import contextlib
import select
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import msgspec

from ._delay_handler import Holding
from .tools import CommandFailed

HANDLER = Path(__file__).with_name("_delay_handler.py")
#: The holder imports only the standard library, msgspec and netfilterqueue:
#: ready in well under a second, unless the machine is loaded.
READY_TIMEOUT_S = 15.0
#: A clean stop lets go of at most a delay's worth of packets: quick.
CLEAN_STOP_TIMEOUT_S = 5.0

Starter = Callable[..., subprocess.Popen]
Stopper = Callable[[subprocess.Popen], int]


def start(
    popen: Starter, stop: Stopper, queue: int, ms: float, jitter_ms: float
) -> subprocess.Popen:
    """Start a holder through ``popen`` (``popen(argv, **Popen kwargs)``, in the
    host) bound to ``queue``, holding each packet ``ms`` +- ``jitter_ms``;
    returns it once bound. ``CommandFailed`` with its error output if it
    exits or is not bound within :data:`READY_TIMEOUT_S` (it is stopped
    through ``stop`` then)."""
    holding = Holding(queue=queue, delay_ms=ms, jitter_ms=jitter_ms)
    argv = [sys.executable, "-P", str(HANDLER), msgspec.json.encode(holding).decode()]
    proc = popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    ready = select.select([proc.stdout], [], [], READY_TIMEOUT_S)[0]
    line = proc.stdout.readline() if ready else b""
    if line.strip() == b"ready":
        return proc
    try:  # it exited (its stdout closed): its error output says why
        error = proc.communicate(timeout=CLEAN_STOP_TIMEOUT_S if ready else 0)[1]
    except subprocess.TimeoutExpired:
        error = b""
    stop(proc)
    lines = error.decode(errors="replace").strip().splitlines()
    why = lines[-1] if lines else f"not bound within {READY_TIMEOUT_S} s"
    raise CommandFailed(f"the delay handler of queue {queue} did not start: {why}")


def finish(proc: subprocess.Popen, stop: Stopper) -> int:
    """Stop a holder cleanly (stdin closed: it accepts what it holds, unbinds,
    exits 0); through ``stop`` if it does not within
    :data:`CLEAN_STOP_TIMEOUT_S`. Its exit status."""
    proc.stdin.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(CLEAN_STOP_TIMEOUT_S)
    return stop(proc)
