"""``shardsink bench ...``: every benchmark command."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(commands, bench) -> None:
    from . import appends, cluster, consensus, read, startup

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

    start = bench.add_parser(
        "startup",
        help="cluster cold start, group restart and workers' memory: fork vs spawn",
        description=startup.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    start.add_argument("--out", type=Path, required=True, metavar="DIR", help="output directory")
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
    start.set_defaults(func=_startup)

    reads = bench.add_parser(
        "read",
        help="streaming a shard's snapshot (read, Reader.batches) against DuckDB",
        description=read.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    reads.add_argument("--out", type=Path, required=True, metavar="DIR", help="output directory")
    reads.add_argument(
        "--rows",
        default=",".join(map(str, read.DEFAULT_ROWS)),
        metavar="N,...",
        help="snapshot rows of each shard (default %(default)s)",
    )
    reads.set_defaults(func=_read)

    parser = bench.add_parser(
        "cluster",
        help="the scale-out matrix: modes, shapes, hydration thresholds, a Delta Lake peer",
        description=cluster.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, required=True, metavar="DIR", help="output directory")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--quick", action="store_true", help="the cut-down matrix (minutes)")
    which.add_argument("--matrix", choices=sorted(cluster.MATRICES), default="default")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from .cluster import command_line, run

    rows = run("quick" if args.quick else args.matrix, args.out, command_line())
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
