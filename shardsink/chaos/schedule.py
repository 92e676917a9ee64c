"""The nemesis's fault schedule: a pure function of the seed.

A fault kind is injected in one of two ways:

- by *signal*: at the event's time the nemesis SIGKILLs (or SIGSTOPs, then
  SIGCONTs) one process of the kind's target, picked by ``pick`` among those
  alive, ordered by name;
- through a *fault point* (``shardsink.faults``): every process of the run is
  armed with the point at probability 1, but each firing of its budget is
  held back in advance (``faults.hold``), so the point stays dormant; at the
  event's time the nemesis releases the next one, and the next process to
  pass the point fires it;
- over the *network* between emulated hosts (``--hosts netns:N``,
  :mod:`shardsink.netns`): at the event's time the nemesis cuts, slows or
  skews what ``pick`` chooses, and heals it ``lasts_s`` later.

So the same seed gives the same events at the same times; what each one hits
depends on what the cluster is doing then, as it must. Only what the run's
mode can fire is scheduled: in mode ``off`` no batch is shared, so no process
passes the builder's points or the last finisher's.
"""

from __future__ import annotations

import random
from collections import Counter

import msgspec

from .. import faults
from ..config import Mode

#: The faults between emulated hosts, each healed after its drawn
#: ``lasts_s``: one host cut from all the others; the hosts split into a
#: majority and a minority; a host cut from the consensus server's host or
#: a store's only; one host's packets to another lost, not the other way;
#: packets a host receives lost at random; held before they arrive; a
#: host's wall clock set off by seconds to minutes (its processes', through
#: libfaketime).
NETWORK_KINDS = (
    "partition-host",
    "partition-halves",
    "partition-store",
    "partition-one-way",
    "loss",
    "delay",
    "clock-skew",
)
#: Every fault kind, in the order reports list them.
FAULT_KINDS = (
    "kill-worker",
    "kill-builder",
    "kill-group",
    "kill-last-finisher",
    "kill-consensus",
    "kill-coordinator",
    "pause",
    "kill-host",
    "pause-host",
    "blob-errors",
    "consensus-errors",
    *NETWORK_KINDS,
)

#: How long after a network fault heals the next may begin: time for an
#: append retried through the fault to land and the cluster to show it
#: recovered, short enough for a 300 s run to draw each kind a few times.
NETWORK_QUIET_S = 5.0
#: What a network fault's ``amount`` is drawn from: a probability, a delay
#: in ms (its jitter a quarter of it), a skew in seconds (either way).
NETWORK_AMOUNTS: dict[str, tuple[float, float]] = {
    "loss": (0.05, 0.4),
    "delay": (20.0, 200.0),
    "clock-skew": (30.0, 900.0),
}

#: What a signal event of each kind hits: a process kind, ``group`` (the
#: builder's whole process group), ``any`` process of the cluster, or
#: ``host``: every process of one host at once, its agent included (a
#: machine lost, or stalled as a partition or a paused VM looks).
SIGNAL_TARGETS: dict[str, str] = {
    "kill-worker": "worker",
    "kill-builder": "builder",
    "kill-group": "group",
    "kill-consensus": "consensus",
    "kill-coordinator": "coordinator",
    "pause": "any",
    "kill-host": "host",
    "pause-host": "host",
}
#: The kinds that hit a whole host: only with groups on a Ray cluster's hosts.
HOST_KINDS = tuple(kind for kind, target in SIGNAL_TARGETS.items() if target == "host")
#: The kinds that stop processes for a while rather than kill them.
PAUSES = ("pause", "pause-host")

#: The fault points (point, action) through which each kind is injected.
#: GC and compaction run in the consensus process (GC also in ``shard gc``),
#: so a kill between GC's listing and its deletes, or in a compaction, counts
#: as a consensus kill.
POINTS: dict[str, tuple[tuple[str, str], ...]] = {
    "kill-worker": (
        ("worker.after_encode", "kill"),
        ("worker.after_push", "kill"),
        ("worker.before_report", "kill"),
    ),
    "kill-builder": (("builder.after_upload", "kill"), ("builder.before_handoff", "kill")),
    "kill-group": (),
    "kill-last-finisher": (("worker.last_finisher", "kill"),),
    "kill-consensus": (
        ("consensus.after_store", "kill"),
        ("transaction.before_store", "kill"),
        ("transaction.after_store", "kill"),
        ("gc.before_delete", "kill"),
        ("compaction.after_write", "kill"),
        ("compaction.after_commit", "kill"),
    ),
    "kill-coordinator": (("append.before_cas", "kill"), ("append.after_cas", "kill")),
    "pause": (
        ("gc.before_delete", "pause"),
        ("reader.before_fetch", "pause"),
        ("compaction.after_write", "pause"),
    ),
    "kill-host": (),
    "pause-host": (),
    "blob-errors": (("blob.call", "determinate"), ("blob.call", "indeterminate")),
    "consensus-errors": (("consensus.call", "determinate"), ("consensus.call", "indeterminate")),
}

#: Points only a process of a group sharing batches passes (any mode but ``off``).
SHARED_POINTS = frozenset(
    {"worker.after_push", "worker.last_finisher", "builder.after_upload", "builder.before_handoff"}
)

#: Points only an append of one shard passes, and only a transaction across
#: several: a workload of several shards appends every interval as one
#: transaction, so its consensus process is killed with some shards'
#: versions prepared and none stored, or all stored and none answered.
SINGLE_POINTS = frozenset({"consensus.after_store"})
TRANSACTION_POINTS = frozenset({"transaction.before_store", "transaction.after_store"})

#: A store error event releases this many faults at once (a burst, as when a
#: store flaps), at most.
MAX_BURST = 3


class Event(msgspec.Struct, frozen=True, kw_only=True):
    """One fault: at ``at_s`` seconds into the run, ``kind`` by ``how``
    (``signal``, ``point`` or ``network``). A signal event hits process
    ``pick`` (modulo the live ones) and, for a pause, stops it for
    ``pause_s``; a point event releases ``count`` firings of ``point``
    (``NAME:ACTION``); a network event acts on hosts chosen by ``pick`` for
    ``lasts_s`` seconds, with ``amount`` (:data:`NETWORK_AMOUNTS`)."""

    at_s: float
    kind: str
    how: str
    pick: int = 0
    pause_s: float = 0.0
    point: str = ""
    count: int = 1
    lasts_s: float = 0.0
    amount: float = 0.0


def ways(
    kind: str,
    mode: Mode,
    *,
    hosts: bool = False,
    network: bool = False,
    transactions: bool = False,
) -> list[tuple[str, str]]:
    """How ``kind`` can be injected in ``mode``: ``("signal", "")``,
    ``("point", "NAME:ACTION")`` and ``("network", "")`` pairs, none if
    ``mode`` never reaches it (a host kind: none but on hosts of a Ray
    cluster, ``hosts``; a network kind none but between emulated hosts,
    ``network``; :data:`TRANSACTION_POINTS` only, and
    :data:`SINGLE_POINTS` never, when every append is a transaction across
    shards, ``transactions``)."""
    if kind in NETWORK_KINDS:
        return [("network", "")] if network else []
    signal = [("signal", "")] if kind in SIGNAL_TARGETS else []
    if SIGNAL_TARGETS.get(kind) == "host" and not hosts:
        signal = []
    never = SINGLE_POINTS if transactions else TRANSACTION_POINTS
    return signal + [
        ("point", f"{name}:{action}")
        for name, action in POINTS[kind]
        if (mode != "off" or name not in SHARED_POINTS) and name not in never
    ]


def check_kinds(kinds: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """``kinds`` as a tuple; ``ValueError`` naming an unknown one (and the
    known ones) or an empty list."""
    unknown = [k for k in kinds if k not in FAULT_KINDS]
    if unknown:
        raise ValueError(f"unknown fault kind {unknown[0]!r}; known: {', '.join(FAULT_KINDS)}")
    if not kinds:
        raise ValueError(f"no fault kind given; known: {', '.join(FAULT_KINDS)}")
    return tuple(dict.fromkeys(kinds))


def injectable(
    kinds: list[str] | tuple[str, ...],
    mode: Mode,
    *,
    hosts: bool = False,
    network: bool = False,
    transactions: bool = False,
) -> tuple[str, ...]:
    """Those of ``kinds`` (checked by :func:`check_kinds`) that ``mode`` can
    fire (on hosts of a Ray cluster with ``hosts``, between emulated hosts
    with ``network``, appends as transactions with ``transactions``: see
    :func:`ways`); ``ValueError`` if there is none."""
    checked = check_kinds(kinds)
    reach = {"hosts": hosts, "network": network, "transactions": transactions}
    out = tuple(k for k in checked if ways(k, mode, **reach))
    if not out:
        where = "" if hosts else f" on one machine ({', '.join(HOST_KINDS)}: --hosts ray:...)"
        if not network and set(checked) & set(NETWORK_KINDS):
            where += f" ({', '.join(NETWORK_KINDS)}: --hosts netns:N)"
        raise ValueError(
            f"none of the fault kinds {', '.join(kinds)} fires in mode {mode!r}{where}"
        )
    return out


def schedule(
    seed: int,
    duration_s: float,
    kinds: tuple[str, ...],
    *,
    mode: Mode,
    mean_gap_s: float,
    pause_max_s: float,
    quiet_s: float = 2.0,
    hosts: bool = False,
    network: bool = False,
    network_max_s: float = 10.0,
    transactions: bool = False,
) -> list[Event]:
    """The events of a run in ``mode`` (on hosts of a Ray cluster with
    ``hosts``, between emulated hosts with ``network``, appends as
    transactions with ``transactions``): gaps drawn from an
    exponential distribution of mean ``mean_gap_s``, none in the first or
    last ``quiet_s`` seconds; each event's kind uniform over those of
    ``kinds`` that can fire (with network kinds among them: every one once
    a round, each round shuffled), then one of the kind's :func:`ways` with equal
    chance; a network fault lasts 1 to ``network_max_s`` seconds, and the
    next waits until it has healed and :data:`NETWORK_QUIET_S` more (one at
    a time, as Jepsen's nemesis starts and stops them, so that a run shows
    how the cluster recovers from each). ``ValueError`` if none of
    ``kinds`` can fire."""
    if mean_gap_s <= 0 or pause_max_s <= 0 or network_max_s < 1:
        raise ValueError("mean_gap_s and pause_max_s must be > 0, network_max_s >= 1")
    reach = {"hosts": hosts, "network": network, "transactions": transactions}
    kinds = injectable(kinds, mode, **reach)
    rng = random.Random(f"chaos:{seed}")
    events = []
    at = quiet_s
    network_free = 0.0  # when the last network fault has healed, and a quiet spell after
    rounds: list[str] = []
    in_rounds = network and bool(set(kinds) & set(NETWORK_KINDS))
    while True:
        at += rng.expovariate(1.0 / mean_gap_s)
        if in_rounds:
            # One at a time and lasting seconds, a run holds a few dozen
            # network faults: drawn in rounds (every kind once a round, in a
            # shuffled order) rather than each at random, so that every kind
            # recurs (drawn at random, seed 4711 never drew partition-host of
            # eight kinds in 300 s).
            rounds = rounds or rng.sample(kinds, len(kinds))
            kind = rounds.pop()
        else:
            kind = rng.choice(kinds)
        how, point = rng.choice(ways(kind, mode, **reach))
        if how == "network":
            at = max(at, network_free)
        if at > duration_s - quiet_s:
            return events
        event = Event(
            at_s=round(at, 3),
            kind=kind,
            how=how,
            pick=rng.randrange(1 << 16),
            pause_s=round(rng.uniform(0.1, pause_max_s), 3) if kind in PAUSES else 0.0,
            point=point,
            count=rng.randint(1, MAX_BURST) if kind.endswith("-errors") else 1,
        )
        if how == "network":  # drawn only for these: other kinds' schedules stay as they were
            event = _network_event(event, rng, network_max_s)
            network_free = at + event.lasts_s + NETWORK_QUIET_S
        events.append(event)


def _network_event(event: Event, rng: random.Random, network_max_s: float) -> Event:
    """``event`` with its duration and amount drawn (a skew either way)."""
    low, high = NETWORK_AMOUNTS.get(event.kind, (0.0, 0.0))
    amount = round(rng.uniform(low, high), 3)
    if event.kind == "clock-skew" and rng.random() < 0.5:
        amount = -amount
    lasts = round(rng.uniform(1.0, network_max_s), 3)
    return msgspec.structs.replace(event, lasts_s=lasts, amount=amount)


def firings(events: list[Event]) -> Counter[str]:
    """The faults ``events`` inject, by kind: one per signal event, ``count``
    per point event."""
    out: Counter[str] = Counter()
    for event in events:
        out[event.kind] += event.count if event.how == "point" else 1
    return out


def point_specs(events: list[Event]) -> list[faults.FaultSpec]:
    """The fault specs that arm every point ``events`` release, each with a
    budget of as many firings as they release (and none other). Code points
    fire at probability 1; a store point armed with both actions splits its
    draws between them."""
    budget: dict[str, int] = {}
    for event in events:
        if event.how == "point":
            budget[event.point] = budget.get(event.point, 0) + event.count
    specs = []
    for point, times in budget.items():
        name, action = point.split(":")
        both = sum(p.split(":")[0] == name for p in budget) > 1
        prob = 0.5 if name in faults.STORE_POINTS and both else 1.0
        specs.append(faults.FaultSpec(name, action, prob, times))
    return specs


def kind_of(point: str, action: str) -> str:
    """The fault kind a firing of ``point`` with ``action`` belongs to (a
    network fault is recorded with its kind as the point, action ``network``)."""
    if action == "network":
        return point
    for kind, pairs in POINTS.items():
        if (point, action) in pairs:
            return kind
    return f"{point}:{action}"
