"""Processes in a network namespace: started, stopped, found, killed.

A process is started in a namespace through ``ip netns exec``, which enters
it and execs the command in place (the ``Popen``'s pid is the command's), in
a process group of its own so that it and its children are stopped together.
Processes found in a namespace (a dead run's leftovers, anything a closing
run still has there) are killed through a pidfd opened while they were seen
there, so a recycled pid is never signalled.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

#: How long stop() lets a process group end on SIGTERM before SIGKILL, and
#: then how long it waits for the KILLed: a process may ignore SIGTERM (a Ray
#: head may), so nothing waits on a TERM unbounded.
TERM_TIMEOUT_S = 5.0
KILL_TIMEOUT_S = 5.0
_POLL_S = 0.02


def popen_in(
    netns: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None, **kwargs
) -> subprocess.Popen:
    """Start ``argv`` in the network namespace ``netns``, leading a new process
    group; ``kwargs`` go to ``subprocess.Popen`` (pipes, cwd, ...). ``env``
    replaces the environment (``None``: this process's)."""
    return subprocess.Popen(
        ["ip", "netns", "exec", netns, *argv],
        env=None if env is None else dict(env),
        process_group=0,
        **kwargs,
    )


def stop(
    proc: subprocess.Popen,
    *,
    term_timeout: float = TERM_TIMEOUT_S,
    kill_timeout: float = KILL_TIMEOUT_S,
) -> int:
    """SIGTERM ``proc``'s process group, SIGKILL what of it is left after
    ``term_timeout`` seconds, reap ``proc``; its exit status (``-N``: signal
    N). ``subprocess.TimeoutExpired`` if it outlives the KILL by
    ``kill_timeout`` seconds (a process in uninterruptible sleep)."""
    group = proc.pid
    deadline = time.monotonic() + term_timeout
    # The group's id is the leader's pid, which no other process takes while the
    # group has a member (or the leader is unreaped): signalling it hits only ours.
    if proc.returncode is None or group_members(group):
        _killpg(group, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(term_timeout)
    while group_members(group) and time.monotonic() < deadline:
        time.sleep(_POLL_S)  # the leader exited; its children are ending
    if proc.poll() is None or group_members(group):
        _killpg(group, signal.SIGKILL)
    returncode = proc.wait(kill_timeout)
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
    return returncode


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group ``pgid``."""
    return [pid for pid, (state, group) in _stats() if group == pgid and state not in "ZX"]


def processes_in(netns_inode: int) -> list[int]:
    """The live processes whose network namespace is the one of inode
    ``netns_inode`` (``os.stat('/run/netns/NAME').st_ino``)."""
    found = []
    for pid, (state, _) in _stats():
        if state in "ZX":
            continue
        with contextlib.suppress(OSError):  # gone meanwhile, or a kernel thread
            if os.stat(f"/proc/{pid}/ns/net").st_ino == netns_inode:
                found.append(pid)
    return found


def kill_in(netns_inode: int, pids: Iterable[int], *, timeout: float = KILL_TIMEOUT_S) -> list[int]:
    """SIGKILL each of ``pids`` still in the namespace of ``netns_inode`` and
    wait up to ``timeout`` seconds for them to exit; the pids killed.
    ``TimeoutError`` naming those still running then."""
    killed: dict[int, int] = {}
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:  # checked through the pidfd: the pid is not recycled while we hold it
            if os.stat(f"/proc/{pid}/ns/net").st_ino == netns_inode:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
                killed[pid] = fd
                continue
        except (OSError, ProcessLookupError):
            pass
        os.close(fd)
    deadline = time.monotonic() + timeout
    try:
        for pid, fd in killed.items():
            if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                raise TimeoutError(f"process {pid} outlived SIGKILL by {timeout} s")
    finally:
        for fd in killed.values():
            os.close(fd)
    return sorted(killed)


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def _stats() -> Iterable[tuple[int, tuple[str, int]]]:
    """(pid, (state, process group)) of every process, from ``/proc/<pid>/stat``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_bytes()
        except OSError:
            continue
        # The command name (field 2) may hold spaces and parentheses; fields after it do not.
        fields = stat[stat.rindex(b")") + 2 :].split()
        yield int(entry.name), (fields[0].decode(), int(fields[2]))
