"""The ``shardsink`` command.

Every command's flags, parsing and printing live here, one module per area
(``up`` and the cluster's commands in :mod:`.cluster`, ``chaos`` in
:mod:`.chaos`, ``consensus`` in :mod:`.server`, ``shm`` in :mod:`.shm`,
``hosts`` in :mod:`.hosts`, ``shardsink bench`` in :mod:`.bench` and, its
store benchmarks, :mod:`.bench_stores`, the shard commands, which reach a
shard wherever it lives, in :mod:`.shard` and :mod:`.shard_commands`), each
with a ``register(commands)`` (``bench``: ``register(bench)``, the
subparsers under ``shardsink bench``); the areas themselves know no
terminal. This file only assembles them. (:mod:`.servers`, the throwaway
store servers in the foreground, is no ``shardsink`` command.)
Every parser is an :class:`~shardsink.options.Parser`, which names the
nearest valid flags when one is unknown.
"""

from __future__ import annotations

import argparse
import importlib
import os
import select
import sys
from pathlib import Path

from .. import __version__
from ..options import Parser

#: The destinations of every flag that names a file or directory, of any
#: command: made absolute where they enter (:func:`_absolute`), so that no
#: later step sees a relative one (``bench cluster --out bq`` made the URI
#: ``file://bq/...``, which names host ``bq``), nor a child that runs elsewhere.
PATHS = ("config", "data_dir", "fault_dir", "json", "keys", "out", "output")
#: Commands whose stdout is a document whatever their flags (as any with
#: ``--json``): it holds that alone (:func:`._output.document_stdout`). Not
#: ``read --output F``: its stdout holds nothing, and ``F`` may be
#: ``/dev/stdout``, which is descriptor 1 and must stay the real one.
DOCUMENTS = ("read", "export")
#: One module per area's top-level commands, in the order of ``--help``;
#: each defines ``register(commands)``. ``bench`` defines ``register(bench)``
#: for ``shardsink bench``'s. Imported by :func:`build_parser`, not with this
#: package: ``python -m shardsink.cli.servers`` needs none of them (``import
#: shardsink.cli.servers``: 0.33 s with them, 0.26 s without; best of three).
AREAS = ("shard", "shard_commands", "shm", "server", "cluster", "chaos", "hosts")


def build_parser() -> Parser:
    parser = Parser(
        prog="shardsink",
        description="Coalescing multi-process writer of durable Arrow shards.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="NAME:ACTION[:PROB[:TIMES]][@ROLE]",
        help="arm a fault point in this command and every process it starts, or only in the "
        "one of role ROLE (e.g. 'worker g0/w3'); repeatable; actions: kill, pause, "
        "determinate, indeterminate; see shardsink.faults.POINTS",
    )
    parser.add_argument(
        "--fault-seed", type=int, metavar="X", help="seed of the fault draws (default 0)"
    )
    parser.add_argument(
        "--fault-dir",
        metavar="D",
        help="share fault budgets between processes and record firings in D/fired.jsonl",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    bench_parser = commands.add_parser("bench", help="benchmarks (see `shardsink bench -h`)")
    for area in AREAS:
        importlib.import_module(f".{area}", __name__).register(commands)
    from . import bench

    bench.register(bench_parser.add_subparsers(dest="bench", metavar="BENCH", required=True))
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the process exit code.

    A ``ValueError``, a shard error or a storage error raised by a command is
    printed as one line naming the problem (exit code 2), not as a traceback.
    """
    from .. import faults
    from ..persist import PersistError
    from ..storage import StorageError
    from . import _output

    parser = build_parser()
    args = parser.parse_args(argv)
    _absolute(args)
    if args.fault:
        try:  # through the environment, so that the processes it starts inherit them
            os.environ.update(
                faults.environ(args.fault, seed=args.fault_seed or 0, fault_dir=args.fault_dir)
            )
        except ValueError as exc:
            parser.error(str(exc))
    elif args.fault_seed is not None or args.fault_dir is not None:
        parser.error("--fault-seed and --fault-dir go with --fault")
    faults.arm_from_env(role=args.command)
    document = args.command in DOCUMENTS and not (args.command == "read" and args.output)
    with _output.document_stdout(bool(getattr(args, "json", False)) or document):
        try:
            return int(args.func(args) or 0)
        except (ValueError, PersistError, StorageError) as exc:
            print(f"shardsink {args.command}: error: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            return 130
        except BrokenPipeError:
            if not _stdout_gone():
                raise  # another pipe (a child's, say): a real failure
            # the reader of our output went away (`shardsink read | head`): not an error;
            # point stdout at /dev/null so the final flush does not complain
            _output.point_at_devnull(sys.stdout.fileno())
            return 0


def _absolute(args: argparse.Namespace) -> None:
    """Make every path flag given (:data:`PATHS`) absolute, from the working
    directory, without resolving links or ``..`` (the system resolves them
    when the path is used, as it would have)."""
    for dest in PATHS:
        value = getattr(args, dest, None)
        if isinstance(value, str | Path) and str(value):
            setattr(args, dest, type(value)(Path(value).absolute()))


def _stdout_gone() -> bool:
    """Whether stdout is a pipe or socket whose reader has gone (POLLERR)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError):  # not a file (captured, say): not a broken pipe
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))


if __name__ == "__main__":
    sys.exit(main())
