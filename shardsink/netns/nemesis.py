"""Network faults between emulated hosts, each with its heal.

Every fault returns a :class:`Fault` record (its kind, hosts and
parameters) that a caller can log, and :meth:`Nemesis.heal` undoes exactly
that fault. Firewall faults (:mod:`.rules`) live in the receiving hosts'
own namespaces, so deleting a host deletes them; the delay's packet holder
runs in the delayed host (:mod:`.delay`); clock skew rewrites the host's
offset file (:mod:`.clock`).
"""

from __future__ import annotations

import contextlib
import itertools
import subprocess
from collections.abc import Callable, Iterable, Sequence
from typing import Literal, Protocol

import msgspec

from . import delay, rules, tools
from .clock import Clocks
from .names import Host

Kind = Literal["partition", "partition_one_way", "isolate", "loss", "delay", "clock_skew"]
HostRef = Host | str | int


class Fault(msgspec.Struct, frozen=True):
    """One fault injected. ``hosts`` are the hosts it acts on (one side of a
    partition, the sender cut off, the isolated, lossy, delayed or skewed
    host), ``peers`` the others involved (the other side, the receiver), by
    short name (``h0``...); ``params`` its figures (``probability``, ``ms``
    and ``jitter_ms``, ``seconds``)."""

    id: int
    kind: Kind
    hosts: tuple[str, ...]
    peers: tuple[str, ...] = ()
    params: dict[str, float] = {}


class Hosts(Protocol):
    """Where a :class:`Nemesis` injects faults (a :class:`~.network.Network`).

    Invariants: ``exec`` and ``popen`` run as root in the host's own network
    namespace, so that a rule added there stays there and goes with it;
    ``exec`` returns the command's output or raises ``CommandFailed``;
    ``popen`` starts a process group of its own, which ``stop`` ends
    (SIGTERM, SIGKILL after a bound) and reaps; ``host`` resolves a name,
    index or :class:`Host` of these hosts and raises ``ValueError`` for any
    other; ``clocks`` holds the hosts' clocks if they can be skewed."""

    hosts: tuple[Host, ...]
    clocks: Clocks | None

    def host(self, ref: HostRef) -> Host: ...

    def exec(self, host: HostRef, argv: Sequence[str], *, input: str | None = None) -> str: ...

    def popen(self, host: HostRef, argv: Sequence[str], **kwargs) -> subprocess.Popen: ...

    def stop(self, proc: subprocess.Popen) -> int: ...


class Nemesis:
    """The faults of one set of hosts."""

    def __init__(self, hosts: Hosts) -> None:
        self._hosts = hosts
        self._ids = itertools.count(1)
        self._heals: dict[int, tuple[Fault, Callable[[], None]]] = {}

    @property
    def active(self) -> tuple[Fault, ...]:
        """The faults injected and not healed, oldest first."""
        return tuple(fault for fault, _ in self._heals.values())

    def partition(self, hosts_a: Iterable[HostRef], hosts_b: Iterable[HostRef]) -> Fault:
        """Cut every host of ``hosts_a`` from every host of ``hosts_b``, both
        ways; each side still reaches its own and any third host."""
        a, b = self._sides(hosts_a, hosts_b)
        drops = {h: rules.drop_from(p.address for p in b) for h in a}
        drops |= {h: rules.drop_from(p.address for p in a) for h in b}
        return self._rules("partition", a, b, drops)

    def partition_one_way(self, src: HostRef, dst: HostRef) -> Fault:
        """Lose everything ``src`` sends to ``dst``; ``dst`` still reaches ``src``."""
        (s,), (d,) = self._sides([src], [dst])
        return self._rules("partition_one_way", (s,), (d,), {d: rules.drop_from([s.address])})

    def isolate(self, host: HostRef) -> Fault:
        """Cut ``host`` from every other host, both ways."""
        h = self._hosts.host(host)
        others = tuple(o for o in self._hosts.hosts if o != h)
        drops = {h: rules.drop_all()} | {o: rules.drop_from([h.address]) for o in others}
        return self._rules("isolate", (h,), others, drops)

    def loss(self, host: HostRef, probability: float) -> Fault:
        """Lose each packet ``host`` receives with ``probability`` (0 < p <= 1)."""
        if not 0 < probability <= 1:
            raise ValueError(f"loss probability {probability} is not in (0, 1]")
        h = self._hosts.host(host)
        return self._rules(
            "loss", (h,), (), {h: rules.drop_randomly(probability)}, probability=probability
        )

    def delay(self, host: HostRef, ms: float, jitter_ms: float = 0.0) -> Fault:
        """Hold each packet ``host`` receives ``ms`` milliseconds, +- a uniform
        ``jitter_ms``. ``ValueError`` if ``host`` is delayed already (a packet
        the first holder lets go skips the second's rule)."""
        if ms <= 0 or jitter_ms < 0:
            raise ValueError(f"delay {ms} ms +- {jitter_ms} ms: need ms > 0 and jitter_ms >= 0")
        h = self._hosts.host(host)
        for fault in self.active:
            if fault.kind == "delay" and h.name in fault.hosts:
                raise ValueError(f"{h.name} is delayed already (fault {fault.id}); heal it first")
        tools.require_netfilterqueue()
        fault_id = next(self._ids)
        queue = fault_id % 65536  # queue numbers are 16 bits; one delay a host at a time

        def popen(argv, **kwargs):
            return self._hosts.popen(h, argv, **kwargs)

        holder = delay.start(popen, self._hosts.stop, queue, ms, jitter_ms)
        try:
            fault = self._rules(
                "delay", (h,), (), {h: rules.queue(queue)}, fault_id, ms=ms, jitter_ms=jitter_ms
            )
        except BaseException:
            delay.finish(holder, self._hosts.stop)
            raise
        remove_rules = self._heals[fault.id][1]

        def heal() -> None:
            try:
                remove_rules()  # first: no packet is queued to a holder that is gone
            finally:
                delay.finish(holder, self._hosts.stop)

        self._heals[fault.id] = (fault, heal)
        return fault

    def clock_skew(self, host: HostRef, seconds: float) -> Fault:
        """Set ``host``'s wall clock ``seconds`` off the real one, in its running
        processes too; replaces the host's earlier skew. ``ValueError`` unless
        the hosts were made with clocks."""
        clocks = self._hosts.clocks
        if clocks is None:
            raise ValueError("clock skew needs hosts made with clocks (Network(..., clocks=True))")
        h = self._hosts.host(host)
        for fault in self.active:
            if fault.kind == "clock_skew" and h.name in fault.hosts:
                del self._heals[fault.id]  # superseded: one offset per host
        clocks.set(h.name, seconds)
        fault = Fault(next(self._ids), "clock_skew", (h.name,), params={"seconds": seconds})
        self._heals[fault.id] = (fault, lambda: clocks.set(h.name, 0.0))
        return fault

    def heal(self, fault: Fault) -> None:
        """Undo ``fault``; nothing if it is healed already. It no longer counts
        as active even if undoing it fails (then with ``CommandFailed``)."""
        _, heal = self._heals.pop(fault.id, (None, None))
        if heal is not None:
            heal()

    def heal_all(self) -> None:
        """Heal every active fault, newest first; every one is tried, and the
        first error is raised after."""
        tools.each(reversed(self.active), self.heal)

    def _sides(
        self, hosts_a: Iterable[HostRef], hosts_b: Iterable[HostRef]
    ) -> tuple[tuple[Host, ...], tuple[Host, ...]]:
        a = tuple(dict.fromkeys(map(self._hosts.host, hosts_a)))
        b = tuple(dict.fromkeys(map(self._hosts.host, hosts_b)))
        if not a or not b or set(a) & set(b):
            names = [h.name for h in a], [h.name for h in b]
            raise ValueError(f"sides {names[0]} and {names[1]} must be non-empty and disjoint")
        return a, b

    def _rules(
        self,
        kind: Kind,
        hosts: tuple[Host, ...],
        peers: tuple[Host, ...],
        chains: dict[Host, list[str]],
        fault_id: int | None = None,
        **params: float,
    ) -> Fault:
        """Add one chain of ``chains``' rules in each of its hosts (all or
        none: those added are removed if one fails) as one fault."""
        tools.require_iptables()
        fault_id = next(self._ids) if fault_id is None else fault_id
        chain = rules.chain_name(fault_id)
        first = kind != "delay"
        added: list[Host] = []

        def restore(host: Host, text: str) -> None:
            self._hosts.exec(host, ["iptables-restore", "--noflush"], input=text)

        def remove() -> None:
            tools.each(reversed(added), lambda host: restore(host, rules.remove_chain(chain)))

        try:
            for host, lines in chains.items():
                restore(host, rules.add_chain(chain, lines, first=first))
                added.append(host)
        except BaseException:
            with contextlib.suppress(Exception):  # the error that stopped us is the one to see
                remove()
            raise
        names = tuple(h.name for h in hosts), tuple(h.name for h in peers)
        fault = Fault(fault_id, kind, names[0], names[1], dict(params))
        self._heals[fault_id] = (fault, remove)
        return fault
