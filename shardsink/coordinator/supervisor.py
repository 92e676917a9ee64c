"""The supervisor of a cluster's processes: start, watch, restart, memory.

A cluster's process groups run on a :class:`~.groups.GroupHost`
(``groups.py``): it launches a group (one builder leading the OS process
group, and its workers), kills members, and says which died; the supervisor
touches its members through it only, on this machine
(:class:`~.groups.LocalGroups`) or on the nodes of a Ray cluster alike.

The supervisor learns of its children through the coordinator's socket
(:meth:`Supervisor.on_hello`, :meth:`Supervisor.on_failure`) and by watching
them: a group with a dead member or a failure report is killed whole and
launched again; :meth:`Supervisor.tick`, called on every poll of the
coordinator, samples peak memory and restarts a dead consensus process on its
store. Each group restart is timed from the kill to every member's hello
(``restart_s``).

With ``coalesce`` host (in a sharing mode) each host also runs one host
builder (kind ``builder``, name ``host``, ``host1``, ... by host index,
:func:`~shardsink.protocol.host_builder_name`), started before the groups and
told the pids of its host's group builders, the only creators of segments it
reads. Each group builder's part sender and its host builder's receiver are
one channel numbered from 0 per sender, so neither side can be restarted
alone: if a host builder or any group fails, every host builder and every
group are killed and started again (each group counted as a restart; a
group's host may change), and the attempt in flight is abandoned.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from .. import protocol
from ..config import ClusterConfig
from ..process import ConsensusProcess, ConsensusStartError, peak_rss
from .errors import ClusterError
from .groups import Group, GroupHost, HostInfo, Member

log = logging.getLogger(__name__)

#: How often peak memory of the children is sampled.
RSS_EVERY_S = 0.25


@dataclass
class SupervisionCounters:
    """What supervision did: group restarts and how long each took (from the
    kill to every member ready), peak memory by process kind."""

    restarts: int = 0
    restart_s: list[float] = field(default_factory=list)
    peak_rss: dict[str, int] = field(default_factory=dict)
    #: Group restarts by the host the group ran on.
    host_restarts: dict[int, int] = field(default_factory=dict)


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
        send: Callable[[Member, msgspec.Struct], None],
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
        #: The host builders by host (``coalesce`` host), none otherwise.
        self.host_builders: dict[int, Member] = {}
        self._hosts_ready: set[int] = set()
        self._host_failed: str | None = None
        self.counters = SupervisionCounters()
        self._failed: dict[int, str] = {}
        self._hosts_of: dict[int, int] = {}  # group -> the host it was launched on
        self._last_rss = 0.0

    # --- start and restart ----------------------------------------------------------

    def start(self) -> None:
        """Launch the host builders if any, every group, and wait until all are ready."""
        self._launch_hosts()
        for g in range(self.config.groups):
            self._launch(g)
        self.await_ready(list(self.groups))

    def _launch(self, g: int) -> None:
        self.groups[g] = self.host.launch(g)
        self._hosts_of[g] = self.host.host_of(g)

    def _launch_hosts(self) -> None:
        if self.config.host_builder:
            self._hosts_ready = set()
            self._host_failed = None
            self.host_builders = self.host.launch_hosts()

    def await_ready(self, groups: list[int]) -> None:
        """Wait until every member of ``groups`` said hello; a group whose
        member dies meanwhile is restarted (counted). :class:`ClusterError`
        naming the members that did not start in ``start_timeout_s``."""
        deadline = time.monotonic() + self.config.start_timeout_s
        while True:
            pending = [g for g in groups if len(self.groups[g].ready) < self.config.workers + 1]
            host_pending = [b for h, b in self.host_builders.items() if h not in self._hosts_ready]
            if not pending and not host_pending:
                return
            if time.monotonic() > deadline:
                late = [
                    c.name for g in pending for c in self.groups[g].members
                    if c.name not in self.groups[g].ready
                ]  # fmt: skip
                stuck = [c for g in pending for c in self.groups[g].members]
                late.extend(b.name for b in host_pending)
                stuck.extend(host_pending)
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
            self.host.kill(group.members)
            self._failed.pop(g, None)
            host = self._hosts_of.get(g, 0)
            self.counters.host_restarts[host] = self.counters.host_restarts.get(host, 0) + 1
        if self.host_builders:  # every group is in failed (failed_groups)
            self.host.kill(list(self.host_builders.values()))
            self._launch_hosts()
        for g in sorted(failed):
            self._launch(g)
        self.host.after_kill()
        self.await_ready(list(failed))
        # the groups restart side by side: each took until the last was ready
        self.counters.restart_s.extend([time.monotonic() - began] * len(failed))

    def failed_groups(self, groups: list[int] | None = None) -> dict[int, str]:
        """Groups with a dead member or a failure report, and why. With a host
        builder, a failure of it or of any group fails every group (see the
        module doc)."""
        failed: dict[int, str] = {}
        self.host.watch()
        if groups is None or self.host_builders:
            groups = list(self.groups)
        misplaced = set(self.host.misplaced())
        for g in groups:
            dead = self.groups[g].dead()
            if g in self._failed:
                failed[g] = self._failed[g]
            elif dead:
                failed[g] = ", ".join(
                    f"{c.name} (pid {c.pid}) exited with {c.returncode}" for c in dead
                )
            elif g in misplaced:
                failed[g] = f"moving to host {self.host.host_of(g)}, which is back"
        if not self.host_builders:
            return failed
        why = self._host_failed
        for b in self.host_builders.values():
            if why is None and not b.alive():
                why = f"the host builder {b.name} (pid {b.pid}) exited with {b.returncode}"
        if why is None and not failed:
            return {}
        first = why or next(f"group {g}: {r}" for g, r in sorted(failed.items()))
        return {g: failed.get(g, f"restarted with the host builder ({first})") for g in self.groups}

    def hosts(self) -> list[HostInfo]:
        """Every host placed, with the groups it runs and its group restarts."""
        return [
            msgspec.structs.replace(
                host,
                groups=tuple(g for g, h in sorted(self._hosts_of.items()) if h == host.index),
                restarts=self.counters.host_restarts.get(host.index, 0),
            )
            for host in self.host.hosts()
        ]

    # --- what the children say -------------------------------------------------------

    def member(self, identity: str) -> tuple[Group | None, Member] | None:
        """The group and child whose routing id is ``identity`` (no group for
        a host builder)."""
        for builder in self.host_builders.values():
            if builder.name == identity:
                return None, builder
        for group in self.groups.values():
            for child in group.members:
                if child.name == identity:
                    return group, child
        return None

    def on_hello(self, group: Group | None, child: Member, hello: protocol.Hello) -> None:
        if hello.pid != child.pid:
            return  # a killed incarnation's hello, delivered late
        if group is None:  # a host builder: its senders are its host's group builders
            host = next(h for h, b in self.host_builders.items() if b is child)
            self._hosts_ready.add(host)
            senders = [
                g.builder.pid for i, g in self.groups.items() if self.host.host_of(i) == host
            ]
            self.send(child, protocol.Members(tuple(senders)))
            return
        group.ready.add(child.name)
        if hello.role == "builder":
            self.send(child, protocol.Members(tuple(w.pid for w in group.workers)))

    def on_failure(self, group: Group | None, child: Member, failure: protocol.Failure) -> None:
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
        """:meth:`revive_consensus`; a restart that fails is logged and tried
        again at the next check (a call that needs the process fails only past
        the run's ``append_retry_s``: :func:`~.coordinator.consensus_call`)."""
        try:
            self.revive_consensus()
        except ConsensusStartError as exc:
            log.warning("the consensus process did not come back (tried again next): %s", exc)

    def revive_consensus(self) -> None:
        """Restart the consensus process if it died, as often as it dies;
        :class:`~shardsink.process.ConsensusStartError` if it does not come up."""
        if self.consensus is not None and not self.consensus.alive():
            self.sample_rss(force=True, own=False)
            self.consensus.revive()

    def members(self) -> list[Member]:
        """Every builder and worker: the host builders and the groups' members."""
        out = [c for group in self.groups.values() for c in group.members]
        return [*self.host_builders.values(), *out]

    def children(self) -> list[Member]:
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
        # a reaped child's pid may be another's now
        samples = [(c.kind, self.host.peak_rss(c)) for c in self.members() if c.returncode is None]
        consensus = self.consensus.child if self.consensus is not None else None
        if consensus is not None and consensus.proc is not None and consensus.returncode is None:
            samples.append((consensus.kind, peak_rss(consensus.pid)))
        if own:
            samples.append(("coordinator", peak_rss(os.getpid())))
        peaks = self.counters.peak_rss
        for kind, rss in samples:
            if rss is not None and rss > peaks.get(kind, 0):
                peaks[kind] = rss

    # --- shutdown -----------------------------------------------------------------------

    def stop(self, timeout_s: float) -> None:
        """Ask every member to exit, kill what does not within ``timeout_s``,
        reap all; with ``timeout_s`` 0 (a start given up on, whose members may
        not even have connected to hear it) kill them at once."""
        self.sample_rss(force=True, own=False)
        members = self.members()
        if timeout_s > 0:
            for child in members:
                if child.alive():
                    self.send(child, protocol.Shutdown())
            self.host.stop(members, timeout_s)
        else:
            self.host.kill(members)
        self.host.close()


def log_tails(children: list[Member]) -> str:
    """The tails of the logs of ``children``, each under a header naming it."""
    tails = [f"\n--- {c.name} (pid {c.pid}) log ---\n{c.log_tail()}" for c in children]
    return "".join(t for t in tails if t.strip())
