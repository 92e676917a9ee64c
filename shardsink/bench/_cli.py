"""``shardsink bench ...``: every benchmark command."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(commands, bench) -> None:
    from ..config import COALESCES, MODES, add_config_option
    from . import allocators, appends, cluster, consensus, parts, read, soak, startup

    consensus.register(bench)
    appends.register(bench)
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

    start = _command(
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

    reads = _command(
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

    sorted_parts = _command(
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

    pools = _command(
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

    soaks = _command(
        bench,
        "soak",
        soak,
        "one cluster for many intervals: steady-state figures per block",
        _soak,
    )
    soaks.add_argument("--intervals", type=int, default=20_000, metavar="N", help="default 20000")
    soaks.add_argument(
        "--block",
        type=int,
        default=soak.BLOCK,
        metavar="N",
        help="intervals per block (default %(default)s)",
    )
    for flag, metavar, default in SOAK_SHAPE:
        soaks.add_argument(
            flag, type=int, default=default, metavar=metavar, help="default %(default)s"
        )
    soaks.add_argument("--mode", choices=MODES, default="best-effort", help="default best-effort")
    soaks.add_argument("--coalesce", choices=COALESCES, default="group", help="default group")

    parser = bench.add_parser(
        "cluster",
        help="the scale-out matrix: modes, shapes, hydration thresholds, a Delta Lake peer",
        description=cluster.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_option(
        parser,
        cluster.BenchClusterConfig,
        'out = "bench-out", matrix = "quick", and a [cluster] table of ClusterConfig fields '
        'every run starts from: start = "spawn"',
    )
    parser.add_argument(
        "--out",
        metavar="DIR",
        help="output directory (default: none; required here or in the file)",
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--quick",
        dest="matrix",
        action="store_const",
        const="quick",
        help="the cut-down matrix (minutes); same as --matrix quick",
    )
    which.add_argument(
        "--matrix",
        choices=sorted(cluster.MATRICES),
        help="default: the whole matrix (the default); quick: the cut-down one; trickle: its "
        "trickle section; scale: rows/s, parts per append and latency as workers and groups "
        "grow; auto: small writes and hydration with --shared-max-bytes auto; latency: the p50 "
        "sharing adds to off's at 1x8 and 4x8",
    )
    parser.set_defaults(func=_run)


#: ``bench soak``'s cluster shape (ClusterConfig fields): flag, metavar,
#: default: the issue's steady-state cluster, not ``up``'s small default.
SOAK_SHAPE = (("--groups", "G", 4), ("--workers", "W", 8), ("--rows-per-interval", "R", 128))


def _command(bench, name: str, module, summary: str, func) -> argparse.ArgumentParser:
    """A ``bench NAME`` command described by ``module``'s docstring, with
    ``--out DIR``, running ``func``."""
    parser = bench.add_parser(
        name,
        help=summary,
        description=module.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, required=True, metavar="DIR", help="output directory")
    parser.set_defaults(func=func)
    return parser


def _soak(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from ..config import ClusterConfig
    from .soak import run

    config = ClusterConfig(
        groups=args.groups,
        workers=args.workers,
        mode=args.mode,
        coalesce=args.coalesce,
        rows_per_interval=args.rows_per_interval,
        intervals=args.intervals,
    )
    result = run(config, args.out, args.block)
    table = Table(
        title=f"soak: {args.intervals} intervals, {args.groups}x{args.workers} {args.mode}"
        + (" (coalesce host)" if args.coalesce == "host" else "")
    )
    for column in ("check", "value", "bound", "ok"):
        table.add_column(column)
    for name, check in result["checks"].items():
        table.add_row(
            name, f"{check['value']:.3g}", f"{check['bound']}", "yes" if check["ok"] else "NO"
        )
    table.add_row("verified", "", "", "yes" if result["verified"] else "NO")
    Console().print(table)
    print(f"wrote {args.out / 'soak.json'} and {args.out / 'soak.png'}")
    return 0 if result["verified"] else 1


def bench_cluster_config(args: argparse.Namespace):
    """The BenchClusterConfig of the parsed ``bench cluster`` arguments: each
    field from its flag if given, else ``--config``'s file, else the default
    (``ValueError`` naming a bad key, or a missing output directory)."""
    from ..config import layered
    from .cluster import BenchClusterConfig, bench_config

    fields = layered(BenchClusterConfig, args.config, vars(args))
    config = bench_config(fields, source="bench cluster")
    if config.out is None:
        raise ValueError("give the output directory: --out DIR, or out in --config's file")
    return config


def _run(args: argparse.Namespace) -> int:
    from .cluster import command_line, matrix, run

    config = bench_cluster_config(args)
    specs = matrix(config.matrix)
    rows = run(specs, Path(config.out), command_line(), title=config.matrix, base=config.cluster)
    return 0 if rows and all(r.get("verified") for r in rows) else 1


def _transport(args: argparse.Namespace) -> int:
    from .transport import print_table, run

    print_table(run(args.out, inline_sweep=args.inline_sweep))
    return 0


def _startup(args: argparse.Namespace) -> int:
    from .startup import print_table, run

    try:
        shapes = tuple((int(g), int(w)) for g, w in (s.split("x") for s in args.shapes.split(",")))
    except ValueError:
        raise ValueError(f"--shapes {args.shapes!r}: give GxW pairs, e.g. 4x8,16x8") from None
    result = run(args.out, shapes=shapes, repeats=args.repeats, restart_count=args.restarts)
    print_table(result)
    return 0 if result["verified"] else 1


def _parts(args: argparse.Namespace) -> int:
    from .parts import print_table, run

    print_table(
        run(
            args.out,
            parts=args.parts,
            rows=args.rows,
            builder_rows=args.builder_rows,
            workers=args.workers,
            repeats=args.repeats,
        )
    )
    return 0


def _allocators(args: argparse.Namespace) -> int:
    from .allocators import print_table, run

    print_table(
        run(
            args.out,
            parts=args.parts,
            rows=args.rows,
            repeats=args.repeats,
            start_count=args.starts,
        )
    )
    return 0


def _read(args: argparse.Namespace) -> int:
    from .read import print_table, run

    try:
        rows = tuple(int(n) for n in args.rows.split(","))
    except ValueError:
        raise ValueError(f"--rows {args.rows!r}: give row counts, e.g. 2000000,20000000") from None
    result = run(args.out, rows)
    print_table(result)
    runs = result["runs"]
    return 0 if all(r["verified"] and r["same_rows"] for r in runs) else 1
