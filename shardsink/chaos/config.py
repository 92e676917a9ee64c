"""What a chaos run is given (:class:`ChaosConfig`) and what it reports
(:class:`ChaosReport`), and the fixed shape of its workload."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa

from .. import workloads
from .._bounds import at_least, positive
from .._http import parse_listen
from ..config import (
    COALESCES,
    EMULATED_BLOB,
    EMULATED_STORE,
    MODES,
    ClusterConfig,
    Coalesce,
    HostLost,
    Mode,
    Placement,
    emulated_hosts,
)
from .schedule import FAULT_KINDS, injectable

SHARD = "default"
#: Interval length in the shard's time (the workload's clock, not the wall's).
INTERVAL_MS = 1000
#: The consensus process's retention keeps ``since`` this many intervals
#: behind the upper; readers read within it.
SINCE_LAG = 20
#: Bound on one maintenance command.
MAINTENANCE_TIMEOUT_S = 120.0


class ChaosConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A chaos run. ``faults`` are kinds of :data:`FAULT_KINDS`; the nemesis
    injects one every ``mean_gap_s`` seconds on average; a pause lasts up to
    ``pause_max_s``. ``data_dir`` (default: a fresh temporary directory, kept
    only if the run finds a violation) must not hold a previous run. ``blob``
    and ``consensus`` name other stores than the files and SQLite database
    under it (``s3://...``, ``postgresql://...``); the shard must not exist in
    them yet. A group
    that has not reported within ``interval_timeout_s`` is restarted; no
    append for ``stall_s`` seconds is a violation (the cluster is stuck;
    ``None``: :meth:`stall_after_s`, which scales with the run).
    ``min_intervals``: fewer intervals appended than this and the run judged
    nothing: its verdict is ``unknown``, never ``valid``.
    ``dashboard``: serve the cluster's live dashboard, faults shown as they
    are injected, at ``HOST:PORT`` (loopback; port 0: a free one).
    ``coalesce``: the cluster's ``coalesce`` (``host``: its host builder is
    among the builders the faults hit). ``writer_lease_ms``: the consensus
    process's writer lease; a coordinator retries an append for two thirds
    of it (:attr:`append_retry_s`), and the leaked-blob sweep run by hand
    beside the cluster takes the shortest grace it allows, the lease.
    ``hosts``, ``blob_shared``, ``max_hosts``, ``host_timeout_s`` and
    ``host_lost``: the cluster's (``ray:ADDRESS``: ``groups`` groups on each
    node of that Ray cluster, whose nodes must run on this machine for the
    nemesis to reach their processes; the fault kinds ``kill-host`` and
    ``pause-host`` need it; ``netns:N``: N emulated hosts this run makes,
    a Ray node on each, the consensus server and the stores on hosts of
    their own, ``place`` says which; the network kinds need them: each
    fault lasts 1 to ``network_max_s`` seconds, then heals; ``consensus``
    ``postgresql`` and ``blob`` ``s3`` are throwaway servers on their
    hosts). ``workload`` and ``workload_args`` (the
    ``[workload]`` table of ``--config``): what the cluster writes, as
    ``up --workload`` takes it (docs/workloads.md); readers check snapshots
    against its ``expected`` if it has one, and the shard is checked by
    digest at the end in any case."""

    duration_s: float = 60.0
    seed: int = 0
    data_dir: str | None = None
    blob: str | None = None
    consensus: str | None = None
    groups: int = 2
    workers: int = 3
    mode: Mode = "barrier"
    coalesce: Coalesce = "group"
    workload: str = "churn"
    workload_args: dict[str, Any] = {}
    rows_per_interval: int = 200
    faults: tuple[str, ...] = FAULT_KINDS
    mean_gap_s: float = 3.0
    pause_max_s: float = 2.0
    readers: int = 2
    maintenance_every_s: float = 2.0
    interval_timeout_s: float = 10.0
    stall_s: float | None = None
    min_intervals: int = 5
    dashboard: str | None = None
    writer_lease_ms: int = 15_000
    hosts: str = "local"
    blob_shared: bool = False
    max_hosts: int = 0
    host_timeout_s: float = 10.0
    host_lost: HostLost = "move"
    place: Placement = Placement()
    network_max_s: float = 10.0

    def __post_init__(self) -> None:
        stores = ClusterConfig(  # their own checks
            blob=self.blob,
            consensus=self.consensus,
            hosts=self.hosts,
            max_hosts=self.max_hosts,
            host_timeout_s=self.host_timeout_s,
            host_lost=self.host_lost,
            place=self.place,
        )
        if stores.external_server:
            raise ValueError(
                f"consensus {self.consensus!r} is a server address; chaos runs (and kills) the "
                "consensus process itself, so name its store (sqlite://, postgresql://)"
            )
        positive(self, "duration_s")
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}; choose one of {', '.join(MODES)}")
        if self.coalesce not in COALESCES:
            raise ValueError(
                f"unknown coalesce {self.coalesce!r}; choose one of {', '.join(COALESCES)}"
            )
        injectable(
            self.faults,
            self.mode,
            hosts=self.on_hosts,
            network=self.network > 0,
            transactions=self.transactions,
        )
        positive(self, "network_max_s")
        at_least(self, 1, "groups", "workers", "rows_per_interval")
        at_least(self, 0, "readers")
        positive(self, "mean_gap_s", "pause_max_s", "maintenance_every_s")
        if self.stall_s is not None:
            positive(self, "stall_s")
        at_least(self, 1, "min_intervals")
        at_least(self, 1, "writer_lease_ms")
        if self.dashboard is not None:
            parse_listen(self.dashboard)
        if self.pause_max_s >= self.interval_timeout_s:
            raise ValueError(
                f"pause_max_s ({self.pause_max_s}) must stay below interval_timeout_s "
                f"({self.interval_timeout_s}), or a pause is indistinguishable from a hang"
            )

    @property
    def stall_after_s(self) -> float:
        """How long without an append is a stuck cluster: ``stall_s``, or a
        quarter of the run, at least three interval timeouts (a restart
        after a missed deadline, and the redo) and at most 120 s. A fixed
        120 s could not fire in a 60 s run."""
        if self.stall_s is not None:
            return self.stall_s
        return min(120.0, max(3 * self.interval_timeout_s, self.duration_s / 4))

    @staticmethod
    def from_toml(table: dict[str, Any]) -> dict[str, Any]:
        """A config file's ``[workload]`` table, as ``ClusterConfig`` reads it."""
        return ClusterConfig.from_toml(table)

    def cluster_workload(self) -> ClusterConfig:
        """The cluster config of the run's workload (its file made absolute)."""
        return ClusterConfig(
            workload=workloads.resolve(self.workload),
            workload_args=self.workload_args,
            rows_per_interval=self.rows_per_interval,
            interval_ms=INTERVAL_MS,
            seed=self.seed,
        )

    def load_workload(self) -> workloads.AnyWorkload:
        """The run's workload (``ValueError`` naming what is wrong with it)."""
        return workloads.of(self.cluster_workload())

    def shard_schemas(self) -> dict[str, pa.Schema]:
        """The run's shards and their schemas, in the workload's order: its
        ``shards``, or its one schema as shard :data:`SHARD`."""
        return workloads.shard_schemas(self.load_workload(), self.workload, default=SHARD)

    @property
    def transactions(self) -> bool:
        """Whether every append is a transaction across several shards."""
        return len(self.shard_schemas()) > 1

    def workload_flags(self, directory: Path) -> list[str]:
        """``up``'s flags for the run's workload: ``--workload`` and, for its
        arguments, ``--config`` naming a file written into ``directory``."""
        config = self.cluster_workload()
        if not config.workload_args:
            return ["--workload", config.workload]
        path = directory / "workload.toml"
        lines = [f"{json.dumps(k)} = {_toml(v)}" for k, v in config.workload_args.items()]
        path.write_text("[workload]\n" + "\n".join(lines) + "\n")
        return ["--workload", config.workload, "--config", str(path)]

    @property
    def on_hosts(self) -> bool:
        """Whether the groups run on the hosts of a Ray cluster (emulated
        hosts run one)."""
        return self.hosts != "local"

    @property
    def network(self) -> int:
        """How many emulated hosts the run makes (``netns:N``), 0 for none."""
        return emulated_hosts(self.hosts) or 0

    @property
    def emulated_stores(self) -> tuple[bool, bool]:
        """Whether the emulated hosts run a PostgreSQL server (consensus
        ``postgresql``) and an S3 server (blob ``s3``) for the run."""
        return self.consensus == EMULATED_STORE, self.blob == EMULATED_BLOB

    @property
    def append_retry_s(self) -> float:
        """How long a coordinator retries an append: the most its writer
        lease allows (:func:`~shardsink.config.check_lease`)."""
        return self.writer_lease_ms * 2 / 3 / 1000


class HistoryCheck(msgspec.Struct, kw_only=True):
    """The run's history (``history.jsonl``) and its linearizability check:
    ``ops`` recorded, of them ``appends`` committed (``ok`` or ``already``)
    and ``info`` (outcome unknown), the checker's ``verdict`` (``valid``,
    ``invalid``, ``unknown``) and why, and how long it took. ``lines``: the
    check in words, with the shortest failing sub-history of an invalid
    shard. The final checks add a read of the shard's upper when the run has
    stopped, so a committed append the shard lost is a violation here too."""

    ops: int = 0
    appends: int = 0
    info: int = 0
    verdict: str = "unknown"
    reason: str = ""
    check_s: float = 0.0
    lines: list[str] = msgspec.field(default_factory=list)


class ChaosReport(msgspec.Struct, kw_only=True):
    """What a chaos run did and found.

    ``injected`` counts faults by kind: signals sent and point firings
    (recorded by the process that fired). ``scheduled`` counts the schedule's
    events by kind (a store error event may release a burst of several
    faults), ``released`` the point firings the nemesis let go, ``missed`` the
    signal events that found no process to hit while the cluster restarted,
    ``lost`` the point firings a process took but was killed before it
    recorded or acted on them (a group being killed just then), and
    ``unfired`` the other faults the schedule called for (bursts counted
    whole) that were never injected: missed signals, and released firings
    that no process reached before the run stopped waiting for them (it waits
    up to :data:`~.runner.SETTLE_SHARE` of its duration after it, unless interrupted).
    ``data_dir`` is empty if the run's temporary directory was removed.
    ``coordinator_starts`` counts ``shardsink up`` runs and ``coordinator_exits``
    why each earlier one ended. ``intervals_redone`` counts intervals appended
    by an attempt after the first; ``supervision`` the coordinators' group
    restarts, consensus restarts and abandoned attempts (each as of its last
    append), ``restart_ms`` how long group restarts took (count, median and
    largest, from the kill to every member ready again). ``violations`` is
    empty for a good run. ``ran_s`` is how long faults were injected: longer
    than ``duration_s`` by the time the last ones took to fire and the
    cluster to append again, shorter if ``interrupted`` (Ctrl-C stops the
    run early; the checks still run). ``verdict``: ``invalid`` with any
    violation; ``unknown`` when the run judged too little (fewer intervals
    than ``min_intervals``, readers that checked no snapshot, a history the
    checker could not decide), never passed off as ``valid``; ``valid``
    otherwise; ``reasons`` says why it is not ``valid``. ``history``: the
    history's check (:class:`HistoryCheck`); ``heals``: each network fault
    healed (emulated hosts) and the time to the cluster's next append."""

    seed: int
    duration_s: float
    shape: str
    mode: str
    faults: tuple[str, ...]
    data_dir: str
    coalesce: str = "group"
    scheduled: dict[str, int]
    injected: dict[str, int]
    released: dict[str, int]
    missed: dict[str, int]
    coordinator_starts: int
    coordinator_exits: dict[str, int]
    intervals: int
    intervals_redone: int
    supervision: dict[str, int]
    restart_ms: dict[str, float]
    snapshots_checked: int
    snapshots_skipped: dict[str, int]
    maintenance: dict[str, int]
    leaked_blobs_swept: int
    segments_swept: int
    violations: list[str]
    ran_s: float = 0.0
    interrupted: bool = False
    lost: dict[str, int] = msgspec.field(default_factory=dict)
    unfired: dict[str, int] = msgspec.field(default_factory=dict)
    verdict: str = "unknown"
    reasons: list[str] = msgspec.field(default_factory=list)
    history: HistoryCheck = msgspec.field(default_factory=HistoryCheck)
    heals: list[dict] = msgspec.field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No violation (the verdict may still be ``unknown``)."""
        return not self.violations


def _toml(value: Any) -> str:
    """``value`` (what a TOML table held) as a TOML value: JSON's spelling of
    strings, numbers, booleans and arrays is TOML's; a table is inline."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value)
