"""What a cluster shows of itself: its records, status, figures, processes
and hosts (:class:`ClusterView`), read off the processes and stores that
:class:`~shardsink.cluster.cluster.Cluster` starts and stops.

The view starts and stops nothing, and asks the consensus server nothing
but maintenance failures (:class:`~.maintenance.MaintenanceWatch`): a
``status`` request comes from the coordinator's loop, where a request to
consensus could nest in one in flight. As dask's ``Cluster`` (status, logs,
dashboard) is apart from its ``SpecCluster`` (start, close).
"""

from __future__ import annotations

import os
import time
from collections import deque

import numpy as np
import psutil

from .._histograms import Distribution, Latencies
from ..config import ClusterConfig
from ..coordinator import Coordinator, HostInfo, IntervalRecord
from ..persist import Shard, ShardSet
from ..process import ConsensusProcess
from ..storage import redact
from .control import ControlServer, ProcessStatus, Status
from .dashboard import Dashboard
from .maintenance import MaintenanceWatch
from .metrics import Metrics
from .stats import ClusterStats, ProcessInfo, Supervision
from .verify import Verification
from .visibility import VisibilityWatch

#: :meth:`ClusterView.status` gives rates and latencies over this many seconds.
STATUS_WINDOW_S = 60.0


class ClusterView:
    """A cluster's observable side. Its attributes are set by the cluster's
    start (``None`` until then) and kept after close; its methods raise
    ``ValueError`` before start, and (but for :meth:`stats`, :meth:`records`,
    :meth:`supervision` and :meth:`restart_times`) after close."""

    def __init__(self, requested: ClusterConfig, schemas: dict, cluster_id: str) -> None:
        #: the config as asked for (its workload prepared)
        self.requested = requested
        #: the config as placed: on Ray hosts, ``groups`` on each host and a TCP
        #: coordinator socket; ``None`` until started
        self.placed: ClusterConfig | None = None
        self.schemas = schemas
        self.cluster_id = cluster_id
        #: the workload's shards (one, ``requested.shard``, for a workload of one schema)
        self.shards: ShardSet | None = None
        self.consensus: ConsensusProcess | None = None
        self.coordinator: Coordinator | None = None
        self.control: ControlServer | None = None
        self.metrics: Metrics | None = None
        self.dashboard: Dashboard | None = None
        self.startup_s = 0.0
        self._visibility: VisibilityWatch | None = None
        self._maintenance = MaintenanceWatch(
            lambda: self.shard_address, list(schemas), requested.data_path
        )
        self._verification: Verification | None = None
        self._final: ClusterStats | None = None
        self._closed = False
        self._run_started: float | None = None
        self._appended_at: deque[tuple[float, IntervalRecord]] = deque()
        self._ps: dict[int, psutil.Process] = {}

    def _observe(self, record: IntervalRecord) -> None:
        """An interval appended: into :meth:`status`'s window and the metrics."""
        now = time.monotonic()
        self._appended_at.append((now, record))
        self._forget_appended_before(now - STATUS_WINDOW_S)
        if self.metrics is not None:
            self.metrics.observe(record)

    @property
    def records(self) -> list[IntervalRecord]:
        """The intervals appended so far, in order, up to the last
        :data:`~shardsink.coordinator.records.RECORDS_KEPT` (also after
        :meth:`close`)."""
        return list(self.coordinator.counters.records) if self.coordinator is not None else []

    def restart_times(self, since: int = 0) -> list[float]:
        """The durations of group restarts ``since`` onwards (the ``since``-th
        restart first), each from the kill to every member ready again."""
        return self._running_or_closing().supervisor.counters.restart_s[since:]

    def supervision(self) -> Supervision:
        """What supervision has done so far (cheap: no figures are computed)."""
        coordinator = self._running_or_closing()
        return Supervision(
            restarts=coordinator.supervisor.counters.restarts,
            consensus_restarts=self.consensus.restarts if self.consensus is not None else 0,
            abandoned_attempts=coordinator.counters.abandoned,
        )

    def processes(self) -> list[ProcessInfo]:
        """The coordinator (this process) and every live child, by kind."""
        out = [ProcessInfo("coordinator", "coordinator", os.getpid(), os.getpgid(0))]
        if self.coordinator is not None:
            for child in self.coordinator.supervisor.children():
                if child.returncode is None:
                    out.append(ProcessInfo(child.kind, child.name, child.pid, child.pgid))
        return out

    def status(self) -> Status:
        """What ``shardsink status`` shows (see :class:`~shardsink.cluster.control.Status`)."""
        coordinator = self._running()
        assert self.shard is not None
        now = time.monotonic()
        self._forget_appended_before(now - STATUS_WINDOW_S)
        recent = [r for _, r in self._appended_at]
        latencies = [r.latency_ms for r in recent] or [0.0]
        span = min(STATUS_WINDOW_S, now - (self._run_started or now))
        totals = coordinator.counters.totals
        last = coordinator.counters.records[-1] if totals.appends else None
        appends, supervision, config = totals.appends, self.supervision(), self._placed()
        return Status(
            cluster_id=self.cluster_id,
            coordinator_pid=os.getpid(),
            data_dir=config.data_path,
            shard=", ".join(self.schemas),
            groups=config.groups,
            workers=config.workers,
            mode=config.mode,
            coalesce=config.coalesce,
            workload=config.workload,
            pace=config.pace,
            # from what it appended: a request to consensus here could nest in one in flight
            upper=max(
                self.shard.state(refresh=False).upper,
                (last.interval + 1) * config.interval_ms if last is not None else 0,
            ),
            appends=appends,
            window_s=STATUS_WINDOW_S,
            appends_in_window=len(recent),
            intervals_per_s=len(recent) / span if span > 0 else 0.0,
            append_latency_ms_p50=float(np.percentile(latencies, 50)),
            append_latency_ms_p99=float(np.percentile(latencies, 99)),
            backlog=last.backlog if last is not None else 0,
            data_parts=totals.data_parts,
            blob_puts=totals.blob_puts,
            data_parts_per_append=_per(totals.data_parts, appends),
            blob_puts_per_append=_per(totals.blob_puts, appends),
            diff_bytes_per_append=_per(totals.diff_bytes, appends),
            restarts=supervision.restarts,
            consensus_restarts=supervision.consensus_restarts,
            abandoned_attempts=supervision.abandoned_attempts,
            consensus=self.shard_address,
            maintenance_failures=self._maintenance.failures(),
            metrics=self.metrics.url if self.metrics is not None else None,
            dashboard=self.dashboard.url if self.dashboard is not None else None,
            processes=[self._process_status(*p) for p in self._members()],
            hosts=self.hosts(),
        )

    @property
    def shard_address(self) -> str:
        """Where the cluster's consensus answers: its process's address, or
        ``consensus`` of the config for a running server."""
        if self.consensus is not None and self.consensus.address is not None:
            return self.consensus.address
        return redact(self.requested.consensus_uri)

    def _supervised(self) -> tuple[int, int, int]:
        """Group restarts, consensus restarts, abandoned attempts (for metrics)."""
        s = self.supervision()
        return s.restarts, s.consensus_restarts, s.abandoned_attempts

    def hosts(self) -> list[HostInfo]:
        """Every host placed (none before the coordinator is built)."""
        return self.coordinator.supervisor.hosts() if self.coordinator is not None else []

    def _members(self) -> list[tuple[str, str, int, bool]]:
        """(kind, name, pid, alive) of the coordinator and every child."""
        out = [("coordinator", "coordinator", os.getpid(), True)]
        if self.coordinator is not None:
            for child in self.coordinator.supervisor.children():
                out.append((child.kind, child.name, child.pid, child.returncode is None))
        return out

    def _process_status(self, kind: str, name: str, pid: int, alive: bool) -> ProcessStatus:
        rss, cpu = 0, 0.0
        if alive:
            try:
                # kept per pid: cpu_percent measures since the previous call on the object
                proc = self._ps.setdefault(pid, psutil.Process(pid))
                rss, cpu = proc.memory_info().rss, proc.cpu_percent(None)
            except psutil.Error:  # exited since the supervisor last looked
                alive = False
        return ProcessStatus(
            kind=kind, name=name, pid=pid, alive=alive, rss_bytes=rss, cpu_percent=cpu
        )

    def stats(self) -> ClusterStats:
        """The figures of every run so far (see :class:`ClusterStats`); after
        :meth:`close`, those it had when it closed (peak memory included)."""
        if self._closed:
            if self._final is None:
                raise ValueError(f"cluster {self.cluster_id} never started")
            return self._final
        return self._stats()

    def _stats(self) -> ClusterStats:
        coordinator = self._running_or_closing()
        assert self.shards is not None
        counters = coordinator.counters
        supervision = coordinator.supervisor.counters
        totals = counters.totals
        appends = totals.appends
        config = self._placed()
        latency = counters.latencies.distribution()
        rows, wall, v = totals.rows, counters.wall_s, self._verification
        return ClusterStats(
            mode=config.mode,
            coalesce=config.coalesce,
            groups=config.groups,
            workers=config.workers,
            workload=config.workload,
            workload_args=dict(config.workload_args),
            rows_per_interval=config.rows_per_interval,
            snapshot_rows=config.snapshot_rows,
            shared_max_bytes=config.shared_max_bytes,
            intervals=appends,
            upper=self.shard.state(refresh=False).upper,
            appends=appends,
            cas_per_append=_per(totals.cas_calls, appends),
            blob_puts=totals.blob_puts,
            blob_put_bytes=totals.blob_put_bytes,
            data_parts_per_append=_per(totals.data_parts, appends),
            inline_parts_per_append=_per(totals.inline_parts, appends),
            inline_bytes_per_append=_per(totals.inline_bytes, appends),
            diff_bytes_per_append=_per(totals.diff_bytes, appends),
            own_batches_per_append=_per(totals.own_batches, appends),
            shared_batches_per_append=_per(totals.shared_batches, appends),
            parts_per_append_by_host={h: _per(n, appends) for h, n in totals.parts_by_host.items()},
            parts_per_append_by_shard={
                s: _per(n, appends) for s, n in totals.parts_by_shard.items()
            },
            shards=list(self.schemas),
            rows=rows,
            wall_s=wall,
            startup_s=self.startup_s,
            start=config.start,
            rows_per_s=rows / wall if wall > 0 else 0.0,
            append_latency_ms_p50=latency.p50,
            append_latency_ms_p99=latency.p99,
            append_latency_ms=latency,
            append_latency_hdr=counters.latencies.encoded(),
            visible_latency_ms=(
                self._visibility.snapshot().distribution()
                if self._visibility is not None
                else Distribution()
            ),
            series_window_s=counters.series.window_s,
            series=counters.series.windows(),
            restart_ms=_restarts(supervision.restart_s),
            **_open_loop(config.rate, appends / wall if wall > 0 else 0.0, counters.max_backlog),
            restarts=supervision.restarts,
            restart_s=list(supervision.restart_s),
            consensus_restarts=self.consensus.restarts if self.consensus is not None else 0,
            abandoned_attempts=counters.abandoned,
            rollup_puts=sum(shard.stats().rollup_puts for shard in self.shards.shards.values()),
            peak_rss=dict(supervision.peak_rss),
            maintenance_failures=self._maintenance.failures(fresh=True),
            verified=None if v is None else v.ok,
            verify_detail="" if v is None else v.detail or v.how(),
        )

    @property
    def shard(self) -> Shard | None:
        """The cluster's handle on its shard: the first of the workload's
        (they move together), once started."""
        return None if self.shards is None else self.shards.shard(next(iter(self.schemas)))

    def _forget_appended_before(self, moment: float) -> None:
        """Keep :meth:`status`'s window only: a run that nobody asks for its
        status must not keep a record per interval."""
        while self._appended_at and self._appended_at[0][0] < moment:
            self._appended_at.popleft()

    def _running(self) -> Coordinator:
        if self._closed:
            raise ValueError(f"cluster {self.cluster_id} is closed")
        return self._running_or_closing()

    def _running_or_closing(self) -> Coordinator:
        if self.coordinator is None:
            raise ValueError(f"cluster {self.cluster_id} is not started")
        return self.coordinator

    def _placed(self) -> ClusterConfig:
        if self.placed is None:
            raise ValueError(f"cluster {self.cluster_id} is not started")
        return self.placed


def _per(total: float, appends: int) -> float:
    """``total`` per append (0 before the first)."""
    return total / appends if appends else 0.0


def _restarts(restart_s: list[float]) -> Distribution:
    latencies = Latencies()
    for seconds in restart_s:
        latencies.record(seconds * 1000)
    return latencies.distribution()


def _open_loop(rate: float | None, achieved: float, max_backlog: int) -> dict:
    """The open-loop figures of :class:`ClusterStats`."""
    if rate is None:
        return {"achieved_rate": achieved}
    fell_behind = achieved < 0.95 * rate or max_backlog >= 2
    return {
        "target_rate": rate,
        "achieved_rate": achieved,
        "max_backlog": max_backlog,
        "fell_behind": fell_behind,
    }
