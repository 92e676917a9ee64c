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

import msgspec

from ..storage.uri import BLOB_ENV, STORE_ENV

#: Runs with at least this many intervals get a progress bar.
PROGRESS_MIN_INTERVALS = 10


def register(commands, bench) -> None:
    from ..config import MIB, MODES, STARTS, WORKLOADS, ClusterConfig

    d = ClusterConfig()
    up = commands.add_parser(
        "up",
        help="run a cluster until its workload is done",
        description="Run a cluster in the foreground: a consensus process and GROUPS "
        "process groups of one builder and WORKERS workers each, writing WORKLOAD into a "
        "shard, one interval at a time. With no options: a small trickle on SQLite and "
        "local files under ./shardsink-data. Ctrl-C stops cleanly; running again on the "
        "same data dir continues from the shard's upper.",
    )
    up.add_argument("--groups", type=int, default=d.groups, metavar="G", help=f"default {d.groups}")
    up.add_argument(
        "--workers",
        type=int,
        default=d.workers,
        metavar="W",
        help=f"per group (default {d.workers})",
    )
    up.add_argument("--mode", default=d.mode, help=f"{' | '.join(MODES)} (default {d.mode})")
    up.add_argument(
        "--shared-max-bytes",
        type=int,
        default=d.shared_max_bytes,
        metavar="B",
        help="a worker staging more than this many bytes writes its own batch; 0: never "
        f"share (default {d.shared_max_bytes // MIB} MiB)",
    )
    up.add_argument(
        "--linger-ms",
        type=int,
        default=d.best_effort_linger_ms,
        metavar="MS",
        help="best-effort: hold a shared batch this long for workers of the group that have "
        f"not joined it yet; 0: hand it off at once (default {d.best_effort_linger_ms})",
    )
    up.add_argument(
        "--workload", default=d.workload, help=f"{' | '.join(WORKLOADS)} (default {d.workload})"
    )
    up.add_argument(
        "--rows-per-interval",
        type=int,
        default=d.rows_per_interval,
        metavar="R",
        help=f"default {d.rows_per_interval}",
    )
    up.add_argument(
        "--snapshot-rows",
        type=int,
        default=None,
        metavar="S",
        help="hydrate's interval-0 rows (default 100000 for hydrate)",
    )
    up.add_argument(
        "--intervals",
        type=int,
        default=d.intervals,
        metavar="N",
        help=f"intervals to append from the shard's upper on (default {d.intervals})",
    )
    up.add_argument(
        "--interval-ms",
        type=int,
        default=d.interval_ms,
        metavar="T",
        help=f"default {d.interval_ms}",
    )
    up.add_argument(
        "--pace",
        default=d.pace,
        help=f"realtime: mint each interval when it closes; max: as fast as appends go "
        f"(default {d.pace})",
    )
    up.add_argument(
        "--data-dir",
        default=d.data_dir,
        metavar="D",
        help=f"made 0700 if new; its lock is held while the cluster serves its stores "
        f"(default {d.data_dir})",
    )
    up.add_argument(
        "--blob",
        metavar="URI",
        default=os.environ.get(BLOB_ENV),
        help=f"default: ${BLOB_ENV}, else file://D/blob",
    )
    up.add_argument(
        "--consensus",
        metavar="URI",
        default=os.environ.get(STORE_ENV),
        help="a store to serve (default sqlite:///D/consensus.db) or a running "
        "server's address (tcp://..., ipc://...)",
    )
    up.add_argument("--shard", default=d.shard, metavar="NAME", help=f"default {d.shard!r}")
    up.add_argument(
        "--consensus-bind",
        metavar="ADDR",
        help="where the cluster's consensus process listens (ipc://... or tcp://127.0.0.1:PORT; "
        "default: a fresh ipc socket per run)",
    )
    up.add_argument(
        "--interval-timeout",
        type=float,
        default=d.interval_timeout_s,
        metavar="S",
        help=f"a group that has not reported an interval within S seconds is restarted "
        f"(default {d.interval_timeout_s:g})",
    )
    up.add_argument(
        "--max-restarts",
        type=int,
        default=d.max_restarts,
        metavar="N",
        help=f"group restarts (and attempts of one interval) before the run fails "
        f"(default {d.max_restarts})",
    )
    up.add_argument(
        "--events",
        type=argparse.FileType("a"),
        metavar="FILE",
        help="append one JSON line per appended interval to FILE, flushed as it happens: "
        "the coordinator's pid, the interval's figures (interval, attempt, rows, latency_ms, "
        "...) and the supervision counts so far (restarts, consensus_restarts, "
        "abandoned_attempts)",
    )
    up.add_argument(
        "--start",
        choices=STARTS,
        default=d.start,
        help="how children start: fork from a zygote that has imported what they need, "
        f"or spawn fresh interpreters (default {d.start})",
    )
    up.add_argument(
        "--seed", type=int, default=d.seed, metavar="X", help="drives the run's random choices"
    )
    up.add_argument("--no-verify", action="store_true", help="do not read the shard back")
    up.add_argument("--json", action="store_true", help="print the summary as JSON")
    up.add_argument("-v", "--verbose", action="store_true", help="log supervision events")
    up.set_defaults(func=_up)


def _config(args: argparse.Namespace):
    from ..config import ClusterConfig

    snapshot = args.snapshot_rows
    if snapshot is None:
        snapshot = 100_000 if args.workload == "hydrate" else 0
    return ClusterConfig(
        groups=args.groups,
        workers=args.workers,
        mode=args.mode,
        shared_max_bytes=args.shared_max_bytes,
        best_effort_linger_ms=args.linger_ms,
        workload=args.workload,
        rows_per_interval=args.rows_per_interval,
        snapshot_rows=snapshot,
        intervals=args.intervals,
        interval_ms=args.interval_ms,
        pace=args.pace,
        data_dir=args.data_dir,
        blob=args.blob,
        consensus=args.consensus,
        shard=args.shard,
        consensus_bind=args.consensus_bind,
        interval_timeout_s=args.interval_timeout,
        max_restarts=args.max_restarts,
        start=args.start,
        seed=args.seed,
        verify=not args.no_verify,
    )


def _up(args: argparse.Namespace) -> int:
    from rich.console import Console
    from setproctitle import setproctitle

    from .cluster import Cluster, ClusterError

    config = _config(args)
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
