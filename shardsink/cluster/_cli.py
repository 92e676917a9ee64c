"""``shardsink up``: run a cluster in the foreground until its workload is done.

Ctrl-C stops it cleanly: the interval in flight is abandoned (the shard holds
whole intervals only), every process is stopped and every shared-memory
segment unlinked, and the summary covers what was appended. Running it again
on the same data dir continues from the shard's upper.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

import msgspec

from ..datadir import DATA_DIR_ENV
from ..storage.uri import BLOB_ENV, STORE_ENV

#: Runs with at least this many intervals get a progress bar.
PROGRESS_MIN_INTERVALS = 10


def register(commands, bench) -> None:
    from ..config import MODES, PACES, STARTS, WORKLOADS, ClusterConfig, format_size

    d = ClusterConfig()
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
    # Flags default to SUPPRESS so that only those given override --config;
    # each dest is the ClusterConfig field it sets.
    up.argument_default = argparse.SUPPRESS
    up.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE.toml",
        help='ClusterConfig fields as TOML keys (groups = 2, mode = "barrier", '
        'shared_max_bytes = "1MiB", ...); an unknown key or a bad value is refused',
    )
    up.add_argument("--groups", type=int, metavar="G", help=f"default {d.groups}")
    up.add_argument("--workers", type=int, metavar="W", help=f"per group (default {d.workers})")
    up.add_argument("--mode", help=f"{' | '.join(MODES)} (default {d.mode})")
    up.add_argument(
        "--shared-max-bytes",
        type=_size,
        metavar="SIZE",
        help="a worker staging more than this many bytes writes its own batch; 0: never "
        f"share (default {format_size(d.shared_max_bytes)})",
    )
    up.add_argument(
        "--linger-ms",
        dest="best_effort_linger_ms",
        type=int,
        metavar="MS",
        help="best-effort: hold a shared batch this long for workers of the group that have "
        f"not joined it yet; 0: hand it off at once (default {d.best_effort_linger_ms})",
    )
    up.add_argument(
        "--blob-target-bytes",
        type=_size,
        metavar="SIZE",
        help=f"a builder cuts a Parquet part at this size (default "
        f"{format_size(d.blob_target_bytes)})",
    )
    up.add_argument(
        "--inline-max-bytes",
        dest="transport_inline_max_bytes",
        type=_size,
        metavar="SIZE",
        help="a part up to this size travels inside the worker's message, a larger one "
        f"through shared memory; 0: always shared memory (default "
        f"{format_size(d.transport_inline_max_bytes)})",
    )
    up.add_argument("--workload", help=f"{' | '.join(WORKLOADS)} (default {d.workload})")
    up.add_argument(
        "--rows-per-interval", type=int, metavar="R", help=f"default {d.rows_per_interval}"
    )
    up.add_argument(
        "--snapshot-rows",
        type=int,
        metavar="S",
        help=f"hydrate's interval-0 rows (default {HYDRATE_SNAPSHOT_ROWS} for hydrate, "
        f"{d.snapshot_rows} otherwise)",
    )
    up.add_argument(
        "--intervals",
        type=int,
        metavar="N",
        help=f"intervals to append from the shard's upper on (default {d.intervals})",
    )
    up.add_argument("--interval-ms", type=int, metavar="T", help=f"default {d.interval_ms}")
    up.add_argument(
        "--pace",
        help=f"{' | '.join(PACES)}; realtime: mint each interval when it closes; max: as fast "
        f"as appends go (default {d.pace})",
    )
    up.add_argument(
        "--data-dir",
        metavar="D",
        help=f"made 0700 if new; its lock is held while the cluster serves its stores "
        f"(default ${DATA_DIR_ENV}, else {d.data_dir})",
    )
    up.add_argument("--blob", metavar="URI", help=f"default ${BLOB_ENV}, else file://D/blob")
    up.add_argument(
        "--consensus",
        metavar="URI",
        help="a store to serve or a running server's address (tcp://..., ipc://...) "
        f"(default ${STORE_ENV}, else sqlite:///D/consensus.db)",
    )
    up.add_argument("--shard", metavar="NAME", help=f"default {d.shard!r}")
    up.add_argument(
        "--consensus-bind",
        metavar="ADDR",
        help="where the cluster's consensus process listens (ipc://... or tcp://127.0.0.1:PORT; "
        "default: a fresh ipc socket per run)",
    )
    up.add_argument(
        "--interval-timeout",
        dest="interval_timeout_s",
        type=float,
        metavar="S",
        help=f"a group that has not reported an interval within S seconds is restarted "
        f"(default {d.interval_timeout_s:g})",
    )
    up.add_argument(
        "--max-restarts",
        type=int,
        metavar="N",
        help=f"group restarts (and attempts of one interval) before the run fails "
        f"(default {d.max_restarts})",
    )
    up.add_argument(
        "--events",
        type=argparse.FileType("a"),
        default=None,
        metavar="FILE",
        help="append one JSON line per appended interval to FILE, flushed as it happens: "
        "the coordinator's pid, the interval's figures (interval, attempt, rows, latency_ms, "
        "...) and the supervision counts so far (restarts, consensus_restarts, "
        "abandoned_attempts) (default: none)",
    )
    up.add_argument(
        "--start",
        choices=STARTS,
        help="how children start: fork from a zygote that has imported what they need, "
        f"or spawn fresh interpreters (default {d.start})",
    )
    up.add_argument(
        "--seed", type=int, metavar="X", help=f"drives the run's random choices (default {d.seed})"
    )
    up.add_argument(
        "--no-verify",
        dest="verify",
        action="store_false",
        help="do not read the shard back (default: read it back and compare)",
    )
    up.add_argument("--json", action="store_true", default=False, help="print the summary as JSON")
    up.add_argument(
        "-v", "--verbose", action="store_true", default=False, help="log supervision events"
    )
    up.set_defaults(func=_up)


#: hydrate's interval-0 rows when neither a flag nor the config file sets them.
HYDRATE_SNAPSHOT_ROWS = 100_000
#: Where each environment variable goes when its flag is not given.
ENVIRONMENT = {DATA_DIR_ENV: "data_dir", BLOB_ENV: "blob", STORE_ENV: "consensus"}


def _size(text: str) -> int:
    from ..config import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def config_of(args: argparse.Namespace):
    """The ClusterConfig ``up`` runs with the parsed ``args``.

    Each field comes from its flag if given, else its environment variable
    (:data:`ENVIRONMENT`), else ``--config``'s file, else the default. Raises
    ``ValueError`` naming the key for an unknown key or a bad value, and the
    file if it is the file's (the file alone must make a valid config).
    """
    from ..config import ClusterConfig, build, load_toml

    fields: dict = {}
    if args.config:
        fields = load_toml(args.config)
        build(ClusterConfig, fields, source=f"config file {os.fspath(args.config)!r}")
    fields.update({f: os.environ[v] for v, f in ENVIRONMENT.items() if os.environ.get(v)})
    fields.update({k: v for k, v in vars(args).items() if k in ClusterConfig.__struct_fields__})
    if "snapshot_rows" not in fields and fields.get("workload") == "hydrate":
        fields["snapshot_rows"] = HYDRATE_SNAPSHOT_ROWS
    return build(ClusterConfig, fields, source="up")


def _up(args: argparse.Namespace) -> int:
    from rich.console import Console
    from setproctitle import setproctitle

    from .cluster import Cluster, ClusterError

    config = config_of(args)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(message)s",
    )
    setproctitle("shardsink coordinator")
    console = Console(stderr=True)
    interrupted = False
    try:
        with Cluster(config) as cluster:
            console.print(
                f"cluster {cluster.cluster_id}: {config.groups}x{config.workers} {config.mode}, "
                f"{config.workload}, shard {config.shard!r} from upper {cluster.shard.upper}, "
                f"started in {cluster.startup_s:.2f}s ({config.start})"
            )
            try:
                _run(cluster, config.intervals, console, args.events)
            except KeyboardInterrupt:
                interrupted = True
                console.print("interrupted: stopping cleanly")
                if config.verify:  # what was appended before the interrupt
                    cluster.verify()
            stats = cluster.stats()
    except ClusterError as exc:
        print(f"shardsink up: error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(msgspec.json.encode(stats).decode())
    else:
        Console().print(summary_table(stats))
    if interrupted:
        return 130
    return 0 if stats.verified in (True, None) else 1


def _run(cluster, intervals: int, console, events=None) -> None:
    def record(rec) -> None:
        if events is not None:
            line = {
                "coordinator": os.getpid(),
                **msgspec.structs.asdict(rec),
                **msgspec.structs.asdict(cluster.supervision()),
            }
            events.write(msgspec.json.encode(line).decode() + "\n")
            events.flush()

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


def _restart_times(restart_s: list[float]) -> str:
    if not restart_s:
        return ""
    ordered = sorted(restart_s)
    return f" (median {ordered[len(ordered) // 2] * 1000:.0f} ms, max {ordered[-1] * 1000:.0f} ms)"


def summary_table(stats):
    """The end-of-run summary of ``stats`` as a rich table."""
    from rich.table import Table

    def mib(n: float) -> str:
        return f"{n / (1 << 20):.1f} MiB"

    verified = {True: "yes: equals the expected collection", False: "NO", None: "not checked"}
    rows = [
        ("shape", f"{stats.groups}x{stats.workers} {stats.mode}"),
        ("workload", f"{stats.workload} (R={stats.rows_per_interval}, S={stats.snapshot_rows})"),
        ("appends", f"{stats.appends} (upper {stats.upper})"),
        ("rows", f"{stats.rows} ({stats.rows_per_s:,.0f}/s over {stats.wall_s:.2f}s)"),
        ("data parts / append", f"{stats.data_parts_per_append:.2f}"),
        ("inline parts / append", f"{stats.inline_parts_per_append:.2f}"),
        ("inline bytes / append", f"{stats.inline_bytes_per_append:,.0f}"),
        ("blob PUTs", f"{stats.blob_puts} ({mib(stats.blob_put_bytes)})"),
        ("diff bytes / append", f"{stats.diff_bytes_per_append:,.0f}"),
        ("CaA calls / append", f"{stats.cas_per_append:.2f}"),
        (
            "latency p50 / p99",
            f"{stats.append_latency_ms_p50:.1f} / {stats.append_latency_ms_p99:.1f} ms",
        ),
        ("start-up", f"{stats.startup_s:.3f}s ({stats.start})"),
        (
            "restarts",
            f"{stats.restarts} groups{_restart_times(stats.restart_s)}, "
            f"{stats.consensus_restarts} consensus, "
            f"{stats.abandoned_attempts} attempts abandoned",
        ),
        (
            "peak RSS",
            ", ".join(f"{kind} {mib(n)}" for kind, n in sorted(stats.peak_rss.items())),
        ),
        (
            "verified",
            verified[stats.verified] + (f": {stats.verify_detail}" * bool(stats.verify_detail)),
        ),
    ]
    table = Table(title="shardsink up", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    for name, value in rows:
        table.add_row(name, value)
    return table
