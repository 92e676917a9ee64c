"""A zygote: one process that has imported everything a child needs and forks
children on request, so a child starts in milliseconds and shares the
libraries' pages with its siblings.

Start. :meth:`Zygote.start` forks the zygote from the calling process when
that is safe (:func:`fork_is_safe`): no Python thread but the main one and no
ZeroMQ context. Native threads of pyarrow's jemalloc and of OpenBLAS register
``pthread_atfork`` handlers and are fork-safe; a ZeroMQ context's I/O threads
are not, so a cluster starts its zygote before it creates one. Where forking
is not safe (a library user's process that runs threads), the zygote is a
fresh interpreter (``python -m shardsink.process PARENT zygote FD ROLE...``),
which costs one import of the libraries, once. Either way the zygote imports
the roles it serves (:mod:`.roles`) before it forks any, closes every
inherited descriptor but its control socket, leads its own process group
(a Ctrl-C for the terminal does not reach it), ignores SIGINT, and dies with
its parent; ``gc.freeze()`` keeps the imported objects' pages shared.

Forks. The parent sends a :class:`Fork` over a ``SOCK_SEQPACKET`` socket pair
(one msgspec message per packet, decoded strictly; descriptors, such as a
stdout pipe, travel as ``SCM_RIGHTS``). Every request carries an ``id`` and
its reply the same one, so a reply that comes after its request timed out is
dropped, never taken for the next request's (a child it reports forked is
killed: nobody tracks it); descriptors that come with a reply nobody takes
are closed. The zygote forks; the child closes the control socket and every
other inherited descriptor, joins or leads its process group (both sides
call ``setpgid``, so no kill can race it), arms ``PR_SET_PDEATHSIG`` against
the zygote, points stdin at ``/dev/null`` and stderr (and stdout, unless a
pipe was passed) at its log file, adds its environment, drops the parent's
log handlers, reseeds ``random`` and runs its role, leaving with
``os._exit``.
The zygote answers :class:`Forked` with a pidfd of the child, opened while the
child is unreaped, so the parent can watch and signal it without racing a
reused pid. The zygote reaps a child only when asked (:class:`Reap`, after
its pidfd said it exited), so a child's process group outlives it until its
supervisor has killed the group.

Why not ``multiprocess``'s forkserver: it passes the process object pickled
over its socket (nothing crossing a socket is unpickled here), offers no
process group or log file per child, and its children are reaped by the
forkserver itself, so a supervisor learns exit statuses only through its own
pipes. What the zygote saves against fresh interpreters is measured by
``shardsink bench startup`` (docs/benchmarks.md, Start-up).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import msgspec

from .child import Launch, Running, exited, killed_wait_s
from .logs import log_file
from .parent import die_with_parent
from .spawn import child_env, entry_argv
from .zygote_messages import (
    MAX_MESSAGE,
    Fork,
    Forked,
    Reap,
    Reaped,
    ZygoteReply,
    ZygoteRequest,
    decode_reply,
    encode,
)
from .zygote_server import close_fds, close_fds_from, point_stdio, serve

log = logging.getLogger(__name__)


class ZygoteError(Exception):
    """The zygote is gone, hung, or refused a request; the message says which."""


def fork_is_safe() -> bool:
    """Whether this process may fork a zygote: only its main Python thread
    runs, and no ZeroMQ context (whose I/O threads are named ``ZMQbg/...``)."""
    if threading.active_count() != 1 or threading.current_thread() is not threading.main_thread():
        return False
    return not any(name.startswith("ZMQbg") for name in _thread_names())


def _thread_names() -> list[str]:
    names = []
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            names.append(Path(f"/proc/self/task/{task}/comm").read_text().strip())
    return names


class Zygote:
    """A zygote forking children of ``roles`` (role names: see :mod:`.roles`;
    a launch of another role is forked too, its child importing it), a
    :class:`~shardsink.process.child.Starter` named ``fork``. Its own
    lifecycle has the children's shape: ``start``, ``pid``, ``alive``,
    ``stop``, ``kill``, ``restart``. A request (:meth:`run`, :meth:`reap`)
    waits at most ``timeout_s`` for its answer (:class:`ZygoteError` after);
    requests may come from any thread and are asked one at a time. ``how``
    is ``fork`` or ``spawn`` once started: how the zygote itself came to be."""

    name = "fork"

    def __init__(self, roles: Sequence[str], run_dir: Path, *, timeout_s: float = 10.0):
        self.roles = tuple(roles)
        self.log_path = log_file(run_dir, "zygote")
        self.timeout_s = timeout_s
        self.how: str | None = None
        self._proc: Running | None = None
        self._sock: socket.socket | None = None
        self._stopped = False
        #: held for a request's exchange, and for what it finds on the socket
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        #: requests that timed out or got a garbled answer, by id: their
        #: answers, if they still come, are nobody's
        self._abandoned: dict[int, ZygoteRequest] = {}
        #: children an abandoned fork started, killed at once: pidfds by pid,
        #: kept until the zygote has reaped them
        self._orphans: dict[int, int] = {}

    # --- the zygote itself ---------------------------------------------------------

    def start(self) -> Zygote:
        """Fork the zygote if :func:`fork_is_safe`, else exec it."""
        if self.alive():
            raise RuntimeError(f"the zygote (pid {self.pid}) is still running")
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            if fork_is_safe():
                self._proc, self.how = _ForkedZygote(self, mine, theirs), "fork"
            else:
                self._proc, self.how = self._exec(theirs), "spawn"
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        mine.settimeout(self.timeout_s)
        self._sock = mine
        self._stopped = False
        return self

    def _exec(self, theirs: socket.socket) -> subprocess.Popen:
        with open(self.log_path, "ab") as log:
            os.fchmod(log.fileno(), 0o600)
            return subprocess.Popen(
                entry_argv("zygote", str(theirs.fileno()), *self.roles),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                pass_fds=(theirs.fileno(),),
                process_group=0,
                env=child_env(),
            )

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("the zygote was never started")
        return self._proc.pid

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self, grace_s: float = 5.0) -> bool:
        """Close the control socket (the zygote exits on it) and reap it;
        SIGKILL after ``grace_s`` (then waited for as
        :func:`~.child.kill_all` does, never raising). Its children die with
        it; forks are refused until it is started again. Idempotent."""
        self._stopped = True
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        # the zygote's children die with it, orphans included; their zombies go to init
        self._abandoned = {}
        orphans, self._orphans = self._orphans, {}
        for pidfd in orphans.values():
            os.close(pidfd)
        proc, self._proc = self._proc, None
        if proc is None:
            return True
        try:
            proc.wait(grace_s)
            return True
        except (TimeoutError, subprocess.TimeoutExpired):
            proc.send_signal(signal.SIGKILL)
        try:  # it can run no more code: a stop does not fail for a zygote slow to be gone
            proc.wait(killed_wait_s())
        except (TimeoutError, subprocess.TimeoutExpired) as exc:
            log.warning("the zygote was SIGKILLed: %s; left to be reaped later", exc)
        return False

    def kill(self) -> None:
        if self._proc is not None:
            self._proc.send_signal(signal.SIGKILL)
        self.stop()

    def restart(self) -> Zygote:
        self.kill()
        return self.start()

    # --- forking children (the Starter) ----------------------------------------------

    def run(self, launch: Launch, *, log_path: Path, pgid: int) -> Running:
        """Fork ``launch``; a zygote that died is restarted first (its children
        died with it, and their supervisors will see that). :class:`ZygoteError`
        if it was stopped, or does not answer."""
        if self._stopped:
            raise ZygoteError("the zygote is stopped")
        if not self.alive():
            self.restart()
        read_end = write_end = None
        if launch.stdout == "pipe":
            read_end, write_end = os.pipe()
        try:
            request = Fork(
                launch, str(log_path), pgid, stdout_fd=write_end is not None, id=next(self._ids)
            )
            reply, fds = self._ask(request, [] if write_end is None else [write_end], keep=1)
        except BaseException:
            if read_end is not None:
                os.close(read_end)
            raise
        finally:
            if write_end is not None:
                os.close(write_end)
        if not isinstance(reply, Forked) or len(fds) != 1:
            close_fds(fds)
            if read_end is not None:
                os.close(read_end)
            raise ZygoteError(f"the zygote did not fork {launch.name}: {reply}")
        stdout = os.fdopen(read_end, "rb") if read_end is not None else None
        return ForkedProcess(self, reply.pid, fds[0], stdout)

    def reap(self, pid: int) -> int | None:
        """The exit status of exited child ``pid`` (reaping it); ``None`` if it
        still runs. A child of a zygote that is gone was killed with it."""
        try:
            reply, _ = self._ask(Reap(pid, id=next(self._ids)))
        except ZygoteError:
            return -signal.SIGKILL
        if not isinstance(reply, Reaped):
            raise ZygoteError(f"the zygote did not reap pid {pid}: {reply}")
        return reply.returncode

    def _ask(
        self, request: ZygoteRequest, fds: Sequence[int] = (), *, keep: int = 0
    ) -> tuple[ZygoteReply, list[int]]:
        """Send ``request`` with ``fds`` (still the caller's to close) and wait,
        at most ``timeout_s`` in all, for the reply bearing its id: that reply,
        and the first ``keep`` descriptors that came with it, now the caller's
        (any more are closed). Replies to requests given up on earlier are
        dropped on the way (:meth:`_drop`), and children an abandoned fork
        started are reaped once dead. :class:`ZygoteError` if the zygote is
        stopped, gone, silent or garbled; the request is then given up on."""
        with self._lock:
            # from here: time spent behind another thread's request is not this one's
            deadline = time.monotonic() + self.timeout_s
            self._reap_orphans(deadline)
            reply, got = self._exchange(request, fds, deadline)
        close_fds(got[keep:])
        return reply, got[:keep]

    def _exchange(
        self, request: ZygoteRequest, fds: Sequence[int], deadline: float
    ) -> tuple[ZygoteReply, list[int]]:
        """``request``'s reply and the descriptors that came with it, by
        ``deadline`` (see :meth:`_ask`). Called with the lock held."""
        sock = self._sock
        if sock is None:
            raise ZygoteError("the zygote is stopped")
        try:
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            socket.send_fds(sock, [encode(request)], list(fds))
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError
                sock.settimeout(remaining)
                data, got, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 1)
                if not data:
                    close_fds(got)
                    raise ZygoteError("the zygote is gone (its socket closed)")
                try:
                    reply = decode_reply(data)
                except msgspec.DecodeError as exc:
                    close_fds(got)
                    self._abandoned[request.id] = request
                    raise ZygoteError(f"a malformed answer from the zygote: {exc}") from exc
                if reply.id == request.id:
                    return reply, got
                self._drop(reply, got)
        except TimeoutError as exc:
            # its answer may still come; whoever reads it then drops it
            self._abandoned[request.id] = request
            raise ZygoteError(f"the zygote did not answer within {self.timeout_s}s") from exc
        except OSError as exc:
            raise ZygoteError(f"the zygote is gone: {exc}") from exc

    def _drop(self, reply: ZygoteReply, fds: list[int]) -> None:
        """Drop ``reply``, which answers no request waited for (one given up
        on, or an unreadable one): close its descriptors; a child it reports
        forked is killed (with the process group it leads, if its fork asked
        for a new one) and kept as an orphan to reap, since nobody tracks it."""
        request = self._abandoned.pop(reply.id, None) if reply.id is not None else None
        if isinstance(reply, Forked) and fds:
            pidfd, fds = fds[0], fds[1:]
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            if isinstance(request, Fork) and request.pgid == 0:
                # it leads its group, and is unreaped: the group id cannot have been reused
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(reply.pid, signal.SIGKILL)
            self._orphans[reply.pid] = pidfd
        close_fds(fds)

    def _reap_orphans(self, deadline: float) -> None:
        """Have the zygote reap the orphans (see :meth:`_drop`) that are dead,
        closing their pidfds. Called with the lock held."""
        for pid, pidfd in list(self._orphans.items()):
            if not exited(pidfd, 0):
                continue
            reply, got = self._exchange(Reap(pid, id=next(self._ids)), (), deadline)
            close_fds(got)
            if isinstance(reply, Reaped) and reply.returncode is None:
                continue  # not reapable yet, though its pidfd said it exited: next time
            if self._orphans.pop(pid, None) is not None:  # else stop() closed it meanwhile
                os.close(pidfd)


class ForkedProcess:
    """A child forked by a zygote, as ``Popen`` shows one (see
    :class:`~shardsink.process.child.Running`): watched and signalled through
    its pidfd, reaped through the zygote."""

    def __init__(self, zygote: Zygote, pid: int, pidfd: int, stdout: IO[bytes] | None) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.stdout = stdout
        self._zygote = zygote
        self._pidfd: int | None = pidfd

    def poll(self) -> int | None:
        pidfd = self._pidfd
        if self.returncode is None and pidfd is not None and exited(pidfd, 0):
            self._reap()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None and self._pidfd is not None:
            if not exited(self._pidfd, timeout):
                raise TimeoutError(f"pid {self.pid} still runs after {timeout}s")
            self._reap()
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None and self._pidfd is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _reap(self) -> None:
        # the pidfd turned readable: it exited, so the zygote's waitpid returns at once
        deadline = time.monotonic() + 1.0
        while (code := self._zygote.reap(self.pid)) is None and time.monotonic() < deadline:
            time.sleep(0.001)
        self.returncode = code if code is not None else -signal.SIGKILL
        assert self._pidfd is not None
        os.close(self._pidfd)
        self._pidfd = None

    def __del__(self) -> None:
        if self._pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(self._pidfd)


class _ForkedZygote:
    """The zygote forked from this process: a direct child, so ``waitpid``
    works as for any child."""

    def __init__(self, zygote: Zygote, mine: socket.socket, theirs: socket.socket) -> None:
        parent = os.getpid()
        log = os.open(zygote.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        pid = os.fork()
        if pid == 0:  # the zygote
            status = 1
            try:
                mine.close()
                os.setpgid(0, 0)
                die_with_parent(parent)
                point_stdio(log, log)
                os.dup2(theirs.fileno(), 3)
                close_fds_from(4)
                serve(zygote.roles, socket.socket(fileno=3))
                status = 0
            finally:
                os._exit(status)
        os.close(log)
        with contextlib.suppress(PermissionError, ProcessLookupError):
            os.setpgid(pid, pid)
        self.pid = pid
        self.returncode: int | None = None
        self.stdout = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"the zygote (pid {self.pid}) still runs after {timeout}s")
            time.sleep(0.005)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:  # unreaped, so the pid is still the zygote's
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)
