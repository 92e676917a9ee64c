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
import os
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from .. import datadir, faults, protocol, workloads
from .._bounds import this_machine
from .._curve import key_dir, keys_for
from ..config import ClusterConfig, check_machine
from ..connect import open_shard, open_shards
from ..coordinator import (
    STOP_S,
    ClusterError,
    Coordinator,
    IntervalRecord,
    close_agents,
    consensus_call,
    interval_of,
    place_hosts,
)
from ..persist import Shard, ShardConfig, ShardNotFound
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
from ..server import ServeConfig
from ..shm import sweep, unlink_cluster
from .control import ControlServer
from .dashboard import ControlSource, Dashboard, Plan
from .metrics import Metrics, Supervised
from .stats import ClusterStats
from .verify import Verification, verify_shards
from .view import ClusterView
from .visibility import VisibilityWatch

T = TypeVar("T")


class Cluster(ClusterView):
    """A running cluster (see the module doc). Use as a context manager, or
    call :meth:`start` and :meth:`close` (idempotent). What it shows of
    itself (status, stats, processes, hosts) is its :class:`ClusterView`'s.

    Start enters every resource into one ``ExitStack`` as it starts it, so
    close is that stack's close: each resource is let go in reverse order of
    start, whatever failed before (the dashboard before the coordinator it
    asks; the coordinator before the control socket its loop polls, the
    segments, the shards and the consensus process its groups use; the data
    dir's lock last).

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
        requested, self.workload, schemas = workloads.prepare(config)
        super().__init__(requested, schemas, f"c{uuid.uuid4().hex[:12]}")
        self.zygote: Zygote | None = None
        self.run_dir: Path | None = None
        #: where this run's logs are kept (``DATA_DIR/logs/...``), once started
        self.logs: Path | None = None
        #: where the run's fault budgets and firings are (see the module doc);
        #: ``None`` when nothing is armed
        self.fault_dir: Path | None = None
        self._address = ""  # the consensus address the shards were opened at
        self._lock: datadir.DataDirLock | None = None
        self._resources = contextlib.ExitStack()
        self._started = False

    # --- lifecycle -----------------------------------------------------------------------

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> Cluster:
        """Check the shard, start the consensus process and the groups."""
        if self._started or self._closed:
            raise ValueError(f"cluster {self.cluster_id} was started already")
        self._started = True
        started = time.monotonic()
        try:
            self._start(self._resources)
        except BaseException:
            self.close()
            raise
        self.startup_s = time.monotonic() - started
        return self

    def _start(self, stack: contextlib.ExitStack) -> None:
        """Start every resource in order, each entered into ``stack``."""
        config = self.requested
        sweep()  # segments of dead processes, of any cluster
        data_dir = datadir.create(config.data_path)
        if config.serves_data_dir:  # released last: `shardsink status` finds the run until then
            self._lock = stack.enter_context(datadir.acquire(data_dir, datadir.COORDINATOR))
        # first after the lock: the run's budgets cover every fault point it
        # reaches, its store checks too
        self.run_dir = run_dir = make_run_dir(self.cluster_id, keep_logs=data_dir / logs.LOGS)
        self.logs = (run_dir / logs.LOGS).resolve()
        stack.callback(logs.end, self.logs)
        stack.callback(shutil.rmtree, run_dir, ignore_errors=True)
        # closed before the run dir goes: this process's points claim from
        # their own budgets again
        self.fault_dir = stack.enter_context(faults.run_budgets(run_dir / "faults"))
        if not config.external_server:
            self._check_store()
        starter = self._starter(stack, run_dir)
        self._open_shards(stack, self._start_consensus(stack, run_dir))
        stack.callback(unlink_cluster, self.cluster_id)
        # before the coordinator, so closed after it: its loop polls the socket
        control = ControlServer(run_dir, self.status)
        self.control = stack.enter_context(contextlib.closing(control))
        self.placed, agents = place_hosts(config, self.cluster_id)
        args = (self.placed, self.cluster_id, run_dir, self.shards, self.consensus, starter)
        try:
            self.coordinator = coordinator = Coordinator(*args, agents)
        except BaseException:  # its supervisor would have closed them; it never held them
            close_agents(agents or [])
            raise
        stack.callback(self._keep_final_stats)  # after the coordinator stopped, failed or not
        # a start given up on (Ctrl-C, SIGTERM, a failure) is killed at once
        stack.callback(lambda: coordinator.close(STOP_S if self.startup_s else 0.0))
        coordinator.start()
        rotate = logs.Rotator(self.logs)
        coordinator.on_poll = lambda: (control.poll(), rotate())
        if self._lock is not None:  # its lock is where `shardsink status` finds it
            self._lock.update(control=control.address)
        if self.placed.metrics_port is not None:
            supervised = Supervised(self._supervised, self._members, self.hosts)
            self.metrics = stack.enter_context(
                contextlib.closing(Metrics(self.placed.metrics_port, supervised))
            )
        # the dashboard samples the coordinator through the control socket
        self.dashboard = self._open_dashboard(stack, control.address)
        if self.placed.listen:
            watch = VisibilityWatch(
                self._reopen_shard, self.shard.upper, self.placed.interval_ms,
                coordinator.counters.minted_at,
            )  # fmt: skip
            self._visibility = stack.enter_context(contextlib.closing(watch))

    def close(self) -> None:
        """Stop every process, unlink every segment, remove the run directory:
        the resources' stack closed, in reverse order of start. Idempotent;
        Ctrl-C is ignored while it runs (in the main thread)."""
        if self._closed:
            return
        self._closed = True
        with sigint_ignored():
            self._resources.close()

    def _keep_final_stats(self) -> None:
        self._final = self._stats()

    # --- running -------------------------------------------------------------------------

    def run(
        self,
        intervals: int | None = None,
        *,
        on_append: Callable[[IntervalRecord], None] | None = None,
    ) -> ClusterStats:
        """Append ``intervals`` intervals (default ``intervals`` of the config) from the
        shard's upper on, calling ``on_append`` after each; then, if
        ``verify`` of the config, read the shard back. Returns :meth:`stats`.

        A stop request on the control socket raises
        :class:`~shardsink.cluster.control.StopRequested` out of it, as Ctrl-C
        raises ``KeyboardInterrupt``; the shard holds whole intervals either way."""
        coordinator, config = self._running(), self._placed()
        n = config.intervals if intervals is None else intervals
        if n < 0:
            raise ValueError(f"intervals must be >= 0, got {n}")

        def appended(record: IntervalRecord) -> None:
            self._observe(record)
            if on_append is not None:
                on_append(record)

        self._run_started = self._run_started or time.monotonic()
        coordinator.run(n, appended)
        if config.verify:
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
            lambda: verify_shards(shards.shards, self.workload, self.requested.interval_ms),
            "reading the shards back",
        )
        if isolated:
            peak = peak_rss(os.getpid()) or 0
            peaks = coordinator.supervisor.counters.peak_rss
            peaks["read-back"] = max(peaks.get("read-back", 0), peak)
            reset_own_peak_rss()
        return self._verification

    @property
    def holds_data_dir(self) -> bool:
        """Whether the cluster holds its data dir's lock, which names its
        control socket: then ``shardsink status|stop --data-dir`` find it."""
        return self._lock is not None

    # --- starting -------------------------------------------------------------------------

    def _open_dashboard(self, stack: contextlib.ExitStack, control: str) -> Dashboard | None:
        """The dashboard the placed config asks for, of the control socket at
        ``control``, showing progress toward its ``intervals``."""
        config = self._placed()
        if config.dashboard is None:
            return None
        plan = Plan(intervals=config.intervals, rows_per_interval=config.rows_per_interval)
        title = f"shardsink up: cluster {self.cluster_id}"
        source = ControlSource(address=control)
        dashboard = Dashboard(source, config.dashboard, title=title, plan=plan)
        return stack.enter_context(contextlib.closing(dashboard))

    def _start_consensus(self, stack: contextlib.ExitStack, run_dir: Path) -> str:
        """Start the consensus process (none for a running server) and give
        the address where it answers."""
        config = self.requested
        if config.external_server:
            return config.consensus_uri
        serving = ServeConfig(
            bind=config.consensus_bind or f"ipc://{run_dir / 'consensus'}",
            keys=str(key_dir(config.data_path)),
            retain=config.retain,
            writer_lease_ms=config.writer_lease_ms,
        )
        self.consensus = consensus = ConsensusProcess(
            config.consensus_uri,
            config.blob_uri,
            serving,
            # a fresh interpreter, never the zygote: only that takes the
            # server's allocator environment (see ConsensusProcess)
            run_dir=run_dir,
            timeout_s=config.start_timeout_s,
        )
        stack.callback(consensus.stop)  # a start that failed half way is stopped too
        try:
            address = consensus.start().address
        except ConsensusStartError as exc:
            raise ClusterError(str(exc)) from None
        assert address is not None
        if self._lock is not None:
            self._lock.update(address=address)
        return address

    def _open_shards(self, stack: contextlib.ExitStack, address: str) -> None:
        """Open the workload's shards at ``address`` and check their upper,
        through restarts of the consensus process."""
        config = self.requested
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
        stack.callback(shards.close)
        upper = self._through_restarts(shards.common_upper, "reading the upper")
        interval_of(upper, config.interval_ms, ", ".join(shards.shards))

    def _reopen_shard(self) -> Shard:
        """A handle of the cluster's (first) shard of its own, at its
        consensus address."""
        config = self.requested
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
        return consensus_call(self.requested, call, what, consensus=self.consensus)

    def _starter(self, stack: contextlib.ExitStack, run_dir: Path) -> Starter:
        """How children start (``start`` of the config); the zygote is started
        here, before this process opens any ZeroMQ context."""
        config = self.requested
        if config.start == "spawn":
            return SpawnStarter()
        self.zygote = zygote = Zygote(
            protocol.CHILD_ROLES, run_dir, timeout_s=config.start_timeout_s
        )
        stack.callback(zygote.stop)
        return zygote.start()

    def _shard_config(self, retry_for_s: float) -> ShardConfig:
        return ShardConfig(
            blob_target_bytes=self.requested.blob_target_bytes,
            server_timeout_s=self.requested.consensus_timeout_s,
            server_retry_for_s=retry_for_s,
        )

    def _check_store(self) -> None:
        """Schema and upper of each existing shard, read straight from the
        store before any process starts (``ValueError`` naming the problem)."""
        config = self.requested
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
