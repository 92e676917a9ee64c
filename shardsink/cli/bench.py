"""``shardsink bench ...``: every benchmark command."""

from __future__ import annotations

import argparse
import contextlib
import functools
import signal
import sys
import threading
from pathlib import Path

from .._extras import require
from ..options import Flag, add_fields, add_options, layered
from . import bench_stores, bench_tables
from ._commands import described
from ._output import table_console


def register(bench) -> None:
    bench_stores.register(bench)
    transport = bench.add_parser(
        "transport",
        help="shared-memory transport vs ZeroMQ, a queue and memcpy",
        description="Write DIR/transport.json with GB/s per part size and print a table.",
    )
    transport.add_argument("--out", required=True, metavar="DIR", help="output directory")
    transport.add_argument(
        "--inline-sweep",
        action="store_true",
        help="also measure small parts inline vs through shared memory",
    )
    transport.set_defaults(func=_transport)
    _register_startup_and_read(bench)
    _register_parts_and_allocators(bench)
    _register_soak(bench)
    _register_cluster(bench)
    for parser in bench.choices.values():
        parser.set_defaults(func=_interruptible(parser.get_default("func")))


def _interruptible(func):
    """``func`` with SIGTERM interrupting it as Ctrl-C does (``KeyboardInterrupt``),
    so that a benchmark that is killed stops its cluster and removes its
    scratch and data directories, as each does when interrupted; the previous
    handler is back after it."""

    def interrupt(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: cleanup is not cut short again
        raise KeyboardInterrupt(f"signal {signum}")

    @functools.wraps(func)
    def run(args: argparse.Namespace) -> int:
        if threading.current_thread() is not threading.main_thread():
            return func(args)  # only the main thread takes signals
        previous = signal.signal(signal.SIGTERM, interrupt)
        try:
            return func(args)
        finally:
            signal.signal(signal.SIGTERM, previous)

    return run


def _register_startup_and_read(bench) -> None:
    from ..bench import read, startup

    start = described(
        bench,
        "startup",
        startup,
        "cluster cold start, group restart and workers' memory: fork vs spawn",
        _startup,
    )
    start.add_argument(
        "--shapes",
        default=",".join(f"{g}x{w}" for g, w in startup.DEFAULT_SHAPES),
        metavar="GxW,...",
        help="cluster shapes to cold-start (default %(default)s)",
    )
    start.add_argument("--repeats", type=int, default=3, metavar="N", help="default 3")
    start.add_argument(
        "--restarts", type=int, default=5, metavar="N", help="group restarts timed (default 5)"
    )
    reads = described(
        bench,
        "read",
        read,
        "streaming a shard's snapshot (read, Reader.batches) against DuckDB",
        _read,
    )
    reads.add_argument(
        "--rows",
        default=",".join(map(str, read.DEFAULT_ROWS)),
        metavar="N,...",
        help="snapshot rows of each shard (default %(default)s)",
    )


def _register_parts_and_allocators(bench) -> None:
    from ..bench import allocators, parts

    sorted_parts = described(
        bench,
        "parts",
        parts,
        "sorted parts: a builder's rows/s with and without, reads' and merges' memory",
        _parts,
    )
    for flag, default in (
        ("--parts", parts.DEFAULT_PARTS),
        ("--rows", parts.DEFAULT_ROWS),
        ("--builder-rows", parts.DEFAULT_BUILDER_ROWS),
        ("--workers", parts.DEFAULT_WORKERS),
        ("--repeats", parts.DEFAULT_REPEATS),
    ):
        sorted_parts.add_argument(
            flag, type=int, default=default, metavar="N", help="default %(default)s"
        )
    pools = described(
        bench,
        "allocators",
        allocators,
        "a merge's memory per allocator environment; the consensus server's start",
        _allocators,
    )
    for flag, default in (
        ("--parts", allocators.DEFAULT_PARTS),
        ("--rows", allocators.DEFAULT_ROWS),
        ("--repeats", allocators.DEFAULT_REPEATS),
        ("--starts", allocators.DEFAULT_STARTS),
    ):
        pools.add_argument(flag, type=int, default=default, metavar="N", help="default %(default)s")


#: ``bench soak``'s cluster (ClusterConfig fields, flagged as ``up`` flags
#: them): the issue's steady-state cluster, not ``up``'s small default.
SOAK_CLUSTER = {
    "groups": 4,
    "workers": 8,
    "mode": "best-effort",
    "coalesce": "group",
    "rows_per_interval": 128,
    "intervals": 20_000,
}


def _register_soak(bench) -> None:
    from ..bench import soak
    from ..config import ClusterConfig
    from .cluster import FLAGS

    soaks = described(
        bench,
        "soak",
        soak,
        "one cluster for many intervals: steady-state figures per block",
        _soak,
    )
    add_fields(soaks, ClusterConfig, {n: FLAGS[n] for n in SOAK_CLUSTER}, defaults=SOAK_CLUSTER)
    soaks.add_argument(
        "--block",
        type=int,
        default=soak.BLOCK,
        metavar="N",
        help="intervals per block (default %(default)s)",
    )
    _report_only(soaks)


#: ``bench cluster``'s flag of every BenchClusterConfig field but ``cluster``
#: (a TOML table only).
CLUSTER_FLAGS = {
    "out": Flag("DIR", "output directory", default="none; required here or in the file"),
    "matrix": Flag(
        None,
        "default: the whole matrix; quick: the cut-down one (minutes, as --quick); trickle: "
        "its trickle section; scale: rows/s, parts per append and latency as workers and groups "
        "grow; auto: small writes and hydration with --shared-max-bytes auto; latency: the p50 "
        "sharing adds to off's at 1x8 and 4x8; hosts: every variant on this machine and on 1, 2 "
        "and 3 hosts of a Ray cluster ([cluster] hosts, else 3 loopback nodes started for it); "
        "digest: trickle 1x4 with and without content digests, six repeats (what they cost); "
        "rate: off, best-effort and barrier at 1x8 and 4x8 open loop from 5 to 160 intervals "
        "a second, their latency distributions and knees; peers: best-effort and barrier "
        "against Delta Lake and Iceberg peers (every worker its own committer, one coalesced "
        "committer) at 1x8 and 4x8; saturation: 4x8 closed loop, then open loop at twice "
        "its rate",
    ),
    "slo_p99_ms": Flag("MS", "the rate matrix's knee: the highest rate whose p99 stays within MS"),
}


def _register_cluster(bench) -> None:
    from ..bench import cluster

    summary = "the scale-out matrix: modes, shapes, hydration, Delta Lake and Iceberg peers"
    parser = described(bench, "cluster", cluster, summary, _run, out=False)
    example = (
        'out = "bench-out", matrix = "quick", and a [cluster] table of ClusterConfig fields '
        'every run starts from: start = "spawn"'
    )
    add_options(parser, cluster.BenchClusterConfig, CLUSTER_FLAGS, example)
    # --quick and --matrix exclude each other; the group is made after add_options
    # so that --quick, like --matrix, sets nothing unless given
    which = parser.add_mutually_exclusive_group()
    which._group_actions.append(parser._option_string_actions["--matrix"])
    which.add_argument(
        "--quick",
        dest="matrix",
        action="store_const",
        const="quick",
        help="the cut-down matrix (minutes); same as --matrix quick",
    )
    _report_only(parser)


def _soak(args: argparse.Namespace) -> int:
    from ..bench.soak import run
    from ..config import ClusterConfig

    require("bench soak", "bench", "matplotlib")
    config = ClusterConfig(**{name: getattr(args, name) for name in SOAK_CLUSTER})
    result = run(config, args.out, args.block, progress=_bar)
    _print(bench_tables.soak_table(result, config))
    print(f"wrote {args.out / 'soak.json'} and {args.out / 'soak.png'}")
    failed = [name for name, check in result["checks"].items() if not check["ok"]]
    return _verdict(args, failed, int(not result["verified"]), 1, args.out / "soak.json")


def bench_cluster_config(args: argparse.Namespace):
    """The BenchClusterConfig of the parsed ``bench cluster`` arguments: each
    field from its flag if given, else ``--config``'s file, else the default
    (``ValueError`` naming a bad key, or a missing output directory)."""
    from ..bench.cluster import BenchClusterConfig, bench_config

    fields = layered(BenchClusterConfig, args.config, vars(args))
    config = bench_config(fields, source="bench cluster")
    if config.out is None:
        raise ValueError("give the output directory: --out DIR, or out in --config's file")
    return config


def _run(args: argparse.Namespace) -> int:
    """Exit 1 if a check of the report fails or a run does not verify,
    saying how many, unless ``--report-only``; an inconclusive check (a
    timing past its bound by less than its repeats' noise) is no failure."""
    from msgspec.structs import replace

    from ..bench import peers
    from ..bench.cluster import checks, command_line, matrix, run
    from ..bench.cluster.checks import verdict_word
    from ..bench.cluster.matrices import workload_matrix

    config = bench_cluster_config(args)
    specs = workload_matrix(config.workload) if config.workload else matrix(config.matrix)
    specs = [replace(s, slo_p99_ms=config.slo_p99_ms) for s in specs]
    # before any run: plots need matplotlib, the peers' runs their table libraries
    peer = sorted({m for s in specs if s.mode in peers.PEERS for m in peers.modules(s.mode)})
    require("bench cluster", "bench", "matplotlib", *peer)
    out = Path(config.out)
    rows = run(specs, out, command_line(), base=config.cluster, progress=_bar)
    verdicts = checks(rows)
    console = table_console()
    console.print(bench_tables.cluster_table(rows, config.matrix, out / "results.json"))
    for claim, passed, figures in verdicts:
        console.print(f"{verdict_word(passed):>12}  {claim}: {figures}")
    failed = [claim for claim, passed, _ in verdicts if passed is False]
    unverified = sum(not r.get("verified") for r in rows)
    return _verdict(args, failed, unverified, len(rows), out / "report.md")


class _RichSteps:
    """The :class:`~shardsink.bench.showing.Steps` of a task on a rich progress bar."""

    def __init__(self, progress, task) -> None:
        self._progress, self._task = progress, task

    def advance(self) -> None:
        self._progress.advance(self._task)

    def describe(self, what: str) -> None:
        self._progress.update(self._task, description=what)

    def note(self, line: str) -> None:
        self._progress.console.print(line)


@contextlib.contextmanager
def _bar(description: str, total: int):
    """The :data:`~shardsink.bench.showing.Bar` of ``bench soak`` and ``bench
    cluster``: a progress bar on stderr (what runs, the bar, done of
    ``total``, time elapsed), left on the screen when done; notes above it."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=Console(stderr=True)) as progress:
        yield _RichSteps(progress, progress.add_task(description, total=total))


def _report_only(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--report-only",
        action="store_true",
        default=False,
        help="exit 0 even if a check fails or a run does not verify (default: exit 1 then)",
    )


def _verdict(
    args: argparse.Namespace, failed: list[str], unverified: int, runs: int, report: Path
) -> int:
    """The exit status of a benchmark whose checks ``failed`` (their claims)
    and of whose ``runs`` runs ``unverified`` did not verify: 1, saying so
    on stderr, if any did (or nothing ran), unless ``--report-only``."""
    if not (failed or unverified or not runs) or args.report_only:
        return 0
    print(
        f"shardsink bench {args.bench}: {len(failed)} check(s) failed"
        + (f" ({'; '.join(failed)})" if failed else "")
        + f", {unverified} of {runs} run(s) did not verify; see {report} "
        "(--report-only exits 0)",
        file=sys.stderr,
    )
    return 1


def _transport(args: argparse.Namespace) -> int:
    from ..bench.transport import run

    _print(*bench_tables.transport_tables(run(args.out, inline_sweep=args.inline_sweep)))
    return 0


def _startup(args: argparse.Namespace) -> int:
    from ..bench.startup import run

    try:
        shapes = tuple((int(g), int(w)) for g, w in (s.split("x") for s in args.shapes.split(",")))
    except ValueError:
        raise ValueError(f"--shapes {args.shapes!r}: give GxW pairs, e.g. 4x8,16x8") from None
    result = run(
        args.out, shapes=shapes, repeats=args.repeats, restart_count=args.restarts, progress=print
    )
    _print(bench_tables.startup_table(result), f"verified: {result['verified']}")
    return 0 if result["verified"] else 1


def _parts(args: argparse.Namespace) -> int:
    from ..bench.parts import run

    result = run(
        args.out,
        parts=args.parts,
        rows=args.rows,
        builder_rows=args.builder_rows,
        workers=args.workers,
        repeats=args.repeats,
        progress=print,
    )
    _print(*bench_tables.parts_tables(result))
    return 0


def _allocators(args: argparse.Namespace) -> int:
    from ..bench.allocators import run

    result = run(
        args.out,
        parts=args.parts,
        rows=args.rows,
        repeats=args.repeats,
        start_count=args.starts,
        progress=print,
    )
    _print(*bench_tables.allocators_tables(result))
    return 0


def _read(args: argparse.Namespace) -> int:
    from ..bench.read import run

    require("bench read", "read", "duckdb")
    try:
        rows = tuple(int(n) for n in args.rows.split(","))
    except ValueError:
        raise ValueError(f"--rows {args.rows!r}: give row counts, e.g. 2000000,20000000") from None
    result = run(args.out, rows, progress=print)
    _print(bench_tables.read_table(result))
    runs = result["runs"]
    return 0 if all(r["verified"] and r["same_rows"] for r in runs) else 1


def _print(*shown) -> None:
    """Print ``shown`` (tables, lines) on stdout, one after another, as rich renders them."""
    console = table_console()
    for each in shown:
        console.print(each)
