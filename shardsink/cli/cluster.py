"""``shardsink up``: run a cluster in the foreground until its workload is done.

Ctrl-C stops it cleanly: the interval in flight is abandoned (the shard holds
whole intervals only), every process is stopped and every shared-memory
segment unlinked, and the summary covers what was appended. Running it again
on the same data dir continues from the shard's upper.

With ``--hosts netns:N`` this process runs none of the cluster: it makes N
emulated hosts (:class:`~shardsink.testing.emulated.EmulatedCluster`), runs
the real coordinator (``up --hosts ray:ADDRESS``) on the coordinator's host,
passes Ctrl-C and SIGTERM on to it, exits with its status and removes the
hosts (:func:`_up_emulated`).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import msgspec

from .._http import FREE_PORT
from ..config import Placement
from ..datadir import DATA_DIR_ENV
from ..options import Flag, add_options, build, flag_of, layered
from ..persist import ShardConfig
from ..storage import BLOB_ENV, STORE_ENV
from . import logs as _logs
from ._output import table_console
from ._tables import host_words, status_tables, summary_table

#: ``--place``'s help, for ``up`` and ``chaos``.
PLACE_HELP = (
    "with --hosts netns:N, the host (an index) of the coordinator, consensus, postgres and s3 "
    "(default coordinator=0,consensus=1,postgres=2,s3=2, each modulo N)"
)


def placement(text: str) -> dict[str, int]:
    """``--place``'s value (``ROLE=HOST,...``) as :class:`~shardsink.config.Placement`
    fields, for ``up`` and ``chaos``."""
    try:
        return Placement.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


#: How often ``--events`` looks for restarts between appends.
SUPERVISION_POLL_S = 0.5
#: Runs with at least this many intervals get a progress bar.
PROGRESS_MIN_INTERVALS = 10
#: How long ``shardsink stop`` waits for the coordinator to exit by default.
STOP_TIMEOUT_S = 60.0
STOP_POLL_S = 0.05
#: How often ``status --watch`` asks by default.
WATCH_EVERY_S = 1.0
#: hydrate's interval-0 rows when neither a flag nor the config file sets them.
HYDRATE_SNAPSHOT_ROWS = 100_000
#: Where each environment variable goes when its flag is not given.
ENVIRONMENT = {DATA_DIR_ENV: "data_dir", BLOB_ENV: "blob", STORE_ENV: "consensus"}


#: ``up``'s flag of every :class:`~shardsink.config.ClusterConfig` field (its
#: name, dashed; ``--config``'s keys): metavar, help, default in words, old spelling.
FLAGS: dict[str, Flag] = {
    "groups": Flag("G", "process groups of one builder and W workers each"),
    "workers": Flag("W", "workers per group"),
    "mode": Flag(None, "off: every worker writes its own batch; best-effort: a worker joins "
                 "its group's shared batch while one is built; barrier: one shared batch per "
                 "group and interval"),
    "coalesce": Flag(None, "where best-effort and barrier build shared batches: one builder "
                     "per group, or the group builders hand their rows to one host builder that "
                     "writes one part per host and interval"),
    "shared_max_bytes": Flag("SIZE|auto", "a worker staging more than this many bytes writes "
                             "its own batch; 0: never share; auto: tuned every interval from the "
                             "builders' lag against the workers' own write time"),
    "blob_target_bytes": Flag("SIZE", "a builder cuts a Parquet part at this size"),
    "best_effort_linger_ms": Flag("MS", "best-effort: hold a shared batch this long for "
                                  "workers of the group that have not joined it yet; 0: hand it "
                                  "off at once", old="--linger-ms"),
    "message_part_max_bytes": Flag("SIZE", "a part up to this size travels inside the "
                                   "worker's message, a larger one through shared memory; 0: "
                                   "always shared memory", old="--inline-max-bytes"),
    "workload": Flag("NAME|PATH.py:NAME|MODULE:NAME", "what the workers write: trickle, "
                     "churn, hydrate, synth, or a workload of your own (docs/workloads.md); a "
                     "class gets the [workload] table of --config as keyword arguments"),
    "rows_per_interval": Flag("R", "rows of each interval"),
    "snapshot_rows": Flag("S", "hydrate's interval-0 rows",
                          default=f"{HYDRATE_SNAPSHOT_ROWS} for hydrate, 0 otherwise"),
    "intervals": Flag("N", "intervals to append from the shard's upper on"),
    "interval_ms": Flag("T", "interval length in the shard's time unit"),
    "pace": Flag(None, "realtime: mint each interval when it closes; max: as fast as appends go"),
    "rate": Flag("N", "open loop: N intervals a second, each due on schedule whatever happened "
                 "before, its latency counted from when it was due (pace is then not used)",
                 default="none: --pace decides"),
    "listen": Flag(None, "time each interval end to end: from its first mint (its rows being "
                   "generated) to a reader's listen seeing it"),
    "data_dir": Flag("D", "made 0700 if new; its lock is held while the cluster serves its "
                     "stores", default=f"${DATA_DIR_ENV}, else ./shardsink-data"),
    "blob": Flag("URI", "the blob store", default=f"${BLOB_ENV}, else file://D/blob"),
    "consensus": Flag("URI", "a store to serve or a running server's address (tcp://..., "
                      "ipc://...)", default=f"${STORE_ENV}, else sqlite:///D/consensus.db"),
    "shard": Flag("NAME", "the shard's name (a workload of several shards names its own)"),
    "consensus_bind": Flag("ADDR", "where the cluster's consensus process listens (ipc://... "
                           "or tcp://127.0.0.1:PORT)", default="a fresh ipc socket per run"),
    "coordinator_bind": Flag("ADDR", "where the coordinator listens for its builders and "
                             "workers: tcp://127.0.0.1:PORT (0: a free port), secured with "
                             "CURVE keys made per run", default="an ipc socket in the run "
                             "directory"),
    "hosts": Flag("local|ray:ADDRESS|netns:N", "where the groups run: this machine; --groups "
                  "groups on each node of the Ray cluster at ADDRESS (auto, or HOST:PORT); or on "
                  "each of N hosts emulated here (root; --consensus postgresql and --blob s3 run "
                  "those stores on their hosts; docs/operating.md)"),
    "blob_shared": Flag(None, "the file:// blob directory is the same on every host (a shared "
                        "mount, or one machine); needed for file:// with more than one host"),
    "max_hosts": Flag("N", "use at most N of the Ray cluster's nodes (0: all)"),
    "host_timeout_s": Flag("S", "a host whose agent has not answered for S seconds is gone; "
                           "its groups run on the others"),
    "host_lost": Flag(None, "a lost host's groups move to the other hosts until a node takes its "
                      "place, or wait for that node"),
    "start": Flag(None, "how children start: fork from a zygote that has imported what they "
                  "need, or spawn fresh interpreters"),
    "seed": Flag("X", "drives the run's random choices"),
    "start_timeout_s": Flag("S", "a group or the consensus process not up within S seconds "
                            "fails the start"),
    "interval_timeout_s": Flag("S", "a group that has not reported an interval within S "
                               "seconds is restarted", old="--interval-timeout"),
    "consensus_timeout_s": Flag("S", "wait this long for one consensus request"),
    "append_retry_s": Flag("S", "an append whose outcome is unknown is retried with its token "
                           "for S seconds", old="--append-retry"),
    "max_restarts": Flag("N", "group restarts (and attempts of one interval) before the run "
                         "fails"),
    "retain": Flag("T", "the consensus process keeps since this far behind the upper, in the "
                   "shard's time unit; 0: off", default=f"{ShardConfig().retain}: an hour of "
                   "milliseconds"),
    "writer_lease_ms": Flag("MS", "the consensus process expires a writer not seen for MS (at "
                            "least 1.5x --append-retry-s)",
                            default=f"{ShardConfig().writer_lease_ms}, 15 minutes"),
    "metrics_port": Flag("P", "serve Prometheus metrics at http://127.0.0.1:P/metrics while "
                         "the cluster runs; 0: a free port"),
    "dashboard": Flag("HOST:PORT", "serve a live dashboard (processes, rates, latency, parts "
                      "per append, restarts) at http://HOST:PORT/ while the cluster runs; "
                      f"loopback only; without HOST:PORT {FREE_PORT}, a free port",
                      const=FREE_PORT),
    "verify": Flag(None, "read the shard back after the run and check it against the "
                   "digests it was written with and the workload's expected collection, if it "
                   "has one"),
}  # fmt: skip


def register(commands) -> None:
    from ..config import ClusterConfig

    up = commands.add_parser(
        "up",
        help="run a cluster until its workload is done",
        description="Run a cluster in the foreground: a consensus process and GROUPS "
        "process groups of one builder and WORKERS workers each, writing WORKLOAD into a "
        "shard, one interval at a time. With no options: a small trickle on SQLite and "
        "local files under ./shardsink-data. Ctrl-C stops cleanly; running again on the "
        "same data dir continues from the shard's upper. Settings come from the flags "
        "given, then the environment, then --config FILE, then the defaults shown.",
    )
    example = 'groups = 2, mode = "barrier", shared_max_bytes = "1MiB"'
    add_options(up, ClusterConfig, FLAGS, example)
    up.add_argument(
        "--events",
        type=argparse.FileType("a"),
        default=None,
        metavar="FILE",
        help="append one JSON line per appended interval to FILE, flushed as it happens: "
        "kind 'append', the coordinator's pid, when it was appended (time, seconds since the "
        "epoch), the interval's figures (interval, attempt, rows, latency_ms, "
        "parts_by_host, ...), host_addresses (each host index's node address on a Ray "
        "cluster's hosts), the supervision counts so far (restarts, consensus_restarts, "
        "abandoned_attempts) and restart_s, the durations of the group restarts since the "
        "previous line; and a line of kind 'supervision' (pid, time, counts) whenever the "
        "counts change between appends (default: none)",
    )
    up.add_argument(
        "--place",
        type=placement,
        metavar="ROLE=HOST,...",
        help=PLACE_HELP,
    )
    up.add_argument("--json", action="store_true", default=False, help="print the summary as JSON")
    up.add_argument(
        "-v", "--verbose", action="store_true", default=False, help="log supervision events"
    )
    up.set_defaults(func=_up)
    _register_control(commands, ClusterConfig().data_dir)


def _register_control(commands, data_dir: str) -> None:
    """``status``, ``stop`` and ``logs``, each given ``--data-dir``."""
    from ..cluster import TIMEOUT_S

    status = commands.add_parser(
        "status",
        help="show the cluster running on a data dir",
        description="Ask the coordinator of the cluster running on the data dir (its lock "
        "names the control socket) for its shape, mode, upper, rates, latency over the last "
        "minute, per-append costs, restarts and processes. Exit 1 if no cluster runs there.",
    )
    stop = commands.add_parser(
        "stop",
        help="stop the cluster running on a data dir, as Ctrl-C does",
        description="Ask the coordinator of the cluster running on the data dir to stop as "
        "Ctrl-C does (the interval in flight is abandoned, every process stopped, the "
        "summary printed by up) and wait until it has exited. Exit 1 if no cluster runs "
        "there or it has not exited within the timeout.",
    )
    for parser in (status, stop, _logs.register(commands)):
        parser.add_argument(
            "--data-dir",
            default=os.environ.get(DATA_DIR_ENV) or data_dir,
            metavar="D",
            help=f"default ${DATA_DIR_ENV}, else {data_dir}",
        )
    status.add_argument(
        "--timeout",
        type=float,
        default=TIMEOUT_S,
        metavar="S",
        help=f"wait this long for the answer (default {TIMEOUT_S:g})",
    )
    status.add_argument(
        "--json", action="store_true", help="print the status as JSON (with --watch: one line each)"
    )
    status.add_argument(
        "--watch",
        nargs="?",
        type=float,
        const=WATCH_EVERY_S,
        default=None,
        metavar="S",
        help=f"ask again every S seconds (default {WATCH_EVERY_S:g} when given without S) "
        "until the cluster ends or Ctrl-C: a live view, or JSON lines with --json "
        "(default: ask once)",
    )
    status.set_defaults(func=_status)
    stop.add_argument(
        "--timeout",
        type=float,
        default=STOP_TIMEOUT_S,
        metavar="S",
        help=f"wait this long for the cluster to exit (default {STOP_TIMEOUT_S:g})",
    )
    stop.set_defaults(func=_stop)


def config_of(args: argparse.Namespace):
    """The ClusterConfig ``up`` runs with the parsed ``args``.

    Each field comes from its flag if given, else its environment variable
    (:data:`ENVIRONMENT`), else ``--config``'s file, else the default. Raises
    ``ValueError`` naming the key for an unknown key or a bad value, and the
    file if it is the file's (the file alone must make a valid config).
    """
    from ..config import ClusterConfig

    fields = layered(ClusterConfig, args.config, vars(args), ENVIRONMENT)
    if "snapshot_rows" not in fields and fields.get("workload") == "hydrate":
        fields["snapshot_rows"] = HYDRATE_SNAPSHOT_ROWS
    return build(ClusterConfig, fields, source="up")


def _up(args: argparse.Namespace) -> int:
    from setproctitle import setproctitle

    from ..config import emulated_hosts

    config = config_of(args)
    if emulated_hosts(config.hosts):
        return _up_emulated(args, config)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(message)s",
    )
    setproctitle("shardsink coordinator")
    # With --json the summary is alone on stdout whatever a child or library
    # prints meanwhile (Ray's driver prints a dead raylet's words to
    # sys.stdout): the command line pointed fd 1 at stderr and gave
    # sys.stdout the real one (cli._output.document_stdout); Python's prints
    # go to stderr too until the summary is written.
    document = sys.stdout
    with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
        ran = _run_cluster(args, config)
        if isinstance(ran, int):
            return ran
        cluster, stats, interrupted = ran
        if args.json:
            print(msgspec.json.encode(stats).decode(), file=document, flush=True)
        else:
            table_console().print(summary_table(stats))
        if stats.restarts or stats.consensus_restarts or stats.verified is False:
            _name_logs(cluster, config.data_path)
    if interrupted:
        return 130
    return 0 if stats.verified in (True, None) else 1


def _run_cluster(args: argparse.Namespace, config):
    """Start, run and close the cluster of ``config``: ``(cluster, stats,
    interrupted)``, or the exit status if it failed (1) or was stopped while
    it started (130 for Ctrl-C, 143 for SIGTERM: nothing ran). Ctrl-C and
    SIGTERM stop it at any moment of its start, which then kills what it
    started; later they stop it cleanly (:class:`_TermHandler`)."""
    from rich.console import Console

    from ..cluster import Cluster, ClusterError, StopRequested

    console = Console(stderr=True)
    interrupted = False
    term = _TermHandler()
    cluster = Cluster(config)
    try:
        with term:
            try:
                with term.raising():
                    cluster.start()
            except (KeyboardInterrupt, StopRequested) as exc:
                stopped = isinstance(exc, KeyboardInterrupt)
                console.print(f"{'interrupted' if stopped else exc} while starting: stopped")
                return 130 if stopped else 128 + signal.SIGTERM
            term.reclaim()
            try:
                _announce(cluster, config, console)
                try:
                    with term.raising():
                        _run(cluster, config.intervals, console, args.events)
                except (KeyboardInterrupt, StopRequested) as exc:
                    interrupted = isinstance(exc, KeyboardInterrupt)  # a requested stop exits 0
                    console.print(f"{'interrupted' if interrupted else exc}: stopping cleanly")
                    if config.verify:  # what was appended before the interrupt
                        cluster.verify()
                stats = cluster.stats()
            finally:
                cluster.close()
    except ClusterError as exc:
        print(f"shardsink up: error: {exc}", file=sys.stderr)
        _name_logs(cluster, config.data_path)
        return 1
    return cluster, stats, interrupted


#: The fields the emulated hosts set for the coordinator they run
#: (:meth:`~shardsink.testing.emulated.EmulatedCluster.coordinator_flags`,
#: the blob in its environment).
EMULATED_SET = ("hosts", "coordinator_bind", "consensus", "consensus_bind", "blob", "blob_shared")


def _up_emulated(args: argparse.Namespace, config) -> int:
    """``up --hosts netns:N``: make the emulated hosts, run ``up`` with
    ``config`` on the coordinator's host (:func:`_coordinator`) and remove
    them; its exit status, 130 or 143 if Ctrl-C or SIGTERM came while the
    hosts started, 1 if they did not (the service, its host and its log's
    end named), 2 if this machine cannot emulate hosts (one line naming what
    is missing). The first Ctrl-C or SIGTERM while the hosts start or close
    stops the start, and no later one cuts their removal short."""
    from ..cluster import StopRequested
    from ..config import EMULATED_BLOB, EMULATED_STORE, emulated_hosts
    from ..netns import MissingCapability, NetnsError
    from ..testing.emulated import EmulatedCluster

    began, stop = time.monotonic(), _StopOnce()
    handlers = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        emulated = EmulatedCluster(
            emulated_hosts(config.hosts),
            data_dir=config.data_path,
            place=config.place,
            postgres=config.consensus == EMULATED_STORE,
            s3=config.blob == EMULATED_BLOB,
            store=None if config.consensus == EMULATED_STORE else config.consensus,
            blob=None if config.blob == EMULATED_BLOB else config.blob,
            consensus_args=_serve_flags(config),
            run="up",
            timeout_s=config.start_timeout_s,
        )
        with emulated:
            stop.check()
            _describe(emulated, time.monotonic() - began)
            return _coordinator(emulated, args, config)
    except MissingCapability as exc:
        print(f"shardsink up: error: cannot emulate hosts: {exc}", file=sys.stderr)
        return 2
    except NetnsError as exc:
        print(f"shardsink up: error: emulated hosts: {exc}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, StopRequested) as exc:
        what = str(exc) or "interrupted"
        print(f"shardsink up: {what} while the emulated hosts started: stopped", file=sys.stderr)
        return 130 if isinstance(exc, KeyboardInterrupt) else 128 + signal.SIGTERM
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


class _StopOnce:
    """The handler of Ctrl-C and SIGTERM while the emulated hosts start: the
    first stops what runs (``KeyboardInterrupt``, ``StopRequested``) and is
    kept, since what it interrupted may have swallowed it (a fork's at-fork
    hook did) and :meth:`check` raises it again; later ones are ignored, so
    that the clean-up it starts is not cut short."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def __call__(self, signum: int, frame: object) -> None:
        if self.signum is None:
            self.signum = signum
            self.check()

    def check(self) -> None:
        from ..cluster import StopRequested

        if self.signum == signal.SIGINT:
            raise KeyboardInterrupt
        if self.signum is not None:
            raise StopRequested("SIGTERM")


def _serve_flags(config) -> list[str]:
    """``consensus serve``'s flags for what a cluster's own consensus process
    takes from ``config``."""
    return ["--retain", str(config.retain), "--writer-lease-ms", str(config.writer_lease_ms)]


def _describe(emulated, started_s: float) -> None:
    """Say on stderr which host runs what, where, and how to sweep after a crash."""
    hosts = "; ".join(f"{h.name} {h.address} {', '.join(h.roles)}" for h in emulated.hosts())
    print(
        f"emulated hosts {emulated.network.name} up in {started_s:.1f}s: {hosts}; consensus at "
        f"{emulated.consensus_address}; if this process is killed, `shardsink hosts sweep` "
        "removes them",
        file=sys.stderr,
        flush=True,
    )


def _coordinator(emulated, args: argparse.Namespace, config) -> int:
    """Run ``up`` on the coordinator's host with ``config``'s flags (the
    emulated hosts' in place of theirs), its output this process's; forward
    SIGINT and SIGTERM to it, and give it :data:`STOP_TIMEOUT_S` after one
    before it is stopped (SIGTERM to its group, then SIGKILL); ignore both
    once it has exited. Its exit status (128 + N for signal N)."""
    argv = [sys.executable, "-m", "shardsink.cli", "up", *_inner_flags(args, config)]
    argv += emulated.coordinator_flags()
    argv += ["--json"] * args.json + ["--verbose"] * args.verbose
    if args.events is not None:
        argv += ["--events", os.path.abspath(args.events.name)]
    sys.stdout.flush()  # the coordinator writes the document (--json) to this stdout too
    proc = emulated.popen_on(
        emulated.place.coordinator, argv, env=emulated.coordinator_env(), stdout=sys.stdout
    )
    deadline = None

    def forward(signum: int, frame: object) -> None:
        nonlocal deadline
        proc.send_signal(signum)
        deadline = deadline or time.monotonic() + STOP_TIMEOUT_S

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, forward)
    try:
        while proc.poll() is None and (deadline is None or time.monotonic() < deadline):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(STOP_POLL_S * 10)
    finally:  # the hosts close next: nothing cuts that short
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
    status = emulated.stop(proc)
    return 128 - status if status < 0 else status


def _inner_flags(args: argparse.Namespace, config) -> list[str]:
    """``up``'s flags for ``config`` but :data:`EMULATED_SET`: with
    ``--config`` that file (for its tables) and a flag for every value, the
    file's overridden; else a flag for each value not the default."""
    default = type(config)()
    flags = ["--config", str(args.config)] if args.config else []
    for name in FLAGS:
        value = getattr(config, name)
        if name in EMULATED_SET or value is None:
            continue
        if not args.config and value == getattr(default, name):
            continue
        flag = flag_of(name)
        if isinstance(value, bool):
            flags.append(flag if value else f"--no-{flag[2:]}")
        else:
            flags += [flag, str(value)]
    return flags


def _shards_words(cluster) -> str:
    """``shard 'default'``, or ``shards orders, lines`` of a workload of several."""
    names = list(cluster.schemas)
    return f"shard {names[0]!r}" if len(names) == 1 else f"shards {', '.join(names)}"


def _announce(cluster, config, console) -> None:
    """``up``'s first two lines: the cluster, then its pid, addresses and
    how to stop it."""
    upper = cluster.shard.state(refresh=False).upper  # as the start read it
    console.print(
        f"cluster {cluster.cluster_id}: {config.groups}x{config.workers} {config.mode}"
        f"{host_words(config)}, {config.workload}, {_shards_words(cluster)} from upper {upper}, "
        f"started in {cluster.startup_s:.2f}s ({config.start})",
        soft_wrap=True,
    )
    console.print(
        f"coordinator pid {os.getpid()}, data dir {config.data_path}, consensus at "
        f"{cluster.shard_address}"
        + (f", metrics at {cluster.metrics.url}" if cluster.metrics else "")
        + (f", dashboard at {cluster.dashboard.url}" if cluster.dashboard else "")
        + "; "
        + (
            f"status: shardsink status --data-dir {config.data_path}; stop: Ctrl-C "
            f"or shardsink stop --data-dir {config.data_path}"
            if cluster.holds_data_dir
            else "stop: Ctrl-C"
        ),
        soft_wrap=True,
    )


def _name_logs(cluster, data_dir: str) -> None:
    """Say where the run's logs are kept, after something failed."""
    if cluster.logs is not None:
        print(
            f"shardsink up: the processes' logs are in {cluster.logs}; "
            f"shardsink logs --data-dir {data_dir} shows them",
            file=sys.stderr,
        )


class _TermHandler:
    """SIGTERM stops ``up`` as Ctrl-C does: inside :meth:`raising` (the start,
    the run) it raises :class:`~shardsink.cluster.control.StopRequested` at
    once; outside (closing, reading back) and after the first it is held and
    raised on entering ``raising``, so cleanup is never cut short."""

    def __init__(self) -> None:
        self._pending = False
        self._raising = False
        self._previous = None

    def __enter__(self) -> _TermHandler:
        self._previous = signal.signal(signal.SIGTERM, self._on_term)
        return self

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGTERM, self._previous)

    def reclaim(self) -> None:
        """Take SIGTERM back from what took it meanwhile: ``ray.init``, in a
        cluster on Ray's nodes, makes it ``sys.exit(15)``, which stopped
        ``up`` without its summary."""
        signal.signal(signal.SIGTERM, self._on_term)

    def _on_term(self, signum: int, frame: object) -> None:
        self._pending = True
        if self._raising:
            self._stop()

    def _stop(self) -> None:
        from ..cluster import StopRequested

        self._raising = False
        raise StopRequested("SIGTERM")

    @contextlib.contextmanager
    def raising(self):
        self._raising = True
        try:
            if self._pending:
                self._stop()
            yield
        finally:
            self._raising = False


def _status(args: argparse.Namespace) -> int:

    from ..cluster import ControlError, StatusRequest, find, request

    try:
        holder = find(args.data_dir)
        status = request(holder, StatusRequest(), timeout_s=args.timeout)
    except ControlError as exc:
        print(f"shardsink status: {exc}", file=sys.stderr)
        return 1
    if args.watch is not None:
        return _watch(args, holder, status)
    if args.json:
        print(msgspec.json.encode(status).decode())
    else:
        table_console().print(*status_tables(status))
    return 0


def _watch(args: argparse.Namespace, holder, status) -> int:
    """``status --watch``: show ``status``, then ask again every ``args.watch``
    seconds until the coordinator exits (exit 0, saying so) or Ctrl-C (exit 0)."""
    from rich.console import Group
    from rich.live import Live

    from ..cluster import ControlError, StatusRequest, request

    with contextlib.ExitStack() as stack:
        live = None if args.json else stack.enter_context(Live(auto_refresh=False))
        try:
            while True:
                if live is None:
                    print(msgspec.json.encode(status).decode(), flush=True)
                else:
                    live.update(Group(*status_tables(status)), refresh=True)
                time.sleep(args.watch)
                if not holder.alive():
                    break
                try:
                    status = request(holder, StatusRequest(), timeout_s=args.timeout)
                except ControlError:
                    if holder.alive():  # alive but silent: say so rather than wait forever
                        raise
                    break
        except KeyboardInterrupt:
            return 0
        except ControlError as exc:
            print(f"shardsink status: {exc}", file=sys.stderr)
            return 1
    print(
        f"shardsink status: the cluster of coordinator pid {holder.pid} has ended", file=sys.stderr
    )
    return 0


def _stop(args: argparse.Namespace) -> int:
    from ..cluster import ControlError, StopRequest, find, request

    try:
        holder = find(args.data_dir)
        request(holder, StopRequest(), timeout_s=min(args.timeout, 5.0))
    except ControlError as exc:
        print(f"shardsink stop: {exc}", file=sys.stderr)
        return 1
    deadline = time.monotonic() + args.timeout
    while holder.alive():  # not a child of ours: polled (and a zombie counts as gone)
        if time.monotonic() > deadline:
            print(
                f"shardsink stop: coordinator pid {holder.pid} is stopping but has not "
                f"exited within {args.timeout:g} s",
                file=sys.stderr,
            )
            return 1
        time.sleep(STOP_POLL_S)
    print(f"stopped the cluster of coordinator pid {holder.pid}")
    return 0


def _run(cluster, intervals: int, console, events=None) -> None:
    timed = 0  # restarts whose times an earlier line carried
    lock = threading.Lock()  # the appends' lines and the supervision watch's
    last: dict = {}  # the supervision counts the last line carried

    def write(kind: str, fields: dict) -> None:
        # the monotonic clock too: a skewed host's wall clock (libfaketime)
        # leaves it alone, so a chaos timeline places the line where it was
        line = {
            "kind": kind,
            "coordinator": os.getpid(),
            "time": time.time(),
            "monotonic": time.monotonic(),
            **fields,
        }
        events.write(msgspec.json.encode(line).decode() + "\n")
        events.flush()
        last.update(msgspec.structs.asdict(cluster.supervision()))

    def record(rec) -> None:
        nonlocal timed
        if events is not None:
            with lock:
                restart_s = cluster.restart_times(timed)
                timed += len(restart_s)
                supervision = msgspec.structs.asdict(cluster.supervision())
                fields = {**msgspec.structs.asdict(rec), **supervision, "restart_s": restart_s}
                # which machine each host index of parts_by_host is, on Ray's hosts
                fields["host_addresses"] = {h.index: h.address for h in cluster.hosts()}
                write("append", fields)

    def watch(stop: threading.Event) -> None:
        # restarts between appends: a run that never appends still shows them
        while not stop.wait(SUPERVISION_POLL_S):
            with lock:
                counts = msgspec.structs.asdict(cluster.supervision())
                if counts != last:
                    write("supervision", counts)

    stop = threading.Event()
    watcher = threading.Thread(target=watch, args=(stop,), name="supervision-events")
    if events is not None:
        last.update(msgspec.structs.asdict(cluster.supervision()))
        watcher.start()
    try:
        _run_shown(cluster, intervals, console, record)
    finally:
        stop.set()
        if watcher.is_alive():
            watcher.join(5)


def _run_shown(cluster, intervals: int, console, record) -> None:
    """``cluster.run(intervals)``, calling ``record`` per append, with a
    progress bar for a long run."""
    if intervals < PROGRESS_MIN_INTERVALS:
        cluster.run(intervals, on_append=record)
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task("intervals", total=intervals)

        def advance(rec) -> None:
            record(rec)
            progress.update(
                task,
                advance=1,
                description=f"interval {rec.interval} ({rec.latency_ms:.0f} ms)",
            )

        cluster.run(intervals, on_append=advance)
