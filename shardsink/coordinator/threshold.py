"""The sharing threshold of each mint: fixed, or tuned from measured builder lag.

A worker whose staged updates for an interval take more than the threshold
writes its own batch, in parallel with the others; a smaller one hands them
to its group's builder, which writes one batch for the group. Sharing saves
parts, blob PUTs and consensus bytes, but the builder writes the group's
shared data alone, after its last worker finished: past some size that lag
costs more than the workers' own writes would have.

``auto`` measures both sides on every appended interval (:func:`observe`):
the *builder lag* (from the builder taking a group's last contribution to its
handoff of the batch: its work on the shared data it still held) and the
workers' *own write time* (the slowest own write of the interval: what the
interval waits for when they write apart; on a busy machine their writes
share its cores, so each takes about as long as all of them). The rule
(:meth:`Auto.after`), pure and without I/O:

1. A lag above :data:`LAG_FLOOR_S` (below it a lag is noise in an append's
   fixed cost) for a shared write of size ``s`` not yet found fine is a
   *probe*: the threshold drops to ``s / 2``, so the next interval measures
   the same writes written apart.
2. The probe's answer: if the lag was more than twice the own write time
   now measured, the builder is the bottleneck: the threshold stays below
   ``s``, and ``s`` becomes the *ceiling* it never climbs back to. Otherwise
   writing apart gained too little for the parts it costs: the threshold
   goes back, and ``s`` is *fine* (not probed again unless the lag doubles).
3. Own writes that all took less than half the floor gain nothing from
   their parallelism: the threshold doubles (to at most half the ceiling),
   so that they coalesce.

It starts at the fixed default (1 MiB) and stays within [:data:`MIN_BYTES`,
:data:`MAX_BYTES`]. A drop is decided in two intervals (probe, answer) and
a climb doubles once an interval; neither comes back to a size it settled,
so the threshold settles within a few intervals.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import msgspec

from ..config import AUTO
from ..protocol import Report

#: A builder lag below this never lowers the threshold (the p50 append
#: latency of a 1x8 cluster here is 10-40 ms: a shorter lag is noise in it).
LAG_FLOOR_S = 0.025
MIN_BYTES = 16 << 10
MAX_BYTES = 256 << 20
START_BYTES = 1 << 20


class Observation(msgspec.Struct, frozen=True, kw_only=True):
    """What one appended interval measured (see :func:`observe`).

    ``lag_s``: the longest builder lag of a group (0 if nothing was shared);
    ``shared_bytes``: the largest staged bytes a worker shared; ``own_s``: the
    slowest write of a worker's own batch (0 if none)."""

    lag_s: float = 0.0
    shared_bytes: int = 0
    own_s: float = 0.0


class Threshold(Protocol):
    """The sharing threshold of the next mint.

    Invariant: ``bytes`` is at least 0; :meth:`after` never raises and
    returns the threshold for the interval after the one observed.
    """

    @property
    def bytes(self) -> int: ...

    def after(self, observation: Observation) -> Threshold: ...


class Fixed(msgspec.Struct, frozen=True):
    """A threshold set by configuration: observations do not move it."""

    bytes: int

    def after(self, observation: Observation) -> Fixed:
        return self


class Probe(msgspec.Struct, frozen=True):
    """A drop awaiting its answer: shared writes of ``size`` bytes lagged
    ``lag_s``; the threshold was ``before``."""

    size: int
    lag_s: float
    before: int


class Auto(msgspec.Struct, frozen=True, kw_only=True):
    """The self-tuning threshold (see the module doc). ``ceiling``: the
    smallest shared size found slower than writing apart (0: none);
    ``fine``: the largest shared size found worth its lag, with that lag
    (``fine_lag_s``); ``probe``: a drop awaiting its answer."""

    bytes: int = START_BYTES
    ceiling: int = 0
    fine: int = 0
    fine_lag_s: float = 0.0
    probe: Probe | None = None

    def after(self, observation: Observation) -> Auto:
        if self.probe is not None:
            return self._answer(self.probe, observation)
        lag, size = observation.lag_s, observation.shared_bytes
        if size and lag > LAG_FLOOR_S and (size > self.fine or lag > 2 * self.fine_lag_s):
            dropped = max(MIN_BYTES, min(self.bytes, size // 2))
            return msgspec.structs.replace(self, bytes=dropped, probe=Probe(size, lag, self.bytes))
        if observation.own_s and observation.own_s < LAG_FLOOR_S / 2:
            cap = self.ceiling // 2 if self.ceiling else MAX_BYTES
            return msgspec.structs.replace(self, bytes=max(self.bytes, min(cap, 2 * self.bytes)))
        return self

    def _answer(self, probe: Probe, observation: Observation) -> Auto:
        if not observation.own_s:  # nothing was written apart: nothing to compare
            return msgspec.structs.replace(self, probe=None)
        if probe.lag_s > 2 * observation.own_s:
            ceiling = min(self.ceiling or MAX_BYTES, probe.size)
            return msgspec.structs.replace(self, ceiling=ceiling, probe=None)
        return msgspec.structs.replace(
            self, bytes=probe.before, fine=probe.size, fine_lag_s=probe.lag_s, probe=None
        )


def of(setting: int | str) -> Threshold:
    """The threshold a cluster configured with ``shared_max_bytes = setting`` starts with."""
    return Auto() if setting == AUTO else Fixed(int(setting))


def observe(reports: Iterable[Report]) -> Observation:
    """The :class:`Observation` of an appended interval's reports: lags from
    the shared batches last finishers received, own write times from the
    workers that wrote their own batch, shared sizes from those that shared."""
    reports = list(reports)
    return Observation(
        lag_s=max((r.received.lag_s for r in reports if r.received is not None), default=0.0),
        shared_bytes=max((r.staged_bytes for r in reports if r.shared is not None), default=0),
        own_s=max((r.write_s for r in reports if r.own is not None), default=0.0),
    )
