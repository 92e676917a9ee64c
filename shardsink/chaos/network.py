"""The nemesis's faults between emulated hosts (``chaos --hosts netns:N``).

Each network event of the schedule (:data:`~.schedule.NETWORK_KINDS`) is
carried out by :class:`NetworkFaults` through the hosts' own nemesis
(:mod:`shardsink.netns.nemesis`) and healed ``lasts_s`` later; which hosts
it hits is :func:`aim`'s choice, a pure function of the event's ``pick``
and the hosts' roles, so a seed hits the same hosts every run:

- ``partition-host``: one host cut from every other (both ways);
- ``partition-halves``: a minority of the hosts cut from the rest;
- ``partition-store``: one host cut from a server's host only (the
  consensus server's, PostgreSQL's or S3's), the rest untouched;
- ``partition-one-way``: what one host sends another lost, not the reverse;
- ``loss``: packets one host receives lost at random (``amount``: the
  probability); ``delay``: held ``amount`` ms, +- a quarter of it;
- ``clock-skew``: one host's wall clock ``amount`` seconds off (its
  processes': the consensus server judges leases by its own clock).

Each fault is recorded, once healed, in the run's ``fired.jsonl`` (kind as
``point``, action ``network``, start and end, hosts, peers, parameters),
where the report counts it and the timeline draws it as a band.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from pathlib import Path

import msgspec

from .schedule import Event


class Aim(msgspec.Struct, frozen=True):
    """Which hosts (by index) a network event acts on: ``hosts``, and the
    other side (``peers``) for a partition."""

    kind: str
    hosts: tuple[int, ...]
    peers: tuple[int, ...] = ()


def aim(event: Event, hosts: int, servers: tuple[int, ...]) -> Aim:
    """The hosts ``event`` hits among ``hosts`` (indexes ``0..hosts-1``);
    ``servers`` are the hosts running a server (consensus, stores)."""
    pick, kind = event.pick, event.kind
    every = list(range(hosts))
    one = pick % hosts
    if kind == "partition-halves":
        shuffled = every[:]
        random.Random(pick).shuffle(shuffled)
        minority = max(1, (hosts - 1) // 2)
        return Aim(kind, tuple(sorted(shuffled[:minority])), tuple(sorted(shuffled[minority:])))
    if kind == "partition-store":
        server = servers[pick % len(servers)]
        others = [h for h in every if h != server]
        return Aim(kind, (others[(pick // 7) % len(others)],), (server,))
    if kind == "partition-one-way":
        others = [h for h in every if h != one]
        return Aim(kind, (one,), (others[(pick // hosts) % len(others)],))
    if kind == "partition-host":
        return Aim(kind, (one,), tuple(h for h in every if h != one))
    return Aim(kind, (one,))


class NetworkFaults:
    """Carries out network events on ``network`` (a :class:`~shardsink.netns.Network`
    of the run's hosts), ``servers`` its server hosts; records each fault
    in ``fault_dir``'s ``fired.jsonl`` when it is healed. Thread-safe;
    :meth:`heal_all` (idempotent) heals what is still active."""

    def __init__(self, network, servers: tuple[int, ...], fault_dir: Path) -> None:
        self._network = network
        self._servers = servers
        self._fault_dir = fault_dir
        self._lock = threading.Lock()
        #: heal time (monotonic) -> (the netns fault, its record so far)
        self._active: list[tuple[float, object, dict]] = []

    def inject(self, event: Event) -> bool:
        """Carry ``event`` out now, to heal ``lasts_s`` later; ``False`` if it
        cannot be (a host delayed already takes no second delay)."""
        target = aim(event, len(self._network.hosts), self._servers)
        nemesis = self._network.nemesis
        names = [f"h{h}" for h in target.hosts]
        peers = [f"h{h}" for h in target.peers]
        try:
            fault = self._act(nemesis, target, names, peers, event.amount)
        except ValueError:  # a second delay or skew of a host still faulted
            return False
        record = {
            "point": event.kind, "action": "network", "pid": os.getpid(), "role": "nemesis",
            "time": time.time(), "hosts": names, "peers": peers, "params": dict(fault.params),
        }  # fmt: skip
        with self._lock:
            self._active.append((time.monotonic() + event.lasts_s, fault, record))
        return True

    @staticmethod
    def _act(nemesis, target: Aim, names: list[str], peers: list[str], amount: float):
        kind = target.kind
        if kind in ("partition-halves", "partition-store"):
            return nemesis.partition(names, peers)
        if kind == "partition-one-way":
            return nemesis.partition_one_way(names[0], peers[0])
        if kind == "partition-host":
            return nemesis.isolate(names[0])
        if kind == "loss":
            return nemesis.loss(names[0], amount)
        if kind == "delay":
            return nemesis.delay(names[0], amount, amount / 4)
        if kind == "clock-skew":
            return nemesis.clock_skew(names[0], amount)
        raise AssertionError(kind)

    def next_heal(self) -> float | None:
        """When the next active fault is due to heal (monotonic), if any."""
        with self._lock:
            return min((at for at, _, _ in self._active), default=None)

    def heal_due(self, now: float | None = None) -> None:
        """Heal every fault due by ``now`` (default: the monotonic clock)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            due = [a for a in self._active if a[0] <= now]
            self._active = [a for a in self._active if a[0] > now]
        for _, fault, record in due:
            self._heal(fault, record)

    def heal_all(self) -> None:
        with self._lock:
            left, self._active = self._active, []
        for _, fault, record in left:
            self._heal(fault, record)

    def _heal(self, fault, record: dict) -> None:
        try:
            self._network.nemesis.heal(fault)
        finally:
            record["end"] = time.time()
            line = (json.dumps(record) + "\n").encode()
            fd = os.open(self._fault_dir / "fired.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                         0o600)  # fmt: skip
            try:
                os.write(fd, line)  # one write of a short line: never interleaved
            finally:
                os.close(fd)
