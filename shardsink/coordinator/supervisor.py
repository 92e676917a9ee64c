"""The supervisor of a cluster's processes: start, watch, restart, memory.

A cluster's process groups run on a :class:`GroupHost`: it launches a group
(one builder leading the OS process group, and its workers) and kills one
whole. :class:`LocalGroups` runs them on this machine, started by a
:class:`~shardsink.process.Starter` (the zygote's forks, or fresh
interpreters); an orchestrator of groups on other hosts would implement the
same three calls.

The supervisor learns of its children through the coordinator's socket
(:meth:`Supervisor.on_hello`, :meth:`Supervisor.on_failure`) and by watching
them: a group with a dead member or a failure report is killed whole and
launched again; :meth:`Supervisor.tick`, called on every poll of the
coordinator, samples peak memory and restarts a dead consensus process on its
store. Each group restart is timed from the kill to every member's hello
(``restart_s``).

With ``coalesce`` host (in a sharing mode) the host also runs one host
builder (kind ``builder``, name ``host``), started before the groups and told
the pids of their builders, the only creators of segments it reads. Each
group builder's part sender and the host builder's receiver are one channel
numbered from 0 per sender, so neither side can be restarted alone: if the
host builder or any group fails, the host builder and every group are killed
and started again (each group counted as a restart), and the attempt in
flight is abandoned.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import msgspec

from .. import protocol
from ..config import ClusterConfig
from ..process import Child, ConsensusProcess, Launch, Starter, kill_all, peak_rss, reap
from ..shm import sweep
from .errors import ClusterError

log = logging.getLogger(__name__)

#: How often peak memory of the children is sampled.
RSS_EVERY_S = 0.25


@dataclass
class Group:
    """The processes of one group: its builder leads the OS process group."""

    index: int
    builder: Child
    workers: list[Child]
    ready: set[str] = field(default_factory=set)

    @property
    def members(self) -> list[Child]:
        return [self.builder, *self.workers]

    def dead(self) -> list[Child]:
        return [c for c in self.members if not c.alive()]


class GroupHost(Protocol):
    """Where a cluster's process groups run.

    ``launch(index)`` starts group ``index`` (its members say hello to the
    coordinator when they are ready); ``launch_host()`` starts the host
    builder; ``kill(group)`` kills every member and returns once none runs;
    ``after_kill()`` cleans what killed members left (their shared-memory
    segments)."""

    def launch(self, index: int) -> Group: ...

    def launch_host(self) -> Child: ...

    def kill(self, group: Group) -> None: ...

    def after_kill(self) -> None: ...


class LocalGroups:
    """Process groups on this machine, started by ``starter``; each member
    gets its :class:`~shardsink.protocol.ChildSpec` as its payload."""

    def __init__(
        self,
        config: ClusterConfig,
        cluster_id: str,
        run_dir: Path,
        coordinator: str,
        inline_max_bytes: int,
        starter: Starter,
    ) -> None:
        self.config = config
        self.cluster_id = cluster_id
        self.run_dir = run_dir
        self.coordinator = coordinator
        self.inline_max_bytes = inline_max_bytes
        self.starter = starter

    def launch(self, index: int) -> Group:
        builder = self._child(index, 0, protocol.BUILDER_ROLE, f"g{index}/b", None).start()
        workers: list[Child] = []
        try:
            for w in range(self.config.workers):
                worker = self._child(index, w, protocol.WORKER_ROLE, f"g{index}/w{w}", builder)
                workers.append(worker.start())
        except BaseException:
            kill_all([builder, *workers])
            raise
        return Group(index, builder, workers)

    def launch_host(self) -> Child:
        return self._child(0, 0, protocol.HOST_BUILDER_ROLE, "host", None, sockets="host").start()

    def _child(
        self,
        g: int,
        index: int,
        role: str,
        name: str,
        leader: Child | None,
        *,
        sockets: str | None = None,
    ) -> Child:
        """A member of group ``g`` (the host builder: ``sockets`` "host")."""
        sockets = sockets or f"g{g}"
        host = self.config.host_builder
        spec = protocol.ChildSpec(
            group=g,
            index=index,
            cluster_id=self.cluster_id,
            coordinator=self.coordinator,
            parts=f"ipc://{self.run_dir / f'{sockets}.parts'}",
            handoff=f"ipc://{self.run_dir / f'{sockets}.handoff'}",
            inline_max_bytes=self.inline_max_bytes,
            config=self.config,
            host_parts=f"ipc://{self.run_dir / 'host.parts'}" if host else "",
            host_handoff=f"ipc://{self.run_dir / 'host.handoff'}" if host else "",
        )
        kind = "worker" if role == protocol.WORKER_ROLE else "builder"
        launch = Launch(kind=kind, name=name, role=role, payload=protocol.encode_spec(spec))
        return Child(launch, self.starter, self.run_dir, leader=leader)

    def kill(self, group: Group) -> None:
        kill_all(group.members)

    def after_kill(self) -> None:
        sweep(self.cluster_id)  # the killed members' segments: their creators are dead


@dataclass
class SupervisionCounters:
    """What supervision did: group restarts and how long each took (from the
    kill to every member ready), peak memory by process kind."""

    restarts: int = 0
    restart_s: list[float] = field(default_factory=list)
    peak_rss: dict[str, int] = field(default_factory=dict)


class Supervisor:
    """Starts, watches and restarts the groups of one cluster (see the module
    doc). ``send`` delivers a message to a child; ``poll(ms)`` handles what
    the coordinator's socket receives within ``ms`` (and calls back
    :meth:`on_hello` and :meth:`on_failure`); ``consensus`` is the consensus
    process to restart when it dies, ``None`` for an external server."""

    def __init__(
        self,
        config: ClusterConfig,
        host: GroupHost,
        send: Callable[[Child, msgspec.Struct], None],
        poll: Callable[[int], None],
        consensus: ConsensusProcess | None,
        *,
        poll_ms: int,
    ) -> None:
        self.config = config
        self.host = host
        self.send = send
        self.poll = poll
        self.consensus = consensus
        self.poll_ms = poll_ms
        self.groups: dict[int, Group] = {}
        #: The host builder (``coalesce`` host), ``None`` otherwise.
        self.host_builder: Child | None = None
        self._host_ready = False
        self._host_failed: str | None = None
        self.counters = SupervisionCounters()
        self._failed: dict[int, str] = {}
        self._last_rss = 0.0

    # --- start and restart ----------------------------------------------------------

    def start(self) -> None:
        """Launch the host builder if any, every group, and wait until all are ready."""
        self._launch_host()
        for g in range(self.config.groups):
            self.groups[g] = self.host.launch(g)
        self.await_ready(list(self.groups))

    def _launch_host(self) -> None:
        if self.config.host_builder:
            self._host_ready = False
            self._host_failed = None
            self.host_builder = self.host.launch_host()

    def await_ready(self, groups: list[int]) -> None:
        """Wait until every member of ``groups`` said hello; a group whose
        member dies meanwhile is restarted (counted). :class:`ClusterError`
        naming the members that did not start in ``start_timeout_s``."""
        deadline = time.monotonic() + self.config.start_timeout_s
        while True:
            pending = [g for g in groups if len(self.groups[g].ready) < self.config.workers + 1]
            host_pending = self.host_builder is not None and not self._host_ready
            if not pending and not host_pending:
                return
            if time.monotonic() > deadline:
                late = [
                    c.name for g in pending for c in self.groups[g].members
                    if c.name not in self.groups[g].ready
                ]  # fmt: skip
                stuck = [c for g in pending for c in self.groups[g].members]
                if host_pending:
                    assert self.host_builder is not None
                    late.append(self.host_builder.name)
                    stuck.append(self.host_builder)
                raise ClusterError(
                    f"{', '.join(late)} did not start within {self.config.start_timeout_s}s"
                    + log_tails(stuck)
                )
            self.poll(self.poll_ms)
            failed = self.failed_groups(groups)
            if failed:
                self.restart(failed)
                deadline = time.monotonic() + self.config.start_timeout_s

    def restart(self, failed: dict[int, str]) -> None:
        """Kill each group of ``failed`` (index: why) whole, launch it again and
        wait until it is ready. :class:`ClusterError` past ``max_restarts``."""
        began = time.monotonic()
        for g, why in sorted(failed.items()):
            self.counters.restarts += 1
            group = self.groups[g]
            log.warning(
                "restarting group %d (restart %d): %s%s",
                g,
                self.counters.restarts,
                why,
                log_tails(group.dead()),
            )
            if self.counters.restarts > self.config.max_restarts:
                raise ClusterError(
                    f"more than {self.config.max_restarts} restarts; the last: group {g}: {why}"
                    + log_tails(group.dead())
                )
            self.sample_rss(force=True, own=False)
            self.host.kill(group)
            self._failed.pop(g, None)
        if self.host_builder is not None:  # every group is in failed (failed_groups)
            kill_all([self.host_builder])
            self._launch_host()
        for g in sorted(failed):
            self.groups[g] = self.host.launch(g)
        self.host.after_kill()
        self.await_ready(list(failed))
        # the groups restart side by side: each took until the last was ready
        self.counters.restart_s.extend([time.monotonic() - began] * len(failed))

    def failed_groups(self, groups: list[int] | None = None) -> dict[int, str]:
        """Groups with a dead member or a failure report, and why. With a host
        builder, a failure of it or of any group fails every group (see the
        module doc)."""
        failed: dict[int, str] = {}
        if groups is None or self.host_builder is not None:
            groups = list(self.groups)
        for g in groups:
            dead = self.groups[g].dead()
            if g in self._failed:
                failed[g] = self._failed[g]
            elif dead:
                failed[g] = ", ".join(
                    f"{c.name} (pid {c.pid}) exited with {c.returncode}" for c in dead
                )
        if self.host_builder is None:
            return failed
        host = self.host_builder
        why = self._host_failed
        if why is None and not host.alive():
            why = f"the host builder (pid {host.pid}) exited with {host.returncode}"
        if why is None and not failed:
            return {}
        first = why or next(f"group {g}: {r}" for g, r in sorted(failed.items()))
        return {g: failed.get(g, f"restarted with the host builder ({first})") for g in self.groups}

    # --- what the children say -------------------------------------------------------

    def member(self, identity: str) -> tuple[Group | None, Child] | None:
        """The group and child whose routing id is ``identity`` (no group for
        the host builder)."""
        if self.host_builder is not None and self.host_builder.name == identity:
            return None, self.host_builder
        for group in self.groups.values():
            for child in group.members:
                if child.name == identity:
                    return group, child
        return None

    def on_hello(self, group: Group | None, child: Child, hello: protocol.Hello) -> None:
        if hello.pid != child.pid:
            return  # a killed incarnation's hello, delivered late
        if group is None:  # the host builder: its senders are the group builders
            self._host_ready = True
            self.send(child, protocol.Members(tuple(g.builder.pid for g in self.groups.values())))
            return
        group.ready.add(child.name)
        if hello.role == "builder":
            self.send(child, protocol.Members(tuple(w.pid for w in group.workers)))

    def on_failure(self, group: Group | None, child: Child, failure: protocol.Failure) -> None:
        if failure.pid == child.pid:
            log.warning("%s failed: %s", child.name, failure.reason)
            if group is None:
                self._host_failed = f"{child.name} failed: {failure.reason}"
            else:
                self._failed[group.index] = f"{child.name} failed: {failure.reason}"

    # --- watching ---------------------------------------------------------------------

    def tick(self) -> None:
        """Sample peak memory (at most every ``RSS_EVERY_S``); restart a dead
        consensus process."""
        self.sample_rss()
        self.check_consensus()

    def check_consensus(self) -> None:
        if self.consensus is not None and not self.consensus.alive():
            log.warning("the consensus process died; restarting it on %s", self.consensus.store)
            self.sample_rss(force=True, own=False)
            self.consensus.restart()

    def members(self) -> list[Child]:
        """Every builder and worker: the members of the groups and the host builder."""
        out = [c for group in self.groups.values() for c in group.members]
        return out if self.host_builder is None else [self.host_builder, *out]

    def children(self) -> list[Child]:
        """Every child process this supervisor started (consensus included)."""
        out = self.members()
        if self.consensus is not None and self.consensus.child.proc is not None:
            out.append(self.consensus.child)
        return out

    def sample_rss(self, force: bool = False, *, own: bool = True) -> None:
        """Record the peak memory of every live child of the cluster and, with
        ``own``, of this process (at most every ``RSS_EVERY_S`` unless ``force``)."""
        now = time.monotonic()
        if not force and now - self._last_rss < RSS_EVERY_S:
            return
        self._last_rss = now
        peaks = self.counters.peak_rss
        for child in self.children():
            if child.returncode is not None:  # reaped: its pid may be another's now
                continue
            rss = peak_rss(child.pid)
            if rss is not None and rss > peaks.get(child.kind, 0):
                peaks[child.kind] = rss
        mine = peak_rss(os.getpid()) if own else None
        if mine is not None and mine > peaks.get("coordinator", 0):
            peaks["coordinator"] = mine

    # --- shutdown -----------------------------------------------------------------------

    def stop(self, timeout_s: float) -> None:
        """Ask every member to exit, kill what does not, reap all."""
        self.sample_rss(force=True, own=False)
        members = self.members()
        for child in members:
            if child.alive():
                self.send(child, protocol.Shutdown())
        try:
            reap(members, timeout_s)
        except TimeoutError as exc:
            log.warning("%s; killing them", exc)
        kill_all(members)  # TimeoutError if one is stuck even past SIGKILL


def log_tails(children: list[Child]) -> str:
    """The tails of the logs of ``children``, each under a header naming it."""
    tails = [f"\n--- {c.name} (pid {c.pid}) log ---\n{c.log_tail()}" for c in children]
    return "".join(t for t in tails if t.strip())
