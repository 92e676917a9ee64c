"""``shardsink shm sweep``."""

from __future__ import annotations

import argparse


def register(commands) -> None:
    """Add ``shm sweep`` to ``commands``."""
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


def _sweep(args: argparse.Namespace) -> int:
    from ..shm import sweep

    names = sweep(args.cluster, dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    for name in names:
        print(f"{verb} {name}")
    print(f"{verb} {len(names)} segment(s)")
    return 0
