"""One lifecycle shape for every child process: start, pid, alive, stop, kill, restart.

A :class:`Child` is a :class:`Launch` (what to run: a role, named
``package.module:function`` (:mod:`.roles`), and its payload) plus a
:class:`Starter` (how: a fresh interpreter, or a fork of a zygote; see
:mod:`.spawn` and :mod:`.zygote`). The running process is a :class:`Running`
whatever the starter, so supervisors, tests and chaos treat both alike.

Only processes this module started are signalled. A process group is killed
with ``killpg`` only while one of its members is unreaped (so its id cannot
have been reused), and every member is reaped here.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Protocol

import psutil

from .._wire import Message
from . import logs

log = logging.getLogger(__name__)


class Launch(Message):
    """What a child runs: ``role`` (``package.module:function``, see
    :mod:`.roles`), given ``payload`` (never in argv: it may hold secrets).
    ``kind`` groups children in summaries (consensus, builder, worker, ...);
    ``name`` is unique in a run and names its log file; ``env`` is added to
    its environment. Its stdout goes to its log (``"log"``), to a pipe the
    parent reads (``"pipe"``: a role may take it over as its channel to the
    parent, :mod:`.ready`), to ``/dev/null`` (``"null"``), or is appended to
    the file at that path."""

    kind: str
    name: str
    role: str
    payload: bytes = b""
    env: dict[str, str] = {}
    stdout: str = "log"


class Running(Protocol):
    """A started process as ``subprocess.Popen`` shows it: ``poll`` and
    ``wait`` reap it, ``returncode`` is ``None`` until then (``-N`` for a
    signal), ``send_signal`` is a no-op once it is reaped."""

    pid: int
    returncode: int | None
    stdout: IO[bytes] | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...


class Starter(Protocol):
    """Starts a :class:`Launch`: in process group ``pgid`` (0: a new group it
    leads), stderr appended to ``log_path``; the process dies with the
    cluster. ``name`` says which (``fork`` or ``spawn``)."""

    name: str

    def run(self, launch: Launch, *, log_path: Path, pgid: int) -> Running: ...


class Launched:
    """What a started :class:`Launch` goes by: its ``kind`` and ``name``
    (a :class:`Child` here, or a member a host agent started elsewhere)."""

    launch: Launch

    @property
    def kind(self) -> str:
        return self.launch.kind

    @property
    def name(self) -> str:
        return self.launch.name


class Child(Launched):
    """A child process of one :class:`Launch`, started by ``starter`` in
    ``run_dir`` (its log: :func:`~.logs.log_file`, where this process notes
    each start and exit, :mod:`.logs`). With a ``leader``, it joins the
    leader's process group (started first); without, it leads its own."""

    def __init__(
        self, launch: Launch, starter: Starter, run_dir: Path, leader: Child | None = None
    ) -> None:
        self.launch = launch
        self.starter = starter
        self.leader = leader
        self.log_path = logs.log_file(run_dir, launch.name)
        self.proc: Running | None = None
        self.pgid = 0
        self.starts = 0
        self._exit_noted = False
        #: the signal this process last sent it (its log then says so), ``None`` before
        self.sent: int | None = None

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError(f"{self.name} was never started")
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.returncode

    def start(self) -> Child:
        """Start it (again); ``RuntimeError`` if it is still running."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError(f"{self.name} (pid {self.pid}) is still running")
        pgid = 0 if self.leader is None else self.leader.pid
        logs.rotate(self.log_path)
        self.proc = self.starter.run(self.launch, log_path=self.log_path, pgid=pgid)
        self.pgid = pgid or self.proc.pid
        self.starts += 1
        self._exit_noted, self.sent = False, None
        logs.note(self.log_path, f"{self.name} started: pid {self.proc.pid}")
        return self

    def alive(self) -> bool:
        """Whether it is running (reaps it if it exited)."""
        if self.proc is None:
            return False
        if self.proc.poll() is None:
            return True
        self.note_exit()
        return False

    def note_exit(self) -> None:
        """Say in its log how it ended, once per start, if it has been reaped."""
        if self.proc is None or self.proc.returncode is None or self._exit_noted:
            return
        self._exit_noted = True
        code = self.proc.returncode
        words = logs.exit_words(code)
        if self.sent is not None and code == -self.sent:
            words += ", sent by its parent"
        logs.note(self.log_path, f"{self.name} (pid {self.proc.pid}) {words}")

    def wait(self, timeout_s: float) -> int | None:
        """Its exit status once it exits (reaped), or ``None`` if it still
        runs after ``timeout_s``."""
        try:
            reap([self], timeout_s)
        except TimeoutError:
            return None
        return self.returncode

    def stop(self, grace_s: float, sig: int = signal.SIGTERM) -> bool:
        """Send ``sig`` if it is alive and reap it; SIGKILL it after
        ``grace_s`` (and wait for it as :func:`kill_all` does, never raising).
        Whether it exited by itself (an exited child: True)."""
        if self.alive():
            assert self.proc is not None
            self.sent = sig
            self.proc.send_signal(sig)
        try:
            reap([self], grace_s)
        except TimeoutError:
            kill_all([self])
            return False
        return True

    def kill(self, timeout_s: float | None = None) -> None:
        """SIGKILL it (its process group too, if it leads one) and reap it, as
        :func:`kill_all` does."""
        kill_all([self], timeout_s)

    def restart(self) -> Child:
        """Kill (if alive) and start it again from the same launch."""
        self.kill()
        return self.start()

    def log_tail(self, limit: int = 2000) -> str:
        """The last ``limit`` bytes of its log (how it ended included, if it has)."""
        self.note_exit()
        try:
            return self.log_path.read_bytes()[-limit:].decode(errors="replace")
        except OSError:
            return ""

    def __repr__(self) -> str:
        pid = self.proc.pid if self.proc is not None else None
        return f"Child({self.name!r}, pid={pid}, {self.starter.name})"


#: How long SIGKILLed processes may take to be gone on a machine whose run
#: queue is no longer than its CPUs; :func:`killed_wait_s` scales it with the
#: load. A killed child of a 4x8 cluster here is gone within milliseconds; on a
#: machine at a load average of about 1,500 a killed consensus process was not
#: gone within a fixed 10 s, and the stop failed a run whose data was durable.
KILLED_WAIT_S = 10.0


def killed_wait_s() -> float:
    """How long to wait for processes this one SIGKILLed to be gone:
    :data:`KILLED_WAIT_S` times the 1-minute load average per CPU this
    process may run on, at least once (a killed process has to be scheduled to
    exit, and the run queue says how long that takes)."""
    cpus = len(os.sched_getaffinity(0)) or 1
    return KILLED_WAIT_S * max(1.0, os.getloadavg()[0] / cpus)


def kill_all(children: list[Child], timeout_s: float | None = None) -> list[Child]:
    """SIGKILL ``children`` (first the process groups that live leaders among
    them lead) and reap them all, waiting up to ``timeout_s`` (default
    :func:`killed_wait_s`) for them to be gone. Never raises for a straggler:
    it can run no more code, so it is named in the log and left to be reaped
    later (by :meth:`Child.alive`, a later kill, or init once this process
    exits); the stragglers are returned. A member alone is killed alone,
    never its leader's group."""
    # polled first: one that died by itself is reaped (and noted) as such
    live = [c for c in children if c.alive()]
    for child in live:
        child.sent = signal.SIGKILL
    # An unreaped leader holds the group id, so killpg cannot hit a reused one.
    for pgid in {c.pgid for c in live if c.leader is None}:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    for child in live:
        assert child.proc is not None
        child.proc.send_signal(signal.SIGKILL)
    wait_s = killed_wait_s() if timeout_s is None else timeout_s
    try:
        reap(live, wait_s)
    except TimeoutError as exc:
        log.warning("%s after SIGKILL; left to be reaped later", exc)
        return [c for c in live if c.returncode is None]
    return []


def reap(children: list[Child], timeout_s: float) -> None:
    """Wait for ``children`` to exit, ``timeout_s`` for them all, and reap
    them (``TimeoutError`` naming the stragglers)."""
    deadline = time.monotonic() + timeout_s
    stuck = []
    for child in children:
        if child.proc is None:
            continue
        try:
            wait_exit(child.proc, max(0.0, deadline - time.monotonic()))
        except (TimeoutError, subprocess.TimeoutExpired):
            stuck.append(f"{child.name} (pid {child.pid})")
            continue
        child.note_exit()
        if child.proc.stdout is not None:
            child.proc.stdout.close()
    if stuck:
        raise TimeoutError(f"processes did not exit within {timeout_s:.3g}s: {', '.join(stuck)}")


def wait_exit(proc: Running, timeout_s: float) -> int:
    """Reap ``proc`` once it exits, waiting at most ``timeout_s``
    (``TimeoutError`` after). A ``Popen`` is watched through a pidfd, opened
    while it is unreaped (so the pid is still its own), rather than polled
    with sleeps as ``Popen.wait`` does."""
    if isinstance(proc, subprocess.Popen) and proc.returncode is None:
        try:
            pidfd = os.pidfd_open(proc.pid)
        except ProcessLookupError:  # reaped by a wait elsewhere: Popen still has its status
            return proc.wait(timeout_s)
        try:
            if not exited(pidfd, timeout_s):
                raise TimeoutError(f"pid {proc.pid} still runs after {timeout_s:.3g}s")
        finally:
            os.close(pidfd)
        return proc.wait(0)
    return proc.wait(timeout_s)


def exited(pidfd: int, timeout_s: float | None) -> bool:
    """Whether the process of ``pidfd`` has exited (its pidfd is readable),
    waiting up to ``timeout_s`` for it (``None``: for as long as it takes).
    ``poll``, not ``select``: a pidfd may be numbered 1024 or more."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    # rounded up, so a short wait is not a busy one
    ms = None if timeout_s is None else max(0, math.ceil(timeout_s * 1000))
    return bool(poller.poll(ms))


@contextlib.contextmanager
def sigint_ignored() -> Iterator[None]:
    """Ctrl-C ignored in the block, when it runs in the main thread (the only
    one Python delivers it to): a stop that kills and reaps children is never
    cut short."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def peak_rss(pid: int) -> int | None:
    """Peak resident bytes of a live process (``VmHWM``), or ``None`` if gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return None
    return None


def reset_own_peak_rss() -> bool:
    """Restart this process's peak-RSS count (``VmHWM``) from its current
    RSS, so that one phase can be measured apart; ``False`` if the kernel
    does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


#: The environment variable that marks every process of a run (chaos's),
#: found by :func:`marked`; host agents carry it to what they start.
RUN_MARK = "SHARDSINK_CHAOS_RUN"


def marked(name: str, value: str) -> dict[int, str]:
    """Live processes (zombies aside) whose environment holds ``name=value``,
    by pid, with their command lines. A mark set in a child's environment is
    inherited by everything it starts (forked or spawned), so this finds its
    descendants even after they were orphaned and re-parented."""
    out = {}
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):  # gone, or not ours to read
            if process.environ().get(name) == value and process.status() != psutil.STATUS_ZOMBIE:
                out[process.pid] = " ".join(process.cmdline()) or process.name()
    return out
