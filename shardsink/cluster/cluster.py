"""The Python API of a cluster: ``with Cluster(config) as c: c.run(); c.stats()``.

Starting a cluster removes what dead clusters left behind (shared-memory
segments of dead processes, run directories of dead coordinators), takes the
data dir's lock when it serves a store there (``shardsink.datadir``; the lock
then names its consensus process's address, so ``shard`` commands on the data
dir go through it), checks the shard (schema, upper) before any process
starts, starts the consensus process (unless ``config.consensus`` names a
running server) and every group, and waits until all are up. Closing shuts
every process down, reaps it, unlinks every shared-memory segment of the
cluster and lets go of the lock, whatever happened before.

Fault points armed through the environment (:mod:`shardsink.faults`) get
one budget per run: the run's fault directory is the one the environment
names, else ``faults/`` in the run directory (:func:`shardsink.faults.run_budgets`),
which every process of the cluster arms with, this one included while the
cluster runs. Its ``fired.jsonl`` goes with the run directory at close.

The calling process is the coordinator. With ``start="fork"`` (the default)
it first starts a zygote (:mod:`shardsink.process.zygote`), before it opens
any ZeroMQ context, and every builder and worker is forked from it: a 4x8
cluster starts in a fraction of a second, and the children share the
libraries' pages. ``start="spawn"`` starts each child as a fresh interpreter
instead. The consensus process always starts as a fresh interpreter, with
the server's allocator environment (:mod:`shardsink.process.consensus`).
Every child's log is kept in ``DATA_DIR/logs/STAMP-CLUSTER/`` (:attr:`Cluster.logs`;
bounded and rotated, :mod:`shardsink.process.logs`), also after the run.

Children die with the coordinator (``PR_SET_PDEATHSIG`` through the zygote);
that fires when the *thread* that started the zygote exits, so keep the
thread that called :meth:`Cluster.start` alive while the cluster runs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
import uuid
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np
import psutil

from .. import datadir, faults, protocol, workloads
from .._bounds import this_machine
from .._curve import key_dir, keys_for
from .._histograms import Distribution, Latencies
from ..config import ClusterConfig, check_machine
from ..connect import open_shard, open_shards
from ..coordinator.coordinator import STOP_S, Coordinator, consensus_call, interval_of
from ..coordinator.errors import ClusterError
from ..coordinator.groups import HostInfo
from ..coordinator.ray_groups import close_agents, place_hosts
from ..coordinator.records import IntervalRecord
from ..persist.config import ShardConfig
from ..persist.errors import ShardNotFound
from ..persist.shard import Shard
from ..persist.shards import ShardSet
from ..process import (
    ConsensusProcess,
    ConsensusStartError,
    SpawnStarter,
    Starter,
    Zygote,
    logs,
    make_run_dir,
    peak_rss,
    reset_own_peak_rss,
    sigint_ignored,
)
from ..server.config import ServeConfig
from ..shm import sweep, unlink_cluster
from ..storage.uri import redact
from .control import ControlServer, ProcessStatus, Status
from .dashboard import ControlSource, Dashboard, Plan
from .maintenance import MaintenanceWatch
from .metrics import Metrics, Supervised
from .stats import ClusterStats, ProcessInfo, Supervision
from .verify import Verification, verify_shards
from .visibility import VisibilityWatch

log = logging.getLogger(__name__)

#: :meth:`Cluster.status` gives rates and latencies over this many seconds.
STATUS_WINDOW_S = 60.0
T = TypeVar("T")

__all__ = [
    "Cluster",
    "ClusterError",
    "ClusterStats",
    "IntervalRecord",
    "ProcessInfo",
    "Supervision",
]


class Cluster:
    """A running cluster (see the module doc). Use as a context manager, or
    call :meth:`start` and :meth:`close` (idempotent).

    Constructing it refuses a shape this machine has no room for, before
    any process starts (``ValueError`` naming the flags and the limit:
    :func:`~shardsink.config.check_machine`).

    Errors of :meth:`start`: ``ValueError`` for bad input (a shard with another
    schema, an upper that is not a multiple of ``interval_ms``, a workload's
    shards whose uppers differ, a data dir
    whose lock another process holds: :class:`~shardsink.datadir.DataDirBusy`
    naming it, a second start), storage errors
    (a ``consensus`` address nobody answers, an unreachable store),
    :class:`ClusterError` if processes do not come up.
    """

    def __init__(self, config: ClusterConfig | None = None) -> None:
        config = config or ClusterConfig()
        check_machine(config, this_machine())  # before prepare makes worker 0's first interval
        self.config, self.workload, self.schemas = workloads.prepare(config)
        self.cluster_id = f"c{uuid.uuid4().hex[:12]}"
        #: the workload's shards (one, ``config.shard``, for a workload of one schema)
        self.shards: ShardSet | None = None
        self._visibility: VisibilityWatch | None = None
        self._address = ""  # the consensus address the shard was opened at
        self.consensus: ConsensusProcess | None = None
        self._maintenance = MaintenanceWatch(
            lambda: self.shard_address, list(self.schemas), config.data_path
        )
        self.zygote: Zygote | None = None
        self.coordinator: Coordinator | None = None
        self.run_dir: Path | None = None
        #: where this run's logs are kept (``DATA_DIR/logs/...``), once started
        self.logs: Path | None = None
        self._rotate: logs.Rotator | None = None
        #: where the run's fault budgets and firings are (see the module doc);
        #: ``None`` when nothing is armed
        self.fault_dir: Path | None = None
        self._fault_budgets = contextlib.ExitStack()
        self.startup_s = 0.0
        self._lock: datadir.DataDirLock | None = None
        self._verification: Verification | None = None
        self._final: ClusterStats | None = None
        self._closed = False
        self.control: ControlServer | None = None
        self.metrics: Metrics | None = None
        self.dashboard: Dashboard | None = None
        self._run_started: float | None = None
        self._appended_at: deque[tuple[float, IntervalRecord]] = deque()
        self._ps: dict[int, psutil.Process] = {}

    # --- lifecycle -----------------------------------------------------------------------

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> Cluster:
        """Check the shard, start the consensus process and the groups."""
        if self.coordinator is not None or self._closed:
            raise ValueError(f"cluster {self.cluster_id} was started already")
        started = time.monotonic()
        config = self.config
        try:
            sweep()  # segments of dead processes, of any cluster
            # first: the run's budgets cover every fault point it reaches, its store checks too
            self.run_dir = make_run_dir(
                self.cluster_id, keep_logs=datadir.create(config.data_path) / logs.LOGS
            )
            self.logs = (self.run_dir / logs.LOGS).resolve()
            self._rotate = logs.Rotator(self.logs)
            self.fault_dir = self._fault_budgets.enter_context(
                faults.run_budgets(self.run_dir / "faults")
            )
            if config.serves_data_dir:
                data_dir = datadir.create(config.data_path)
                self._lock = datadir.acquire(data_dir, datadir.COORDINATOR)
            if not config.external_server:
                self._check_store()
            starter = self._starter(self.run_dir)
            self._open_shards(self._start_consensus())
            self.config, agents = place_hosts(self.config, self.cluster_id)
            config = self.config
            args = (config, self.cluster_id, self.run_dir, self.shards, self.consensus, starter)
            try:
                self.coordinator = Coordinator(*args, agents)
            except BaseException:  # its supervisor would have closed them; it never held them
                close_agents(agents or [])
                raise
            self.coordinator.start()
            self.control = ControlServer(self.run_dir, self.status)
            self.coordinator.on_poll = self._on_poll
            if self._lock is not None:  # its lock is where `shardsink status` finds it
                self._lock.update(control=self.control.address)
            if config.metrics_port is not None:
                self.metrics = Metrics(
                    config.metrics_port, Supervised(self._supervised, self._members, self.hosts)
                )
            self.dashboard = self._open_dashboard(self.control.address)
            if config.listen:
                self._visibility = VisibilityWatch(
                    self._reopen_shard, self.shard.upper, config.interval_ms,
                    self.coordinator.counters.minted_at,
                )  # fmt: skip
        except BaseException:
            self.close()
            raise
        self.startup_s = time.monotonic() - started
        return self

    def close(self) -> None:
        """Stop every process, unlink every segment, remove the run directory.
        Idempotent; Ctrl-C is ignored while it runs (in the main thread)."""
        if self._closed:
            return
        self._closed = True
        with sigint_ignored():
            try:
                if self._visibility is not None:
                    self._visibility.close()
                if self.dashboard is not None:  # first: its samples ask the coordinator
                    self.dashboard.close()
                if self.coordinator is not None:
                    try:  # a start given up on (Ctrl-C, SIGTERM, a failure) is killed at once
                        self.coordinator.close(STOP_S if self.startup_s else 0.0)
                    finally:
                        self._final = self._stats()
            finally:
                if self.control is not None:
                    self.control.close()
                if self.metrics is not None:
                    self.metrics.close()
                unlink_cluster(self.cluster_id)
                if self.shards is not None:
                    self.shards.close()
                if self.consensus is not None:
                    self.consensus.stop()
                if self.zygote is not None:
                    self.zygote.stop()
                # before the fault dir goes with the run dir: this process's points
                # claim from their own budgets again
                self._fault_budgets.close()
                if self.run_dir is not None:
                    shutil.rmtree(self.run_dir, ignore_errors=True)
                if self.logs is not None:
                    logs.end(self.logs)
                if self._lock is not None:
                    self._lock.close()

    # --- running -------------------------------------------------------------------------

    def run(
        self,
        intervals: int | None = None,
        *,
        on_append: Callable[[IntervalRecord], None] | None = None,
    ) -> ClusterStats:
        """Append ``intervals`` intervals (default ``config.intervals``) from the
        shard's upper on, calling ``on_append`` after each; then, if
        ``config.verify``, read the shard back. Returns :meth:`stats`.

        A stop request on the control socket raises
        :class:`~shardsink.cluster.control.StopRequested` out of it, as Ctrl-C
        raises ``KeyboardInterrupt``; the shard holds whole intervals either way."""
        coordinator = self._running()
        n = self.config.intervals if intervals is None else intervals
        if n < 0:
            raise ValueError(f"intervals must be >= 0, got {n}")

        def appended(record: IntervalRecord) -> None:
            now = time.monotonic()
            self._appended_at.append((now, record))
            self._forget_appended_before(now - STATUS_WINDOW_S)
            if self.metrics is not None:
                self.metrics.observe(record)
            if on_append is not None:
                on_append(record)

        self._run_started = self._run_started or time.monotonic()
        coordinator.run(n, appended)
        if self.config.verify:
            self.verify()
        return self.stats()

    def verify(self) -> Verification:
        """Read the shards back and check them against their batches'
        digests and, if the workload has one, its expected collection at
        their upper, and its ``check`` (also recorded in :meth:`stats`);
        through restarts of the consensus process."""
        coordinator, shards = self._running(), self.shards
        assert shards is not None
        # The read-back's memory is measured apart from the coordinator's run.
        coordinator.supervisor.sample_rss(force=True)
        isolated = reset_own_peak_rss()
        self._verification = self._through_restarts(
            lambda: verify_shards(shards.shards, self.workload, self.config.interval_ms),
            "reading the shards back",
        )
        if isolated:
            peak = peak_rss(os.getpid()) or 0
            peaks = coordinator.supervisor.counters.peak_rss
            peaks["read-back"] = max(peaks.get("read-back", 0), peak)
            reset_own_peak_rss()
        return self._verification

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
        appends, supervision, config = totals.appends, self.supervision(), self.config
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
    def holds_data_dir(self) -> bool:
        """Whether the cluster holds its data dir's lock, which names its
        control socket: then ``shardsink status|stop --data-dir`` find it."""
        return self._lock is not None

    @property
    def shard_address(self) -> str:
        """Where the cluster's consensus answers: its process's address, or
        ``config.consensus`` for a running server."""
        if self.consensus is not None and self.consensus.address is not None:
            return self.consensus.address
        return redact(self.config.consensus_uri)

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
        config = self.config
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

    # --- helpers ---------------------------------------------------------------------------

    def _open_dashboard(self, control: str) -> Dashboard | None:
        """The dashboard ``config.dashboard`` asks for, of the control socket
        at ``control``, showing progress toward ``config.intervals``."""
        config = self.config
        if config.dashboard is None:
            return None
        plan = Plan(intervals=config.intervals, rows_per_interval=config.rows_per_interval)
        title = f"shardsink up: cluster {self.cluster_id}"
        return Dashboard(ControlSource(address=control), config.dashboard, title=title, plan=plan)

    def _on_poll(self) -> None:
        assert self.control is not None and self._rotate is not None
        self.control.poll()
        self._rotate()

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

    def _start_consensus(self) -> str:
        """Start the consensus process (none for a running server) and give
        the address where it answers."""
        config = self.config
        if config.external_server:
            return config.consensus_uri
        assert self.run_dir is not None
        serving = ServeConfig(
            bind=config.consensus_bind or f"ipc://{self.run_dir / 'consensus'}",
            keys=str(key_dir(config.data_path)),
            retain=config.retain,
            writer_lease_ms=config.writer_lease_ms,
        )
        self.consensus = ConsensusProcess(
            config.consensus_uri,
            config.blob_uri,
            serving,
            # a fresh interpreter, never the zygote: only that takes the
            # server's allocator environment (see ConsensusProcess)
            run_dir=self.run_dir,
            timeout_s=config.start_timeout_s,
        )
        try:
            address = self.consensus.start().address
        except ConsensusStartError as exc:
            raise ClusterError(str(exc)) from None
        assert address is not None
        if self._lock is not None:
            self._lock.update(address=address)
        return address

    @property
    def shard(self) -> Shard | None:
        """The cluster's handle on its shard: the first of the workload's
        (they move together), once started."""
        return None if self.shards is None else self.shards.shard(next(iter(self.schemas)))

    def _open_shards(self, address: str) -> None:
        """Open the workload's shards at ``address`` and check their upper,
        through restarts of the consensus process."""
        config = self.config
        self._address = address
        self.shards = shards = self._through_restarts(
            lambda: open_shards(
                self.schemas,
                blob=config.blob_uri,
                consensus=address,
                config=self._shard_config(retry_for_s=0.0),
                keys=keys_for(address, config.data_path),
            ),
            "opening the shards",
        )
        upper = self._through_restarts(shards.common_upper, "reading the upper")
        interval_of(upper, config.interval_ms, ", ".join(shards.shards))

    def _reopen_shard(self) -> Shard:
        """A handle of the cluster's (first) shard of its own, at its
        consensus address."""
        config = self.config
        name, schema = next(iter(self.schemas.items()))
        return open_shard(
            name,
            blob=config.blob_uri,
            consensus=self._address,
            schema=schema,
            config=self._shard_config(retry_for_s=0.0),
            keys=keys_for(self._address, config.data_path),
        )

    def _through_restarts(self, call: Callable[[], T], what: str) -> T:
        """``call()`` through restarts of the cluster's consensus process
        (:func:`~shardsink.coordinator.coordinator.consensus_call`)."""
        return consensus_call(self.config, call, what, consensus=self.consensus)

    def _starter(self, run_dir: Path) -> Starter:
        """How children start (``config.start``); the zygote is started here,
        before this process opens any ZeroMQ context."""
        if self.config.start == "spawn":
            return SpawnStarter()
        self.zygote = Zygote(protocol.CHILD_ROLES, run_dir, timeout_s=self.config.start_timeout_s)
        return self.zygote.start()

    def _shard_config(self, retry_for_s: float) -> ShardConfig:
        return ShardConfig(
            blob_target_bytes=self.config.blob_target_bytes,
            server_timeout_s=self.config.consensus_timeout_s,
            server_retry_for_s=retry_for_s,
        )

    def _check_store(self) -> None:
        """Schema and upper of each existing shard, read straight from the
        store before any process starts (``ValueError`` naming the problem)."""
        config = self.config
        for name, schema in self.schemas.items():
            try:
                with open_shard(
                    name,
                    blob=config.blob_uri,
                    consensus=config.consensus_uri,
                    schema=schema,
                    config=self._shard_config(retry_for_s=config.consensus_timeout_s),
                    create=False,
                ) as shard:
                    interval_of(shard.upper, config.interval_ms, name)
            except ShardNotFound:
                pass


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
