"""``shardsink chaos``: a churn cluster under a seeded nemesis, then the checks."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from .._http import FREE_PORT
from ..chaos import FAULT_KINDS, ChaosConfig
from ..options import Flag, add_options, build, layered
from ._output import table_console
from .cluster import PLACE_HELP, placement

#: ``chaos``'s flag of every :class:`~.config.ChaosConfig` field (its name,
#: dashed; ``--config``'s keys): metavar, help, default in words, old spelling.
FLAGS: dict[str, Flag] = {
    "duration_s": Flag("S", "seconds of faults", old="--duration"),
    "seed": Flag("X", "seeds the fault schedule"),
    "data_dir": Flag("D", "a new or empty directory for the run",
                     default="a temporary one, kept only when a violation is found"),
    "blob": Flag("URI", "blob store; with --hosts netns:N, s3: a throwaway S3 server on its "
                 "host", default="file://D/data/blob"),
    "consensus": Flag("URI", "consensus store, e.g. postgresql://...; with --hosts netns:N, "
                      "postgresql: a throwaway server on its host",
                      default="sqlite:///D/data/consensus.db"),
    "groups": Flag("G", "process groups"),
    "workers": Flag("W", "workers per group"),
    "mode": Flag(None, "the cluster's --mode"),
    "coalesce": Flag(None, "the cluster's --coalesce"),
    "workload": Flag("NAME|PATH.py:NAME|MODULE:NAME", "the cluster's --workload; a class gets "
                     "the [workload] table of --config as keyword arguments"),
    "rows_per_interval": Flag("R", "rows of each interval of the workload"),
    "faults": Flag("KINDS", "comma-separated fault kinds", default=f"all: {','.join(FAULT_KINDS)}"),
    "mean_gap_s": Flag("S", "mean seconds between faults", old="--mean-gap"),
    "pause_max_s": Flag("S", "a pause lasts up to S seconds; below --interval-timeout-s"),
    "readers": Flag("N", "snapshot checkers"),
    "maintenance_every_s": Flag("S", "run `shard gc` by hand beside the cluster every S seconds"),
    "interval_timeout_s": Flag("S", "a group that has not reported within S seconds is "
                               "restarted"),
    "stall_s": Flag(
        "S",
        "no append for S seconds is a violation (the cluster is stuck; default: a quarter of "
        "the run, at least 3 interval timeouts, at most 120)",
    ),
    "min_intervals": Flag(
        "N", "fewer intervals appended than N: the verdict is unknown (exit 3), never valid"
    ),
    "dashboard": Flag("HOST:PORT", "serve the cluster's live dashboard, faults shown as they are "
                      f"injected, at http://HOST:PORT/; loopback only; without HOST:PORT "
                      f"{FREE_PORT}, a free port", const=FREE_PORT),
    "writer_lease_ms": Flag("MS", "the consensus process's writer lease; a coordinator retries "
                            "an append for two thirds of it"),
    "hosts": Flag("local|ray:ADDRESS|netns:N", "the cluster's --hosts: with ray:ADDRESS, "
                  "--groups groups on each node of that Ray cluster, whose nodes run on this "
                  "machine (the faults kill-host and pause-host need it); with netns:N, N "
                  "emulated hosts the run makes (root), a Ray node on each, the consensus "
                  "server and the stores on hosts of their own (--place); the network faults "
                  "need them"),
    "blob_shared": Flag(None, "the cluster's --blob-shared"),
    "max_hosts": Flag("N", "the cluster's --max-hosts"),
    "host_timeout_s": Flag("S", "the cluster's --host-timeout-s"),
    "host_lost": Flag(None, "the cluster's --host-lost"),
    "network_max_s": Flag("S", "a network fault (--hosts netns:N) lasts 1 to S seconds, then "
                          "heals"),
}  # fmt: skip


def register(commands) -> None:
    chaos = commands.add_parser(
        "chaos",
        help="run a cluster under injected faults and check that nothing is lost",
        description="Run a workload (churn unless --workload names another) for DURATION "
        "seconds while a nemesis, seeded by "
        "SEED, kills and pauses the cluster's processes and makes its stores fail; readers "
        "check snapshots throughout. Then check that the shard holds what its batches' "
        "digests say (and equals the expected collection, if the workload has one), every "
        "referenced blob exists, leaked blobs are swept and no process or shared-memory "
        "segment is left. Exits 1 on any violation. The same seed replays the "
        "same fault schedule.",
    )
    add_options(chaos, ChaosConfig, FLAGS, 'duration_s = 30.0, faults = ["kill-worker"]')
    chaos.add_argument(
        "--place",
        type=placement,
        metavar="ROLE=HOST,...",
        help=PLACE_HELP,
    )
    chaos.add_argument(
        "--json", action="store_true", default=False, help="print the report as JSON"
    )
    chaos.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="also write the report into DIR: report.md in words, report.json, and the "
        "timeline (timeline.png: throughput and append latency over time, each fault and "
        "restart marked; timeline.json); default: none, the report is only printed",
    )
    chaos.add_argument(
        "-v", "--verbose", action="store_true", default=False, help="log what happens"
    )
    chaos.set_defaults(func=_chaos)


def config_of(args: argparse.Namespace):
    """The ChaosConfig ``chaos`` runs with: each field from its flag if given,
    else ``--config``'s file, else the default (``ValueError`` naming a bad key)."""
    return build(ChaosConfig, layered(ChaosConfig, args.config, vars(args)), source="chaos")


def _chaos(args: argparse.Namespace) -> int:
    import msgspec
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from .._figures import command_line
    from ..chaos import run_chaos

    config = config_of(args)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(threadName)s %(levelname)s %(message)s",
    )
    console = Console(stderr=True)
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task("starting", total=config.duration_s)

        def tick(status: dict) -> None:
            progress.update(
                task,
                completed=min(status["elapsed_s"], config.duration_s),
                description=f"{status['intervals']} intervals, {status['injected']} faults, "
                f"{status['snapshots']} snapshots checked, {status['violations']} violations",
            )

        report = run_chaos(
            config, on_tick=tick, out=Path(args.out) if args.out else None, command=command_line()
        )
    if args.json:
        print(msgspec.json.encode(report).decode())
    else:
        table_console().print(report_table(report))
        for violation in report.violations:
            print(f"VIOLATION: {violation}", file=sys.stderr)
        for reason in report.reasons:
            print(f"verdict {report.verdict}: {reason}", file=sys.stderr)
    if args.out:
        print(
            f"the report in words and its timeline: {Path(args.out) / 'report.md'}", file=sys.stderr
        )
    if report.verdict == "invalid":
        return 1
    if report.interrupted:
        return 130
    return 3 if report.verdict == "unknown" else 0


def report_table(report):
    """A chaos report as a rich table."""
    from rich.console import Group
    from rich.table import Table

    from ..chaos import FAULT_KINDS

    def counts(d: dict[str, int]) -> str:
        return ", ".join(f"{k} {v}" for k, v in sorted(d.items())) or "none"

    table = Table(title=f"shardsink chaos (seed {report.seed})", show_header=True)
    table.add_column("fault kind")
    table.add_column("scheduled", justify="right")
    table.add_column("injected", justify="right")
    for column in ("missed", "lost", "unfired"):
        table.add_column(column, justify="right")
    columns = (report.scheduled, report.injected, report.missed, report.lost, report.unfired)
    for kind in FAULT_KINDS:
        if kind in report.faults:
            table.add_row(kind, *(str(by_kind.get(kind, 0)) for by_kind in columns))
    summary = Table(show_header=False, title="run")
    summary.add_column(style="bold")
    summary.add_column()
    for name, value in (
        (
            "shape",
            f"{report.shape} {report.mode}, {report.ran_s:g}s of faults"
            + (" (interrupted)" if report.interrupted else ""),
        ),
        ("intervals", f"{report.intervals} ({report.intervals_redone} redone)"),
        ("supervision", counts(report.supervision)),
        ("group restarts", counts(report.restart_ms)),
        (
            "coordinator",
            f"{report.coordinator_starts} starts; earlier ones ended: "
            f"{counts(report.coordinator_exits)}",
        ),
        (
            "snapshots",
            f"{report.snapshots_checked} checked; skipped: {counts(report.snapshots_skipped)}",
        ),
        ("maintenance", counts(report.maintenance)),
        (
            "history",
            f"{report.history.ops:,} ops, {report.history.appends:,} appends committed, "
            f"{report.history.info:,} unknown; {report.history.verdict} "
            f"({report.history.check_s:.2f} s)",
        ),
        ("leaked blobs swept", str(report.leaked_blobs_swept)),
        ("segments left", str(report.segments_swept)),
        ("violations", str(len(report.violations)) if report.violations else "none"),
        ("verdict", report.verdict + "".join(f"; {r}" for r in report.reasons)),
        ("data dir", report.data_dir or "(temporary, removed)"),
    ):
        summary.add_row(name, value)
    return Group(table, summary)
