"""``shardsink bench ...``: every benchmark command."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(commands, bench) -> None:
    from . import appends, cluster, consensus

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
