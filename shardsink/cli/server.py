"""``shardsink consensus serve`` and ``shardsink consensus stats``."""

from __future__ import annotations

import argparse
import json
import os
import sys

import msgspec

from .._curve import KEYS_ENV
from ..datadir import DATA_DIR_ENV
from ..options import Flag, add_options, build, layered
from ..persist import SERVED_FIELDS, ShardConfig
from ..storage import BLOB_ENV, STORE_ENV
from ._output import table_console


def register(commands) -> None:
    consensus = commands.add_parser("consensus", help="the consensus server")
    sub = consensus.add_subparsers(dest="consensus_command", metavar="ACTION", required=True)

    serve = sub.add_parser(
        "serve",
        help="serve shard state over ZeroMQ",
        description="Run a consensus server in the foreground until SIGTERM or Ctrl-C. "
        "Prints 'listening on ADDR' once it accepts requests (after 'metrics at URL' with "
        "--metrics-port). Settings come from the flags given, then the environment, then "
        "--config FILE, then the defaults shown.",
    )
    add_serve_arguments(serve)
    serve.set_defaults(func=_serve_command)

    stats = sub.add_parser("stats", help="print a server's per-shard counters")
    stats.add_argument("address", help="the server's address (tcp://... or ipc://...)")
    stats.add_argument("--json", action="store_true", help="print JSON instead of a table")
    stats.add_argument(
        "--timeout", type=float, default=5.0, metavar="S", help="wait this long (default 5)"
    )
    stats.set_defaults(func=_stats)


#: ``consensus serve``'s flag of every :class:`~.config.ServeConfig` field (its
#: name, dashed; ``--config``'s keys): metavar, help, default in words, old spelling.
FLAGS: dict[str, Flag] = {
    "bind": Flag("ADDR", "ipc:///path (its directory is made 0700) or tcp://127.0.0.1:PORT "
                 "(PORT 0: any; answers only CURVE clients with a key of --keys)",
                 default="none: give it here or in the file"),
    "keys": Flag("DIR", "the CURVE key directory of a tcp:// bind (made 0700 with the keys "
                 "that are missing; clients use its server.key and client.key_secret)",
                 default=f"${KEYS_ENV}, else D/keys"),
    "data_dir": Flag("D", "serve D's stores (sqlite:///D/consensus.db, file://D/blob; D made "
                     "0700 if new) and hold D's lock, so `shard` commands on D go through this "
                     "server", default=f"${DATA_DIR_ENV}, else none"),
    # The environment, unlike the command line, is not shown to other users
    # (`ps`), so a URI holding a password belongs there.
    "store": Flag("URI", "consensus store URI (sqlite:///..., ...; overrides D's)",
                  default=f"${STORE_ENV}, else D's"),
    "blob": Flag("URI", "blob URI for rollups (file:///..., ...; overrides D's)",
                 default=f"${BLOB_ENV}, else D's"),
    "gc_interval_s": Flag("S", "collect garbage every S seconds; 0: never", old="--gc-interval"),
    "sweep_interval_s": Flag("S", "sweep leaked blobs every S seconds; 0: never",
                             old="--sweep-interval"),
    "compact_interval_s": Flag("S", "look for the spine's merges every S seconds, off the "
                               "request loop, so batches in state stay O(log n) (0: off, `shard "
                               "compact` merges by hand)", old="--compact-interval"),
    "compact_slack": Flag("N", "merge once the merges remove N batches: about one blob part per "
                          "N small batches, at most N batches above the spine's bound"),
    "writer_lease_ms": Flag("MS", "a writer not seen (append or heartbeat) for this long leaves "
                            "state; clients heartbeat by it",
                            default=f"{ShardConfig().writer_lease_ms}, 15 minutes"),
    "retain": Flag("T", "maintenance keeps since this far behind the upper, in the shard's time "
                   "unit, held back by live readers (0: off)",
                   default=f"{ShardConfig().retain}, an hour of up's milliseconds"),
    **{
        name: Flag("N", f"every shard's {name} here; a client opening a shard with another is "
                   "refused")
        for name in SERVED_FIELDS
    },
    "metrics_port": Flag("P", "serve Prometheus metrics at http://127.0.0.1:P/metrics; 0: a "
                         "free port"),
    "check_parts": Flag(None, "look up every append's blob parts before they commit "
                        "(--no-check-parts only to measure the cost: a part deleted before its "
                        "append would then commit)"),
    "batch_max": Flag("N", "group commit: store the commands of at most N shards in one store "
                      "transaction (1: each command its own)"),
    "batch_window_max_ms": Flag("MS", "group commit: wait at most MS to gather a batch (a share "
                                "of the observed commit latency, 0 while one client is alone; "
                                "0: never wait)"),
}  # fmt: skip
#: Where each environment variable goes when its flag is not given (a
#: consensus child's are :data:`shardsink.server.serve.ROLE_ENV`).
COMMAND_ENV = {DATA_DIR_ENV: "data_dir", STORE_ENV: "store", BLOB_ENV: "blob", KEYS_ENV: "keys"}


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``consensus serve``: ``--config`` and a flag per
    :class:`~.config.ServeConfig` field (:data:`FLAGS`), each given one
    setting its field (see :func:`serve_config`)."""
    from ..server import ServeConfig

    example = 'bind = "tcp://127.0.0.1:7000", compact_interval_s = 30.0'
    add_options(parser, ServeConfig, FLAGS, example)


def serve_config(args: argparse.Namespace, environment: dict[str, str]):
    """The ServeConfig of the parsed ``args``: each field from its flag if
    given, else its variable of ``environment``, else ``--config``'s file,
    else the default. ``ValueError`` naming a bad key, a missing bind or
    stores named neither way."""
    from ..server import ServeConfig

    fields = layered(ServeConfig, args.config, vars(args), environment)
    config = build(ServeConfig, fields, source="consensus serve")
    if config.bind is None:
        raise ValueError("give the address to serve at: --bind ADDR, or bind in --config's file")
    if config.data_dir is None and (config.store is None or config.blob is None):
        raise ValueError(
            f"name the stores with --data-dir D, or --store and --blob (or ${STORE_ENV} "
            f"and ${BLOB_ENV})"
        )
    return config


def _serve_command(args: argparse.Namespace) -> int:
    from ..server import serve

    _exec_with_server_env()
    return serve.serve(serve_config(args, COMMAND_ENV), _print_ready)


def _print_ready(address: str, metrics_url: str | None) -> None:
    """The lines ``consensus serve`` prints for whoever runs it."""
    if metrics_url is not None:
        print(f"metrics at {metrics_url}", flush=True)
    print(f"listening on {address}", flush=True)


def _exec_with_server_env() -> None:
    """Re-execute this process with the allocator environment it lacks
    (:data:`shardsink._allocator.SERVER_ENV`), which takes effect only when
    an interpreter starts; only when this process is the command itself, not
    a ``main`` called in-process."""
    from .._allocator import missing_server_env

    missing = missing_server_env()
    command = any(sys.argv[i : i + 2] == ["consensus", "serve"] for i in range(1, len(sys.argv)))
    if missing and command:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, sys.orig_argv, {**os.environ, **missing})


def _stats(args: argparse.Namespace) -> int:
    from rich.table import Table

    from ..server import ServerClient

    client = ServerClient(args.address, timeout_s=args.timeout, retry_for_s=0)
    try:
        client.ping(args.timeout)
        reply = client.stats()
    finally:
        client.close()
    if args.json:
        json.dump(msgspec.to_builtins(reply), sys.stdout, indent=2)
        print()
        return 0
    table = Table(
        title=f"consensus server pid {reply.pid}: {reply.requests} requests, "
        f"{reply.errors} errors, {reply.dropped} dropped"
    )
    columns = {
        "shard": lambda s: s.shard,
        "seqno": lambda s: s.seqno,
        "upper": lambda s: s.upper,
        "batches": lambda s: s.batches,
        "readers": lambda s: s.readers,
        "commands": lambda s: s.commands,
        "cas calls": lambda s: s.machine.cas_calls,
        "mismatches": lambda s: s.machine.cas_mismatches,
        "diff bytes": lambda s: s.machine.diff_bytes,
        "rollups": lambda s: s.machine.rollup_puts,
        "gc runs": lambda s: s.gc_runs,
        "blobs deleted": lambda s: s.blobs_deleted,
        "leaked swept": lambda s: s.leaked_swept,
        "readers expired": lambda s: s.readers_expired,
        "writers expired": lambda s: s.writers_expired,
        "compactions": lambda s: s.compactions,
        "abandoned": lambda s: s.compactions_abandoned,
        "failures": lambda s: sum(s.failures.values()),
    }
    for name in columns:
        table.add_column(name, justify="left" if name == "shard" else "right")
    for shard in reply.shards:
        table.add_row(*(str(get(shard)) for get in columns.values()))
    console = table_console()
    console.print(table)
    for shard in reply.shards:
        if shard.last_failure:
            failed = ", ".join(f"{kind} {n}" for kind, n in shard.failures.items() if n)
            console.print(
                f"shard {shard.shard!r}: maintenance failed ({failed}), last: {shard.last_failure}",
                markup=False,
                highlight=False,
            )
    return 0
