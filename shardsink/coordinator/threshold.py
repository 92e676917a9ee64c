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
workers' *own write time* (how long writing their own batches took). The
rule (:meth:`Auto.after`), pure and without I/O:

1. The builder is the bottleneck when the longest lag exceeds both
   :data:`LAG_FLOOR_S` and twice the workers' own write time (the latest
   measured; 0 before any): the threshold drops to half the largest write that
   was shared, and that write's size becomes the *ceiling*. Below the floor a
   lag never matters: it is under the fixed cost of an append.
2. Otherwise, when workers wrote their own batches and the slowest took less
   than half the floor (their parallelism bought nothing), the threshold
   doubles, to at most half the ceiling, so that those writes coalesce.
3. Otherwise it stays.

It starts at the fixed default (1 MiB) and stays within [:data:`MIN_BYTES`,
:data:`MAX_BYTES`]. Each step halves or doubles it, and it never climbs back
to a size found too slow, so it settles within a few intervals: a drop
settles at once, a climb after at most one probe past the good size.
"""

from __future__ import annotations

import statistics
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
    ``shared_bytes``: the largest staged bytes a worker shared; ``own_s``:
    the median time a worker took to write its own batch and ``own_max_s`` the
    longest (both 0 if none did)."""

    lag_s: float = 0.0
    shared_bytes: int = 0
    own_s: float = 0.0
    own_max_s: float = 0.0


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


class Auto(msgspec.Struct, frozen=True, kw_only=True):
    """The self-tuning threshold (see the module doc). ``ceiling``: the
    smallest shared write found slower than writing apart (0: none yet);
    ``own_s``: the latest median own write time (0: none measured)."""

    bytes: int = START_BYTES
    ceiling: int = 0
    own_s: float = 0.0

    def after(self, observation: Observation) -> Auto:
        own_s = observation.own_s or self.own_s
        if observation.shared_bytes and observation.lag_s > max(LAG_FLOOR_S, 2 * own_s):
            ceiling = min(self.ceiling or MAX_BYTES, observation.shared_bytes)
            lowered = max(MIN_BYTES, min(self.bytes, observation.shared_bytes // 2))
            return Auto(bytes=lowered, ceiling=ceiling, own_s=own_s)
        cap = self.ceiling // 2 if self.ceiling else MAX_BYTES
        if observation.own_max_s and observation.own_max_s < LAG_FLOOR_S / 2:
            raised = max(self.bytes, min(cap, 2 * self.bytes))
            return Auto(bytes=raised, ceiling=self.ceiling, own_s=own_s)
        return Auto(bytes=self.bytes, ceiling=self.ceiling, own_s=own_s)


def of(setting: int | str) -> Threshold:
    """The threshold a cluster configured with ``shared_max_bytes = setting`` starts with."""
    return Auto() if setting == AUTO else Fixed(int(setting))


def observe(reports: Iterable[Report]) -> Observation:
    """The :class:`Observation` of an appended interval's reports: lags from
    the shared batches last finishers received, own write times from the
    workers that wrote their own batch, shared sizes from those that shared."""
    reports = list(reports)
    lags = [r.received.lag_s for r in reports if r.received is not None]
    own = [r.write_s for r in reports if r.own is not None]
    shared = [r.staged_bytes for r in reports if r.shared is not None]
    return Observation(
        lag_s=max(lags, default=0.0),
        shared_bytes=max(shared, default=0),
        own_s=statistics.median(own) if own else 0.0,
        own_max_s=max(own, default=0.0),
    )
