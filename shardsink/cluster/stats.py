"""What a cluster reports about itself: its processes (:class:`ProcessInfo`),
its supervision so far (:class:`Supervision`) and the figures of its runs
(:class:`ClusterStats`, the summary ``shardsink up`` prints and ``shardsink
bench cluster`` keeps). Plain values: :class:`~shardsink.cluster.cluster.Cluster`
fills them in; nothing here starts or reads anything.
"""

from __future__ import annotations

from typing import Any

import msgspec

from .._histograms import Distribution, Window
from .maintenance import MaintenanceFailures


class ProcessInfo(msgspec.Struct, frozen=True):
    """A process of the cluster: ``kind`` is coordinator, consensus, builder or worker."""

    kind: str
    name: str
    pid: int
    pgid: int


class Supervision(msgspec.Struct, frozen=True, kw_only=True):
    """Group restarts, consensus-process restarts and abandoned attempts so far."""

    restarts: int
    consensus_restarts: int
    abandoned_attempts: int


class ClusterStats(msgspec.Struct, frozen=True, kw_only=True):
    """What a cluster's runs did (docs/architecture.md section 10, plus supervision).

    Per-append figures average over the intervals appended; the append
    latency percentiles are over the last
    :data:`~shardsink.coordinator.records.RECORDS_KEPT`. ``blob_puts`` and
    ``blob_put_bytes`` count data parts (rollups apart, in ``rollup_puts``).
    ``verified`` is ``None`` until the shard was read back.
    ``parts_per_append_by_host``: parts (data and inline) appended per
    append by each host's builders, by host index;
    ``parts_per_append_by_shard``: with a workload of several shards, the
    parts (data and inline) appended to each per append, by name (the
    per-append figures above are their sums; ``cas_per_append`` and
    ``diff_bytes_per_append`` count no transaction's work, which the
    consensus server does alone). ``shards``: the shards the workload
    writes. ``peak_rss`` maps
    a process kind (coordinator, consensus, builder, worker) to the largest
    peak resident bytes of any process of it; ``read-back`` is the
    coordinator's peak while it read the shard back to verify it, measured
    apart from its run.
    ``startup_s`` is the time :meth:`Cluster.start
    <shardsink.cluster.cluster.Cluster.start>` took (store checks, consensus
    process and every group ready), ``start`` how children started (fork or
    spawn). ``restarts`` counts group restarts and ``restart_s``
    gives, per restart, the time from the kill to every member of the group
    ready again; ``consensus_restarts`` counts restarts of the consensus
    process, ``abandoned_attempts`` attempts not appended.
    ``maintenance_failures``: the runs of the shard's maintenance (in the
    consensus server) that failed, by kind, and the last error.
    ``append_latency_ms`` is the distribution of every append's latency
    (HdrHistogram: count, p50 ... p99.99, max; ``append_latency_ms_p50`` and
    ``_p99`` are two of its figures), ``restart_ms`` of the group restarts'.
    With an open-loop ``rate`` (intervals a second): ``target_rate`` it,
    ``achieved_rate`` the appends a second of the run, ``max_backlog`` the
    most intervals that were due and not yet appended at an append, and
    ``fell_behind`` whether the run did not keep its schedule (an achieved
    rate under 95% of the target, or a backlog of two intervals or more);
    ``None``, 0 and false without one. ``series``: per window of time
    (``series_window_s``: 1 s, wider for long runs) the appends, their rate,
    the largest backlog and the p99 latency. ``visible_latency_ms``: with
    ``listen``, each interval from its first mint to a reader seeing it.
    """

    mode: str
    coalesce: str
    groups: int
    workers: int
    workload: str
    #: the ``[workload]`` table the workload was made with
    workload_args: dict[str, Any] = {}
    rows_per_interval: int
    snapshot_rows: int
    shared_max_bytes: int | str
    intervals: int
    upper: int
    appends: int
    cas_per_append: float
    blob_puts: int
    blob_put_bytes: int
    data_parts_per_append: float
    inline_parts_per_append: float
    inline_bytes_per_append: float
    diff_bytes_per_append: float
    own_batches_per_append: float
    shared_batches_per_append: float
    rows: int
    wall_s: float
    startup_s: float
    start: str
    rows_per_s: float
    append_latency_ms_p50: float
    append_latency_ms_p99: float
    restarts: int
    restart_s: list[float]
    consensus_restarts: int
    abandoned_attempts: int
    rollup_puts: int
    peak_rss: dict[str, int]
    verified: bool | None
    verify_detail: str = ""
    maintenance_failures: MaintenanceFailures = MaintenanceFailures(known=False)
    append_latency_ms: Distribution = Distribution()
    #: the same, the histogram itself (HdrHistogram's compressed base64, us)
    append_latency_hdr: str = ""
    restart_ms: Distribution = Distribution()
    target_rate: float | None = None
    achieved_rate: float = 0.0
    max_backlog: int = 0
    fell_behind: bool = False
    visible_latency_ms: Distribution = Distribution()
    series_window_s: float = 1.0
    series: list[Window] = []
    parts_per_append_by_host: dict[int, float] = {}
    parts_per_append_by_shard: dict[str, float] = {}
    shards: list[str] = []
