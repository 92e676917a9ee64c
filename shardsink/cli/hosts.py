"""``shardsink hosts sweep``: remove what dead runs of emulated hosts left."""

from __future__ import annotations

import argparse
import sys


def register(commands) -> None:
    """Add ``hosts sweep`` to ``commands``."""
    hosts = commands.add_parser("hosts", help="emulated hosts (network namespaces; root only)")
    hosts_commands = hosts.add_subparsers(dest="hosts_command", metavar="SUBCOMMAND", required=True)
    sweep = hosts_commands.add_parser(
        "sweep",
        help="remove the namespaces, processes and clock files of dead runs of emulated hosts",
        description="Remove what runs of emulated hosts (shardsink.netns) whose creating "
        "process is dead left: their network namespaces (with their veths, bridge and "
        "firewall rules), the processes still in them, their clock files and scratch "
        "directories, and the shared-memory segments of dead processes (as shm sweep). A "
        "live run's are never touched. Needs root.",
    )
    sweep.add_argument("--dry-run", action="store_true", help="list, do not remove")
    sweep.set_defaults(func=_sweep)


def _sweep(args: argparse.Namespace) -> int:
    from ..netns import NetnsError, sweep
    from ..shm import sweep as sweep_segments

    try:
        swept = sweep(dry_run=args.dry_run)
    except (NetnsError, TimeoutError) as exc:
        print(f"shardsink hosts sweep: error: {exc}", file=sys.stderr)
        return 2
    # a coordinator killed on a host before it unlinked its segments leaves them
    segments = sweep_segments(dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    for name in swept.namespaces:
        print(f"{verb} namespace {name}")
    for pid in swept.processes:
        print(f"{'would kill' if args.dry_run else 'killed'} process {pid}")
    for directory in swept.directories:
        print(f"{verb} state directory {directory}")
    for segment in segments:
        print(f"{verb} shared-memory segment {segment}")
    print(
        f"{verb} {len(swept.namespaces)} namespace(s), {len(swept.processes)} process(es), "
        f"{len(swept.directories)} state directory(ies), {len(segments)} segment(s)"
    )
    return 0
