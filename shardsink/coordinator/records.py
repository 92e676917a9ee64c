"""What a coordinator counts: each appended interval's
:class:`IntervalRecord`, running :class:`Totals`, and the :class:`Counters`
of its runs. Plain values, filled in by
:class:`~shardsink.coordinator.coordinator.Coordinator`."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import msgspec

from .._histograms import Latencies, Series


class IntervalRecord(msgspec.Struct, frozen=True):
    """One appended interval: what went in and what it cost. ``segment_parts``
    counts the parts of shared batches that reached their builder through a
    shared-memory segment rather than inline in a ZeroMQ message;
    ``shared_max_bytes`` is the threshold the interval was minted with;
    ``parts_by_host`` the parts appended by host index (one host on this
    machine alone); with a workload of several shards, ``parts_by_shard``
    the parts (data and inline) appended to each, by name (empty with one:
    all its parts are ``data_parts + inline_parts``)."""

    interval: int
    attempt: int
    rows: int
    own_batches: int
    shared_batches: dict[int, int]
    data_parts: int
    inline_parts: int
    inline_bytes: int
    blob_puts: int
    blob_put_bytes: int
    diff_bytes: int
    cas_calls: int
    latency_ms: float
    segment_parts: int
    shared_max_bytes: int
    parts_by_host: dict[int, int] = {}
    parts_by_shard: dict[str, int] = {}
    #: intervals due by the schedule (``rate``) and not appended when this
    #: one was: 0 when the run keeps up
    backlog: int = 0


#: Intervals whose :class:`IntervalRecord` a coordinator keeps: a window for
#: per-interval figures and latency percentiles. Totals are running sums, so a
#: cluster that runs for days holds this many records, not one per interval
#: (at ~0.7 KB a record, 20,000 intervals grew the coordinator by 14 MiB).
RECORDS_KEPT = 4096


@dataclass
class Totals:
    """Running sums over every appended interval's :class:`IntervalRecord`."""

    appends: int = 0
    rows: int = 0
    cas_calls: int = 0
    blob_puts: int = 0
    blob_put_bytes: int = 0
    data_parts: int = 0
    inline_parts: int = 0
    inline_bytes: int = 0
    diff_bytes: int = 0
    own_batches: int = 0
    shared_batches: int = 0
    parts_by_host: dict[int, int] = field(default_factory=dict)
    parts_by_shard: dict[str, int] = field(default_factory=dict)

    def add(self, record: IntervalRecord) -> None:
        self.appends += 1
        self.rows += record.rows
        self.cas_calls += record.cas_calls
        self.blob_puts += record.blob_puts
        self.blob_put_bytes += record.blob_put_bytes
        self.data_parts += record.data_parts
        self.inline_parts += record.inline_parts
        self.inline_bytes += record.inline_bytes
        self.diff_bytes += record.diff_bytes
        self.own_batches += record.own_batches
        self.shared_batches += sum(record.shared_batches.values())
        for host, parts in record.parts_by_host.items():
            self.parts_by_host[host] = self.parts_by_host.get(host, 0) + parts
        for shard, parts in record.parts_by_shard.items():
            self.parts_by_shard[shard] = self.parts_by_shard.get(shard, 0) + parts


@dataclass
class Counters:
    """What the operators counted during their runs (supervision counts its
    own: :class:`~shardsink.coordinator.supervisor.SupervisionCounters`):
    ``totals`` over every append, ``records`` of the last :data:`RECORDS_KEPT`."""

    records: deque[IntervalRecord] = field(default_factory=lambda: deque(maxlen=RECORDS_KEPT))
    totals: Totals = field(default_factory=Totals)
    abandoned: int = 0
    #: Intervals another writer appended first (see the module doc).
    skipped: int = 0
    #: Writers registered anew after the coordinator's expired (see the module doc).
    writers_renewed: int = 0
    wall_s: float = 0.0
    #: every append's latency, not only the records kept
    latencies: Latencies = field(default_factory=Latencies)
    max_backlog: int = 0
    #: the figures per window of time since the first run started (``started``)
    series: Series = field(default_factory=Series)
    started: float | None = None
    #: interval -> when its first attempt was minted, for an end-to-end
    #: timer to take (``ClusterConfig.listen``; nothing is kept without one)
    minted_at: dict[int, float] = field(default_factory=dict)

    def add(self, record: IntervalRecord) -> None:
        self.records.append(record)
        self.totals.add(record)
        self.latencies.record(record.latency_ms)
        self.max_backlog = max(self.max_backlog, record.backlog)
        now = time.monotonic()
        self.series.add(now - (self.started or now), record.latency_ms, record.backlog)
