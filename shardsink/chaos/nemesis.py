"""The nemesis: carries out a schedule's events against a running cluster.

Only processes of the cluster that ``shardsink chaos`` started are signalled:
the coordinator (its own child) and that coordinator's descendants, found
by their names in ``ps`` (``shardsink worker g0/w2`` ...), each signalled
only while its pid still names it. A group kill uses ``killpg`` on the
builder's group right after checking that the builder is alive.

With groups on the nodes of a Ray cluster on this machine, a host's
processes descend from its host agent, not from the coordinator: an agent
is a process carrying the run's mark (:data:`~shardsink.process.RUN_MARK`,
which agents inherit) whose parent does not (Ray's raylet started it). Its
named descendants are targets like the coordinator's; a host fault signals
the agent and every descendant of it at once.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import psutil

from .. import faults
from ..process import RUN_MARK, marked
from .network import NetworkFaults
from .schedule import PAUSES, SIGNAL_TARGETS, Event, kind_of

_TITLE = re.compile(r"^shardsink (consensus|builder|worker)\b ?(\S*)")

#: How long a signal event keeps looking for a process to hit while the
#: cluster restarts (a group, the consensus process, the coordinator: a few
#: seconds each, more under load), and how often it looks.
SIGNAL_RETRY_S = 30.0
SIGNAL_RETRY_EVERY_S = 0.1


class Target(NamedTuple):
    """A process of the cluster: ``kind`` coordinator, consensus, builder or
    worker. Signals go through ``process``, which checks that the pid still
    names the process that was listed (pids of dead children are reused)."""

    kind: str
    name: str
    process: psutil.Process

    @property
    def pid(self) -> int:
        return self.process.pid


def cluster_processes(coordinator: int, mark: str = "") -> list[Target]:
    """The coordinator ``coordinator`` and its live named descendants, and
    those of the host agents of the run marked ``mark`` (if given), by name."""
    try:
        parent = psutil.Process(coordinator)
        children = parent.children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    for agent in host_agents(mark, coordinator) if mark else []:
        with contextlib.suppress(psutil.Error):
            children.extend(agent.children(recursive=True))
    out = [Target("coordinator", "coordinator", parent)]
    for child in children:
        with contextlib.suppress(psutil.Error):
            match = _TITLE.match(" ".join(child.cmdline()))
            if match and child.status() != psutil.STATUS_ZOMBIE:
                kind, name = match.groups()
                out.append(Target(kind, name or kind, child))
    return sorted(out, key=lambda t: (t.kind, t.name))


def host_agents(mark: str, coordinator: int) -> list[psutil.Process]:
    """The live host agents of the run marked ``mark`` on this machine that
    are up (they have started a child), by pid: marked processes whose
    parent is not marked, the coordinator aside.

    One still starting is left alone: killing the process Ray is starting an
    agent in, while its node lives on, is no machine lost but a worker that
    never registers, which Ray reports only after its registration timeout
    (a minute)."""
    pids = set(marked(RUN_MARK, mark)) - {coordinator}
    out = []
    for pid in sorted(pids):
        with contextlib.suppress(psutil.Error):
            process = psutil.Process(pid)
            parent = process.ppid()
            if parent not in pids and parent != coordinator and process.children():
                out.append(process)
    return out


def host_processes(mark: str, coordinator: int) -> list[list[psutil.Process]]:
    """Each host's processes (its agent, then every descendant), by agent pid."""
    out = []
    for agent in host_agents(mark, coordinator):
        with contextlib.suppress(psutil.Error):
            out.append([agent, *agent.children(recursive=True)])
    return out


class Nemesis:
    """Runs ``events`` (from :func:`~.schedule.schedule`) from ``start`` (a
    ``time.monotonic()`` value) in a thread, against the coordinator whose pid
    ``coordinator()`` returns (``None`` while there is none).

    ``mark`` is the run's mark, by which the processes of its hosts (on the
    nodes of a Ray cluster on this machine) are found; empty without hosts.
    ``fault_dir`` holds the point budgets: :meth:`hold_points` holds every
    firing back in advance; a point event releases the next one. A signal
    event that finds no process of its kind (the cluster is restarting) or
    whose victim dies before the signal looks again, for up to
    :data:`SIGNAL_RETRY_S`; later events wait for it. By kind, ``signalled``
    counts the signals sent, ``released`` the point firings released (the
    firings themselves are recorded by the processes that fire), ``missed``
    the signal events that found no process to hit in time; :meth:`lost`
    gives the firings taken by a process killed before it recorded them.
    """

    def __init__(
        self,
        events: list[Event],
        fault_dir: Path,
        coordinator: Callable[[], int | None],
        start: float,
        mark: str = "",
        *,
        network: NetworkFaults | None = None,
        servers: Callable[[], list[Target]] | None = None,
    ) -> None:
        self.events = events
        #: network events' faults, healed on time (between emulated hosts only)
        self.network = network
        #: processes of the run that are none of the coordinator's descendants
        #: (the consensus server of emulated hosts)
        self.servers = servers
        self.mark = mark
        self.fault_dir = fault_dir
        self.coordinator = coordinator
        self.start = start
        self.signalled: Counter[str] = Counter()
        self.released: Counter[str] = Counter()
        self.missed: Counter[str] = Counter()
        self._released_of: Counter[str] = Counter()  # by point: the next firing to release
        self._lock = threading.Lock()  # _released_of is read by other threads
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nemesis", daemon=True)
        self.error: BaseException | None = None

    def hold_points(self, specs: list[faults.FaultSpec]) -> None:
        """Hold back every firing of ``specs``' budgets until it is released."""
        self.fault_dir.mkdir(parents=True, exist_ok=True)
        for spec in specs:
            for n in range(spec.times):
                faults.hold(self.fault_dir, spec, n)

    def begin(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop before the next event (a pause in progress ends first), and
        heal every network fault still active."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        if self.network is not None:
            self.network.heal_all()

    def untaken(self) -> int:
        """Point firings released that no process has taken yet."""
        taken = self._taken()
        with self._lock:
            return sum(n - taken[point] for point, n in self._released_of.items())

    def lost(self) -> Counter[str]:
        """By kind, the point firings a process took but never recorded: it
        was killed in between (its group was being killed), so the fault
        never acted, and no other process can take it."""
        fired = Counter(f"{f['point']}:{f['action']}" for f in faults.fired(self.fault_dir))
        out: Counter[str] = Counter()
        for point, n in self._taken().items():
            if n > fired[point]:
                out[kind_of(*point.split(":"))] += n - fired[point]
        return out

    def settled(self) -> bool:
        """Whether every event has been carried out (begun, not stopped),
        every firing released has been taken and every network fault healed."""
        return (
            self._thread.ident is not None
            and not self._thread.is_alive()
            and not (self._stop.is_set() or self.untaken())
        )

    def _taken(self) -> Counter[str]:
        """By point (``NAME:ACTION``), the released firings some process has
        taken (its claim of the firing's slot is a file in ``fault_dir``)."""
        with self._lock:
            released = dict(self._released_of)
        taken: Counter[str] = Counter()
        for point, n in released.items():
            spec = faults.FaultSpec(*point.split(":"))
            slots = (self.fault_dir / faults.slot_name(spec, i) for i in range(n))
            taken[point] = sum(slot.exists() for slot in slots)
        return taken

    def _run(self) -> None:
        try:
            for event in self.events:
                if self._wait_until(self.start + event.at_s):
                    return
                if event.how == "point":
                    self._release(event)
                elif event.how == "network":
                    self._inject(event)
                else:
                    self._signal(event)
            while self.network is not None and self.network.next_heal() is not None:
                if self._wait_until(self.network.next_heal()):
                    return
        except BaseException as exc:  # reported by the runner as a violation
            self.error = exc

    def _wait_until(self, when: float) -> bool:
        """Wait until ``when`` (monotonic), healing network faults as they
        come due; whether the nemesis was stopped meanwhile."""
        while True:
            if self.network is not None:
                self.network.heal_due()
                heal = self.network.next_heal()
            else:
                heal = None
            until = when if heal is None else min(when, heal)
            if self._stop.wait(max(0.0, until - time.monotonic())):
                return True
            if until >= when:
                return False

    def _inject(self, event: Event) -> None:
        assert self.network is not None
        # a fault carried out is counted from fired.jsonl once healed
        if not self.network.inject(event):
            self.missed[event.kind] += 1

    def _release(self, event: Event) -> None:
        name, action = event.point.split(":")
        spec = faults.FaultSpec(name, action)
        for _ in range(event.count):
            faults.release(self.fault_dir, spec, self._released_of[event.point])
            with self._lock:
                self._released_of[event.point] += 1
        self.released[event.kind] += event.count

    def _signal(self, event: Event) -> None:
        deadline = time.monotonic() + SIGNAL_RETRY_S
        while not self._hit(event):
            if time.monotonic() >= deadline or self._stop.wait(SIGNAL_RETRY_EVERY_S):
                self.missed[event.kind] += 1
                return
        self.signalled[event.kind] += 1

    def _hit(self, event: Event) -> bool:
        """Signal a process for ``event``; whether one was there to signal."""
        coordinator = self.coordinator()
        target = SIGNAL_TARGETS[event.kind]
        if target == "host":
            hosts = host_processes(self.mark, coordinator) if coordinator is not None else []
            return bool(hosts) and _hit_all(hosts[event.pick % len(hosts)], event)
        processes = cluster_processes(coordinator, self.mark) if coordinator is not None else []
        if self.servers is not None:
            processes += self.servers()
        kind = "builder" if target == "group" else target
        pool = [p for p in processes if target == "any" or p.kind == kind]
        if not pool:
            return False
        victim = pool[event.pick % len(pool)]
        process = victim.process
        try:
            if event.kind in PAUSES:
                process.suspend()
                try:
                    time.sleep(event.pause_s)
                finally:
                    with contextlib.suppress(psutil.NoSuchProcess):  # restarted meanwhile
                        process.resume()
            elif target == "group":
                if not process.is_running():
                    raise psutil.NoSuchProcess(process.pid)
                os.killpg(process.pid, signal.SIGKILL)
            else:
                process.kill()
        except (psutil.NoSuchProcess, ProcessLookupError):  # died since the listing
            return False
        return True


def _hit_all(processes: list[psutil.Process], event: Event) -> bool:
    """SIGKILL ``processes`` (one host's) at once, or for a pause SIGSTOP
    them all for ``event.pause_s`` and SIGCONT them; whether any was there."""
    hit = []
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            (process.suspend if event.kind in PAUSES else process.kill)()
            hit.append(process)
    if event.kind in PAUSES:
        try:
            time.sleep(event.pause_s)
        finally:
            for process in hit:
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.resume()
    return bool(hit)
