"""The zygote's side (see :mod:`.zygote`): import the roles it serves, then
fork a child for every :class:`~.zygote_messages.Fork` and reap one for every
:class:`~.zygote_messages.Reap` on its control socket, until the socket closes."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import random
import signal
import socket
import sys
from collections.abc import Sequence

import msgspec

from .parent import die_with_parent
from .roles import resolve, run_role
from .zygote_messages import (
    MAX_MESSAGE,
    Fork,
    Forked,
    Reap,
    Reaped,
    Refused,
    decode_addressed,
    decode_request,
    encode,
)


def serve(roles: Sequence[str], control: socket.socket) -> None:
    """Import ``roles``, then serve forks on ``control`` until it closes (see
    the module doc)."""
    from setproctitle import setproctitle

    setproctitle("shardsink zygote")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    for role in roles:  # before the freeze: their modules' pages are then shared
        try:
            resolve(role)
        except (ValueError, ImportError, AttributeError) as exc:
            # it exits: its parent's next request finds it gone, and its log says why
            print(f"zygote: no role {role!r}: {exc}", file=sys.stderr, flush=True)
            return
    gc.freeze()
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(control, MAX_MESSAGE, 1)
        except OSError:
            return
        if not data:
            return
        try:
            request = decode_request(data)
        except msgspec.DecodeError as exc:
            close_fds(fds)
            print(f"zygote: a malformed request: {exc}", file=sys.stderr, flush=True)
            refused = Refused(reason=f"malformed request: {exc}", id=_id_of(data))
            socket.send_fds(control, [encode(refused)], [])
            continue
        if isinstance(request, Reap):
            reaped = Reaped(request.pid, _reap(request.pid), id=request.id)
            socket.send_fds(control, [encode(reaped)], [])
            continue
        try:
            pid = _fork(request, fds, control)
        except OSError as exc:
            refused = Refused(reason=f"fork failed: {exc}", id=request.id)
            socket.send_fds(control, [encode(refused)], [])
            continue
        finally:
            close_fds(fds)
        try:
            pidfd = os.pidfd_open(pid)
        except OSError as exc:
            # nobody could watch it: it must not run (unreaped, so the pid is still its)
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            refused = Refused(reason=f"no pidfd for the child: {exc}", id=request.id)
            socket.send_fds(control, [encode(refused)], [])
            continue
        try:
            socket.send_fds(control, [encode(Forked(pid, id=request.id))], [pidfd])
        finally:
            os.close(pidfd)


def _id_of(data: bytes) -> int | None:
    """The ``id`` of a request that does not decode whole, if it shows one."""
    try:
        return decode_addressed(data).id
    except msgspec.DecodeError:
        return None


def _reap(pid: int) -> int | None:
    try:
        got, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # not ours, or reaped already
        return -signal.SIGKILL
    return os.waitstatus_to_exitcode(status) if got else None


def _fork(request: Fork, fds: list[int], control: socket.socket) -> int:
    log = os.open(request.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    where = request.launch.stdout
    if request.stdout_fd and fds:
        stdout = fds[0]
    elif where in ("log", "pipe"):
        stdout = log
    else:
        path = os.devnull if where == "null" else where
        stdout = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    zygote = os.getpid()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            control.close()
            os.setpgid(0, request.pgid)
            die_with_parent(zygote)
            point_stdio(stdout, log)
            close_fds_from(3)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            # the parent's log handlers write to descriptors closed above
            logging.root.handlers.clear()
            os.environ.update(request.launch.env)
            random.seed()
            status = run_role(request.launch.role, request.launch.payload)
        finally:
            os._exit(status)
    os.close(log)
    if stdout not in (log, *fds):
        os.close(stdout)
    with contextlib.suppress(PermissionError, ProcessLookupError):
        os.setpgid(pid, request.pgid or pid)
    return pid


def point_stdio(stdout: int, stderr: int) -> None:
    """Descriptors 0-2 to /dev/null, ``stdout`` and ``stderr``, and Python's
    streams onto them (the parent's may wrap other descriptors, a test
    runner's capture files for one)."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(stdout, 1)
    os.dup2(stderr, 2)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 (the process's own stream)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115


def close_fds_from(low: int) -> None:
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))


def close_fds(fds: Sequence[int]) -> None:
    for fd in fds:
        os.close(fd)
