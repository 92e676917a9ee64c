"""The knobs of a cluster, as one msgspec Struct validated on construction.

``ClusterConfig`` is what ``shardsink up`` builds from its flags and what
:class:`shardsink.cluster.Cluster` takes. Every check happens in
``__post_init__``, so an impossible shape, an unknown workload or mode, or a
malformed URI is a ``ValueError`` naming the field before any process starts.
"""

from __future__ import annotations

import math
import os
from typing import Annotated, Any, Literal, get_args
from urllib.parse import urlsplit

import msgspec
import pyarrow as pa

from . import datadir
from ._address import REMOTE_SCHEMES, check_address
from ._bounds import Machine, at_least, min_row_bytes, port, positive
from ._http import parse_listen
from ._units import MIB
from .netns import MAX_HOSTS
from .options import BYTES, Size
from .persist import ShardConfig, check_shard_name, full_schema
from .shm import DEFAULT_CAPACITY, MESSAGE_PART_MAX_BYTES
from .storage import redact

#: The ``shared_max_bytes`` that tunes itself.
AUTO = "auto"
Mode = Literal["off", "best-effort", "barrier"]
Coalesce = Literal["group", "host"]
Pace = Literal["realtime", "max"]
Start = Literal["fork", "spawn"]
HostLost = Literal["move", "wait"]
WorkloadName = Literal["trickle", "churn", "hydrate"]
MODES: tuple[str, ...] = get_args(Mode)
COALESCES: tuple[str, ...] = get_args(Coalesce)
PACES: tuple[str, ...] = get_args(Pace)
STARTS: tuple[str, ...] = get_args(Start)
WORKLOADS: tuple[str, ...] = get_args(WorkloadName)

BLOB_SCHEMES = ("file", "s3")
STORE_SCHEMES = ("sqlite", "postgresql", "postgres")
#: With ``hosts`` netns:N, the consensus store and the blob store that a
#: server started on its emulated host holds (a bare scheme, no URI).
EMULATED_STORE, EMULATED_BLOB = "postgresql", "s3"


class Placement(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Which emulated host (by index) runs what, with ``hosts`` netns:N: the
    coordinator (and the Ray head), the consensus server, PostgreSQL and the
    S3 server (when the stores are theirs). A field left ``None`` is host 0,
    1, 2 and 2 respectively, modulo N: so with two hosts or more every hop
    coordinator -> consensus server -> store crosses the emulated network.
    Every host runs a Ray node, so groups run on every host."""

    coordinator: int | None = None
    consensus: int | None = None
    postgres: int | None = None
    s3: int | None = None

    def resolve(self, hosts: int) -> Placement:
        """Every field an index of ``hosts`` hosts (the defaults filled in);
        ``ValueError`` naming a field outside 0 to ``hosts - 1``."""
        defaults = {"coordinator": 0, "consensus": 1, "postgres": 2, "s3": 2}
        chosen = {}
        for name, default in defaults.items():
            index = getattr(self, name)
            if index is not None and not 0 <= index < hosts:
                raise ValueError(
                    f"place {name}={index}: hosts netns:{hosts} are numbered 0 to {hosts - 1}"
                )
            chosen[name] = default % hosts if index is None else index
        return Placement(**chosen)

    @staticmethod
    def parse(text: str) -> dict[str, int]:
        """``ROLE=HOST,...`` (``consensus=1,postgres=2``) as fields;
        ``ValueError`` naming a part that is not a role and an index."""
        fields = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            role, _, index = part.partition("=")
            if role not in Placement.__struct_fields__ or not index.strip().isdigit():
                raise ValueError(
                    f"invalid place {part!r}: ROLE=HOST, ROLE one of "
                    f"{', '.join(Placement.__struct_fields__)}, HOST a host's index"
                )
            fields[role] = int(index)
        return fields


class ClusterConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Everything a cluster run needs; every field has a default.

    Shape and mode:

    - ``groups`` process groups of ``workers`` workers and one builder each.
    - ``mode``: ``off`` (every worker writes its own batch), ``best-effort``
      (a worker joins its group's shared batch while one is being built),
      ``barrier`` (one shared batch per group per interval).
    - ``coalesce``: where shared batches are built in ``best-effort`` and
      ``barrier`` mode (``off`` ignores it): ``group``, one builder per group
      writes one part per group and interval; ``host``, the group builders
      pass their finished shared-batch rows to one host builder, which writes
      one part per host and interval (figures: docs/benchmarks.md,
      Coalescing).
    - ``shared_max_bytes``: a worker whose staged updates for an interval take
      more than this (Arrow bytes) writes its own batch; 0 disables sharing;
      ``"auto"`` starts at 1 MiB and tunes it every interval from the
      builders' lag against the workers' own write time (the rule:
      :mod:`shardsink.coordinator.threshold`).
    - ``blob_target_bytes``: size at which a builder cuts a Parquet part.
    - ``best_effort_linger_ms``: in best-effort mode, how long a builder holds
      a shared batch whose last open handle finished while some of the group's
      workers have not joined it yet, so that a worker that is slow to start
      still joins it; 0 hands it off at once. Every worker joins on the mint,
      even with nothing to share, and the append waits for every worker, so
      the linger only costs time when a worker joins more than the linger late
      or not at all. 10 ms took a 1x8 trickle from ~1.6-1.9 to ~1.0 parts per
      append on 2 cores, where 5 ms still left up to ~1.3.
    - ``message_part_max_bytes``: a part a worker hands its builder
      travels inside the ZeroMQ message if its Arrow IPC size is at most this,
      through the worker's shared-memory arena otherwise; 0 sends every part
      through the arena. The default, 32 KiB, is the largest size at which
      inline was measured faster (figures: docs/benchmarks.md, Transport).

    Workload (``shardsink.workloads.of`` a config; docs/workloads.md):
    ``workload``, a built-in (``trickle``, ``churn``, ``hydrate``, ``synth``),
    ``PATH.py:NAME`` or ``package.module:NAME`` (a class or an instance of the
    workload protocol); ``workload_args``, the keyword arguments of such a
    class (``--config``'s ``[workload]`` table); ``rows_per_interval``,
    ``snapshot_rows`` (hydrate), ``intervals`` per run,
    ``interval_ms``, ``pace`` (``realtime``: mint each interval when the wall
    clock passes its end; ``max``: as fast as appends go), ``rate``
    (intervals a second, open loop: interval ``i`` of a run is due ``(i +
    1) / rate`` seconds after it starts whatever happened before, and its
    latency counts from then; ``pace`` is then not used); ``listen``: a
    reader in the coordinator's process listens on the shard and times each
    interval from its first mint to when it sees it (end to end,
    ``ClusterStats.visible_latency_ms``).

    Storage: ``data_dir`` holds the embedded defaults, ``blob`` (default
    ``file://DATA_DIR/blob``) and ``consensus``: a store URI (default
    ``sqlite:///DATA_DIR/consensus.db``; the cluster runs a consensus process
    on it) or the address of a running server (``tcp://``, ``ipc://``).
    ``shard`` names the shard of a workload of one ``schema`` (a workload of
    several ``shards`` names its own). ``consensus_bind`` is where the cluster's own
    consensus process listens (default ``ipc://RUN_DIR/consensus``, a fresh
    directory per run); a fixed address lets clients outside the cluster (a
    reader, ``shardsink chaos``) reach the shard across restarts of the
    coordinator.

    ``coordinator_bind``: where the coordinator's socket, which every
    builder and worker connects to, listens: empty for ``ipc://RUN_DIR/coord``
    (this host only), or ``tcp://HOST:PORT`` (port 0: a free one; HOST
    loopback, as every TCP bind of shardsink, :mod:`shardsink._address`),
    secured with CURVE keys the coordinator makes for the cluster in memory
    (:func:`shardsink._curve.ephemeral_keys`) and hands to the children in
    their launch payload.

    Hosts: ``hosts`` is where the groups run: ``local`` (this machine), or
    ``ray:ADDRESS`` (``ray:auto``, ``ray:HOST:PORT``, as ``ray.init`` takes
    it): ``groups`` groups on each node of that Ray cluster (the first
    ``max_hosts`` nodes, if not 0), each host's run by a host agent pinned to
    its node (:mod:`shardsink.hosts`), the coordinator's socket TCP
    (``coordinator_bind``, loopback if not given); a host whose agent has not
    answered for ``host_timeout_s`` is gone: with ``host_lost`` "move" its
    groups run on the other hosts until a node that has no agent (one that
    joined, or whose agent died) takes its place and they move back; with
    "wait" they wait for that node (up to ``start_timeout_s``). The number of
    groups is set at the start.
    Every host writes blobs: a ``file://`` store with more than one host is
    refused unless ``blob_shared`` says its directory is the same on every
    host (a shared mount, or one machine).

    Emulated hosts: ``hosts`` ``netns:N`` is N hosts emulated on this machine
    (network namespaces, root only; docs/operating.md): ``up`` makes them,
    runs a Ray node on each, the consensus server on a host of its own and
    the coordinator on another (``place``, a :class:`Placement`), with the
    groups on every host, and removes them at the end. Their stores are the
    data dir's (one file system is every host's), or, with ``consensus``
    ``postgresql`` and ``blob`` ``s3``, a throwaway PostgreSQL and S3 server
    each on its host; a store outside the hosts, ``consensus_bind`` and
    ``coordinator_bind`` are refused (the hosts set them). ``place`` is
    ignored with other ``hosts``.

    Processes: ``start`` is how children start: ``fork`` from a zygote that
    has imported everything they need (milliseconds each, library pages
    shared), or ``spawn`` as fresh interpreters (about half a second of CPU
    each; kept to compare against). See :mod:`shardsink.process`.

    Supervision: ``start_timeout_s`` for a group or the consensus process to
    come up, ``interval_timeout_s`` for all reports of one attempt (a group
    that misses it is restarted), ``max_restarts`` before the run fails,
    ``consensus_timeout_s`` for one consensus request, ``append_retry_s``
    for how long an append whose outcome is unknown keeps being retried
    (through consensus restarts) with its idempotency token.

    ``writer_lease_ms``: the writer lease of the cluster's consensus process
    (its ``--writer-lease-ms``): a writer not seen for this long is expired,
    its token and its unappended parts with it. It must outlast any retry of
    an append, beyond the third of a lease that may pass between two
    heartbeats: ``writer_lease_ms * 2/3 >= append_retry_s`` (checked here,
    and against a running server's lease when the cluster opens the shard).

    ``retain``: how far the cluster's consensus process keeps ``since``
    behind the upper, in the shard's time unit (its ``--retain``; 0: off);
    its maintenance also compacts by the spine's rule and expires writers.
    Ignored with a running server (``consensus`` an address): it has its own.

    ``metrics_port``: serve Prometheus metrics on ``127.0.0.1:PORT`` (0: a
    free port) while the cluster runs; ``None``: none. ``dashboard``: serve
    the live dashboard at ``HOST:PORT`` (loopback; port 0: a free one);
    ``None``: none.

    ``seed`` drives the run's random choices (the order mints go out in);
    ``verify`` reads the shard back after a run and compares it with the
    workload's expected collection. Faults are armed apart, through
    ``shardsink.faults``.
    """

    groups: int = 2
    workers: int = 4
    mode: Mode = "best-effort"
    coalesce: Coalesce = "group"
    shared_max_bytes: Annotated[int | Literal["auto"], BYTES] = MIB
    blob_target_bytes: Size = 128 * MIB
    best_effort_linger_ms: int = 10
    message_part_max_bytes: Size = MESSAGE_PART_MAX_BYTES
    workload: str = "trickle"
    workload_args: dict[str, Any] = {}
    rows_per_interval: int = 1000
    snapshot_rows: int = 0
    intervals: int = 20
    interval_ms: int = 1000
    pace: Pace = "max"
    rate: float | None = None
    listen: bool = False
    data_dir: str = "./shardsink-data"
    blob: str | None = None
    consensus: str | None = None
    shard: str = "default"
    consensus_bind: str | None = None
    coordinator_bind: str = ""
    hosts: str = "local"
    place: Placement = Placement()
    blob_shared: bool = False
    max_hosts: int = 0
    host_timeout_s: float = 10.0
    host_lost: HostLost = "move"
    start: Start = "fork"
    seed: int = 0
    start_timeout_s: float = 120.0
    interval_timeout_s: float = 60.0
    consensus_timeout_s: float = 5.0
    append_retry_s: float = 120.0
    max_restarts: int = 20
    retain: int = ShardConfig().retain
    writer_lease_ms: int = ShardConfig().writer_lease_ms
    metrics_port: int | None = None
    dashboard: str | None = None
    verify: bool = True

    def __post_init__(self) -> None:
        at_least(self, 1, "groups", "workers", "interval_ms", "blob_target_bytes")
        at_least(
            self,
            0,
            "best_effort_linger_ms",
            "message_part_max_bytes",
            "rows_per_interval",
            "snapshot_rows",
            "intervals",
            "max_restarts",
            "retain",
        )
        if self.shared_max_bytes != AUTO and self.shared_max_bytes < 0:
            raise ValueError(
                f"shared_max_bytes must be >= 0 or 'auto', got {self.shared_max_bytes}"
            )
        positive(
            self, "start_timeout_s", "interval_timeout_s", "consensus_timeout_s", "append_retry_s"
        )
        at_least(self, 1, "writer_lease_ms")
        check_lease(self.writer_lease_ms, self.append_retry_s)
        port(self, "metrics_port")
        if self.dashboard is not None:
            parse_listen(self.dashboard)
        _choice("mode", self.mode, MODES)
        _choice("coalesce", self.coalesce, COALESCES)
        _choice("pace", self.pace, PACES)
        if self.rate is not None and not self.rate > 0:
            raise ValueError(f"rate must be > 0 intervals a second, got {self.rate}")
        _choice("start", self.start, STARTS)
        if not self.workload:
            raise ValueError(
                "workload must not be empty: trickle, churn, hydrate, synth, "
                "PATH.py:NAME or package.module:NAME"
            )
        check_shard_name(self.shard)
        if not self.data_dir:
            raise ValueError("data_dir must not be empty")
        emulated = emulated_hosts(self.hosts)
        if self.blob is not None and not (emulated and self.blob == EMULATED_BLOB):
            _check_uri("blob", self.blob, BLOB_SCHEMES, EMULATED_BLOB)
        if self.consensus is not None and not (emulated and self.consensus == EMULATED_STORE):
            _check_uri("consensus", self.consensus, STORE_SCHEMES + REMOTE_SCHEMES, EMULATED_STORE)
        if self.consensus_bind is not None:
            _check_uri("consensus_bind", self.consensus_bind, REMOTE_SCHEMES)
            if self.external_server:
                raise ValueError(
                    f"consensus_bind {self.consensus_bind!r} is for the cluster's own consensus "
                    f"process, but consensus {self.consensus!r} names a running server"
                )

        if self.coordinator_bind:
            if not self.coordinator_bind.startswith("tcp://"):
                raise ValueError(
                    f"invalid coordinator_bind {self.coordinator_bind!r}: tcp://HOST:PORT, or "
                    "empty for the run directory's ipc socket"
                )
            try:
                check_address(self.coordinator_bind, for_bind=True, curve=True)
            except ValueError as exc:
                raise ValueError(f"coordinator_bind: {exc}") from None

        _check_hosts(self.hosts, self.max_hosts, self.host_timeout_s)
        if emulated:
            _check_emulated(self, emulated)

    @staticmethod
    def from_toml(table: dict[str, Any]) -> dict[str, Any]:
        """A config file's table as fields: a ``[workload]`` table is
        ``workload_args``, but for its key ``use``, the ``workload``."""
        if isinstance(table.get("workload"), dict):
            args = dict(table.pop("workload"))
            if "use" in args:
                table["workload"] = args.pop("use")
            table["workload_args"] = args
        return table

    @property
    def n_workers(self) -> int:
        """Workers in the whole cluster (``groups * workers``)."""
        return self.groups * self.workers

    @property
    def host_builder(self) -> bool:
        """Whether the cluster runs a host builder (``coalesce`` host in a
        sharing mode)."""
        return self.coalesce == "host" and self.mode != "off"

    @property
    def data_path(self) -> str:
        return os.path.abspath(self.data_dir)

    @property
    def blob_uri(self) -> str:
        """``blob``, or the file store under ``data_dir``."""
        return self.blob or datadir.blob_uri(self.data_path)

    @property
    def consensus_uri(self) -> str:
        """``consensus``, or the SQLite store under ``data_dir``."""
        return self.consensus or datadir.consensus_uri(self.data_path)

    @property
    def serves_data_dir(self) -> bool:
        """Whether the cluster serves a store of its data dir (then it holds
        the data dir's lock): not when ``consensus`` names a running server,
        which serves the state, nor when both stores are elsewhere."""
        return not self.external_server and (
            self.consensus_uri == datadir.consensus_uri(self.data_path)
            or self.blob_uri == datadir.blob_uri(self.data_path)
        )

    @property
    def external_server(self) -> bool:
        """Whether ``consensus`` names a running server (not a store to serve)."""
        return urlsplit(self.consensus_uri).scheme.lower() in REMOTE_SCHEMES


#: What one child of a cluster takes, measured on 2x4, 4x8, 16x8 and 32x8
#: trickle clusters (``shardsink up --pace realtime``, read once all were up):
#: 7 tasks a builder or worker (2 Python, 4 ZeroMQ I/O and reaper, the main
#: one); 7.1-8.7 MiB of private memory (USS) a forked worker, and 0.47 MiB of
#: page tables, while the kernel's MemAvailable fell by 8.1-11.4 MiB a child
#: as 16x8 and 32x8 clusters started (two runs each; their 120-140 MiB of RSS
#: is mostly the zygote's pages, shared); 90 MiB of USS a worker started with
#: ``--start spawn``. A 1x3000 cluster, which 6 MiB a child let through, was
#: killed by the kernel's OOM killer here (24 GiB).
TASKS_PER_CHILD = 7
FORKED_CHILD_BYTES = 10 * MIB
SPAWNED_CHILD_BYTES = 92 * MIB
#: The coordinator's descriptors: 49 with 10 children, 101 with 36 (a pidfd
#: and a socket each), measured as above.
COORDINATOR_FDS, FDS_PER_CHILD = 29, 2
#: A worker's CPU an interval, at least: 0.74 ms at 100 rows and 1.12 ms at
#: 1,000 (2x4 trickle, 400 intervals at --pace max, psutil's CPU times).
WORKER_INTERVAL_CPU_S = 0.0005


def check_machine(config: ClusterConfig, here: Machine) -> None:
    """``ValueError``, one line naming the flags and the limit, if a cluster
    of ``config`` on this machine (``here``: :func:`shardsink._bounds.this_machine`)
    cannot run: its processes need more tasks than ``ulimit -u`` (or the
    kernel's or cgroup's limit) leaves, more descriptors in the coordinator
    than ``ulimit -n``, more memory than is available together with an
    interval's rows (at least :func:`least_row_bytes` a row), more ``/dev/shm`` than is
    free for what its workers stage at once, or more CPU an interval than
    ``interval_timeout_s`` gives them. Each figure is what a child was
    measured to take (see :data:`TASKS_PER_CHILD`) or the least an interval
    takes, against what this machine has, never a fixed cap. Groups placed on
    the nodes of a Ray cluster (``hosts`` not local) are not checked here."""
    if config.hosts != "local":
        return
    shape = f"--groups {config.groups} --workers {config.workers}"
    children = config.groups * (config.workers + 1) + config.host_builder
    children += (config.start == "fork") + (not config.external_server)
    tasks = children * TASKS_PER_CHILD
    if tasks > here.tasks_free:
        raise ValueError(
            f"{shape}: {children:,} processes of {TASKS_PER_CHILD} threads each need "
            f"{tasks:,} tasks, but {here.tasks_limit} leaves room for {here.tasks_free:,} more"
        )
    fds = COORDINATOR_FDS + FDS_PER_CHILD * children
    if fds > here.fds:
        raise ValueError(
            f"{shape}: the coordinator holds {FDS_PER_CHILD} descriptors a process, {fds:,} "
            f"in all, past ulimit -n {here.fds:,}"
        )
    _check_memory(config, shape, children, least_row_bytes(config), here)
    cpu_s = config.n_workers * WORKER_INTERVAL_CPU_S / here.cpus
    if cpu_s > config.interval_timeout_s:
        raise ValueError(
            f"{shape}: {config.n_workers:,} workers take at least {cpu_s:,.0f} s an interval "
            f"on {here.cpus} CPUs, past --interval-timeout-s {config.interval_timeout_s:g}"
        )


def least_row_bytes(config: ClusterConfig) -> float:
    """The fewest bytes a row of ``config``'s workload takes in memory: by
    the built-ins' schema, else by the ``ts`` and ``diff`` every row has (a
    workload of one's own is not loaded for it: its rows are only known by
    making them, which is what a too large interval must not be made for)."""
    schema = full_schema()
    if config.workload not in WORKLOADS:
        schema = pa.schema([schema.field("ts"), schema.field("diff")])
    return min_row_bytes(schema)


def _check_memory(
    config: ClusterConfig, shape: str, children: int, row_bytes: float, here: Machine
) -> None:
    """:func:`check_machine`'s memory and ``/dev/shm``."""
    rows = max(config.rows_per_interval, config.snapshot_rows)
    flag = "--snapshot-rows" if config.snapshot_rows > config.rows_per_interval else ""
    flag = f"{flag or '--rows-per-interval'} {rows}"
    interval = rows * row_bytes
    each = FORKED_CHILD_BYTES if config.start == "fork" else SPAWNED_CHILD_BYTES
    processes = children * each
    if processes + interval > here.memory_bytes:
        what = (
            f"{shape}: {children:,} processes take about {_words(processes)} ({_words(each)} each)"
            if processes >= interval
            else f"{flag}: an interval takes at least {_words(interval)} ({row_bytes:g} bytes "
            "a row)"
        )
        raise ValueError(f"{what}, but {_words(here.memory_bytes)} of memory is available")
    # A worker shares its slice (at least ``share``) unless it is past the
    # threshold; it stages in its arena at most the arena's capacity at once,
    # and a slice no larger than a message part travels inside the message.
    share = interval / config.n_workers
    most = DEFAULT_CAPACITY if config.shared_max_bytes == AUTO else config.shared_max_bytes
    if config.mode == "off" or not config.message_part_max_bytes < share <= most:
        return
    staged = config.n_workers * min(DEFAULT_CAPACITY, share)
    if config.host_builder:  # each group builder stages its group's rows for the host builder
        staged += config.groups * min(DEFAULT_CAPACITY, share * config.workers)
    if staged > here.shm_bytes:
        raise ValueError(
            f"{shape} --shared-max-bytes {config.shared_max_bytes} {flag}: the workers stage "
            f"up to {_words(staged)} in /dev/shm at once, but it has "
            f"{_words(here.shm_bytes)} free"
        )


def _words(n: float) -> str:
    """``n`` bytes in words: ``21.6 GiB``."""
    for unit, size in (("PiB", 1 << 50), ("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", MIB)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n:,.0f} bytes"


def check_lease(writer_lease_ms: int, append_retry_s: float) -> None:
    """``ValueError`` naming both unless a writer lease of ``writer_lease_ms``
    outlasts an append retried for ``append_retry_s`` (see
    :class:`ClusterConfig`): an expired writer loses its idempotency token, so
    a retry past it could no longer learn that an earlier try committed."""
    if writer_lease_ms * 2 / 3 < append_retry_s * 1000:
        raise ValueError(
            f"writer_lease_ms {writer_lease_ms} is too short for append_retry_s "
            f"{append_retry_s:g}: a writer may go a third of its lease without a heartbeat, and "
            "the rest must outlast every retry of an append (its idempotency token goes with "
            f"the writer); use writer_lease_ms >= {math.ceil(append_retry_s * 1500)} or a "
            "shorter append_retry_s"
        )


def _choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; choose one of {', '.join(choices)}")


def _check_uri(name: str, uri: str, schemes: tuple[str, ...], emulated: str = "") -> None:
    """``ValueError`` naming ``name`` unless ``uri`` has one of ``schemes``;
    ``emulated``, the word for a store on an emulated host, is named as such."""
    scheme = urlsplit(uri).scheme.lower() if isinstance(uri, str) and "://" in uri else ""
    if uri == emulated:
        raise ValueError(
            f"{name} {uri!r} runs a throwaway server on an emulated host: it needs hosts netns:N"
        )
    if scheme not in schemes:
        raise ValueError(
            f"invalid {name} URI {redact(uri)!r}: a cluster's processes share it, so it must be "
            f"one of {', '.join(s + '://' for s in schemes)}"
        )


def emulated_hosts(hosts: str) -> int | None:
    """N for ``hosts`` ``netns:N`` (1 to :data:`~shardsink.netns.network.MAX_HOSTS`), ``None``
    for any other ``hosts``; ``ValueError`` naming a bad N."""
    scheme, _, count = hosts.partition(":")
    if scheme != "netns":
        return None
    if not count.isdigit() or not 1 <= int(count) <= MAX_HOSTS:
        raise ValueError(f"invalid hosts {hosts!r}: netns:N emulates N hosts, 1 to {MAX_HOSTS}")
    return int(count)


def _check_hosts(hosts: str, max_hosts: int, host_timeout_s: float) -> None:
    scheme, _, address = hosts.partition(":")
    if hosts != "local" and (scheme not in ("ray", "netns") or not address):
        raise ValueError(f"invalid hosts {hosts!r}: local, ray:auto, ray:HOST:PORT or netns:N")
    if max_hosts < 0:
        raise ValueError(f"max_hosts must be at least 0 (0: every node), not {max_hosts}")
    if host_timeout_s <= 0:
        raise ValueError(f"host_timeout_s must be positive, not {host_timeout_s}")


def _check_emulated(config: ClusterConfig, hosts: int) -> None:
    """``ValueError``, one line, for what emulated hosts cannot run: a store
    they cannot reach (nothing outside them is), an address they set, a
    placement outside them."""
    for name, value, ours, schemes in (
        ("consensus", config.consensus, EMULATED_STORE, ("sqlite",)),
        ("blob", config.blob, EMULATED_BLOB, ("file",)),
    ):
        if value is not None and value != ours and urlsplit(value).scheme not in schemes:
            raise ValueError(
                f"{name} {redact(value)!r} with hosts netns:{hosts}: emulated hosts reach only "
                f"each other and the file system, so {name} is {schemes[0]}://... (default: the "
                f"data dir's) or {ours} (a throwaway server on its host)"
            )
    for name in ("consensus_bind", "coordinator_bind"):
        if getattr(config, name):
            raise ValueError(f"{name} with hosts netns:{hosts}: the emulated hosts set it")
    config.place.resolve(hosts)
