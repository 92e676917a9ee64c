"""``shardsink bench cluster``."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(commands, bench) -> None:
    from . import cluster

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
