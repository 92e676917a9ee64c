"""``shardsink shm sweep`` and ``shardsink bench transport``."""

from __future__ import annotations

import argparse


def register(commands, bench) -> None:
    """Add ``shm sweep`` to ``commands`` and ``transport`` to ``bench``."""
    shm = commands.add_parser("shm", help="shared-memory segments")
    shm_commands = shm.add_subparsers(dest="shm_command", metavar="SUBCOMMAND", required=True)
    sweep = shm_commands.add_parser(
        "sweep",
        help="remove segments whose creating process is dead",
        description="Remove shardsink shared-memory segments whose creator is dead; "
        "segments of live processes are never touched.",
    )
    sweep.add_argument("--cluster", metavar="ID", help="only segments of this cluster")
    sweep.add_argument("--dry-run", action="store_true", help="list, do not remove")
    sweep.set_defaults(func=_sweep)

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
    transport.set_defaults(func=_bench_transport)


def _sweep(args: argparse.Namespace) -> int:
    from .sweep import sweep

    names = sweep(args.cluster, dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    for name in names:
        print(f"{verb} {name}")
    print(f"{verb} {len(names)} segment(s)")
    return 0


def _bench_transport(args: argparse.Namespace) -> int:
    from ..bench.transport import print_table, run

    print_table(run(args.out, inline_sweep=args.inline_sweep))
    return 0
