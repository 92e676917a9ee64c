"""``shardsink consensus serve`` and ``shardsink consensus stats``."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path

import msgspec

from .. import datadir
from ..persist.config import COMPACT_INTERVAL_S, COMPACT_SLACK, SERVED_FIELDS, ShardConfig
from ..storage.uri import BLOB_ENV, STORE_ENV


def register(commands, bench) -> None:
    consensus = commands.add_parser("consensus", help="the consensus server")
    sub = consensus.add_subparsers(dest="consensus_command", metavar="ACTION", required=True)

    serve = sub.add_parser(
        "serve",
        help="serve shard state over ZeroMQ",
        description="Run a consensus server in the foreground until SIGTERM or Ctrl-C. "
        "Prints 'listening on ADDR' once it accepts requests.",
    )
    add_serve_arguments(serve)
    serve.set_defaults(func=_serve)

    stats = sub.add_parser("stats", help="print a server's per-shard counters")
    stats.add_argument("address", help="the server's address (tcp://... or ipc://...)")
    stats.add_argument("--json", action="store_true", help="print JSON instead of a table")
    stats.add_argument("--timeout", type=float, default=5.0, metavar="S")
    stats.set_defaults(func=_stats)


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``consensus serve``."""
    parser.add_argument(
        "--data-dir",
        type=Path,
        metavar="D",
        help="serve D's stores (sqlite:///D/consensus.db, file://D/blob; D made 0700 if new) "
        "and hold D's lock, so `shard` commands on D go through this server",
    )
    # The environment, unlike the command line, is not shown to other users
    # (`ps`), so a URI holding a password belongs there.
    parser.add_argument(
        "--store",
        default=os.environ.get(STORE_ENV),
        help=f"consensus store URI (sqlite:///..., ...; overrides D's); default ${STORE_ENV}",
    )
    parser.add_argument(
        "--blob",
        default=os.environ.get(BLOB_ENV),
        help=f"blob URI for rollups (file:///..., ...; overrides D's); default ${BLOB_ENV}",
    )
    parser.add_argument(
        "--bind",
        required=True,
        help="ipc:///path (its directory is made 0700) or tcp://127.0.0.1:PORT (PORT 0: any)",
    )
    parser.add_argument("--gc-interval", type=float, default=60.0, metavar="S")
    parser.add_argument("--sweep-interval", type=float, default=600.0, metavar="S")
    parser.add_argument(
        "--compact-interval",
        type=float,
        default=COMPACT_INTERVAL_S,
        metavar="S",
        help="look for the spine's merges every S seconds, off the request loop, "
        f"so batches in state stay O(log n) (default {COMPACT_INTERVAL_S}; 0: off, "
        "`shard compact` merges by hand)",
    )
    parser.add_argument(
        "--compact-slack",
        type=int,
        default=COMPACT_SLACK,
        metavar="N",
        help="merge once the merges remove N batches: about one blob part per N small "
        f"batches, at most N batches above the spine's bound (default {COMPACT_SLACK})",
    )
    served = ShardConfig()
    parser.add_argument(
        "--writer-lease-ms",
        type=int,
        default=served.writer_lease_ms,
        metavar="MS",
        help="a writer not seen (append or heartbeat) for this long leaves state "
        f"(default {served.writer_lease_ms}, 15 minutes); clients heartbeat by it",
    )
    parser.add_argument(
        "--retain",
        type=int,
        default=served.retain,
        metavar="T",
        help="maintenance keeps since this far behind the upper, in the shard's time unit, "
        f"held back by live readers (default {served.retain}: an hour of up's milliseconds; "
        "0: off)",
    )
    for name in SERVED_FIELDS:
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            type=int,
            default=getattr(served, name),
            metavar="N",
            help=f"every shard's {name} here (default {getattr(served, name)}); "
            "a client opening a shard with another is refused",
        )


def serve_role(payload: bytes) -> int:
    """``consensus serve`` as a child's role (see :mod:`shardsink.process.consensus`):
    ``payload`` is its options as a JSON list; the store URIs come in the
    environment. Bad options or stores: a line naming them, exit status 2."""
    from .. import faults
    from ..storage.errors import StorageError

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # its parent stops it, not a Ctrl-C
    parser = argparse.ArgumentParser(prog="shardsink consensus serve")
    add_serve_arguments(parser)
    args = parser.parse_args(msgspec.json.decode(payload, type=list[str]))
    faults.arm_from_env(role="consensus")
    try:
        return _serve(args)
    except (ValueError, StorageError) as exc:
        print(f"shardsink consensus serve: error: {exc}", file=sys.stderr, flush=True)
        return 2


def _serve(args: argparse.Namespace) -> int:
    from setproctitle import setproctitle

    from ..storage import open_blob, open_consensus
    from .server import ConsensusServer

    if args.data_dir is None and (args.store is None or args.blob is None):
        raise ValueError(
            f"name the stores with --data-dir D, or --store and --blob (or ${STORE_ENV} "
            f"and ${BLOB_ENV})"
        )
    config = ShardConfig(
        writer_lease_ms=args.writer_lease_ms,
        retain=args.retain,
        **{name: getattr(args, name) for name in SERVED_FIELDS},
    )
    setproctitle("shardsink consensus")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with contextlib.ExitStack() as held:
        store_uri, blob_uri, lock = args.store, args.blob, None
        if args.data_dir is not None:
            data_dir = datadir.create(args.data_dir)
            lock = held.enter_context(datadir.acquire(data_dir, datadir.CONSENSUS_SERVER))
            store_uri = store_uri or datadir.consensus_uri(data_dir)
            blob_uri = blob_uri or datadir.blob_uri(data_dir)
        store = open_consensus(store_uri)
        try:
            blob = open_blob(blob_uri)
        except BaseException:
            store.close()
            raise
        server = ConsensusServer(
            store,
            blob,
            args.bind,
            gc_interval_s=args.gc_interval,
            compact_interval_s=args.compact_interval,
            compact_slack=args.compact_slack,
            sweep_interval_s=args.sweep_interval,
            config=config,
        )
        held.callback(server.close)
        if lock is not None:
            lock.update(address=server.address)
        print(f"listening on {server.address}", flush=True)
        server.serve(stop)
    return 0


def _stats(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from .client import ServerClient

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
    }
    for name in columns:
        table.add_column(name, justify="left" if name == "shard" else "right")
    for shard in reply.shards:
        table.add_row(*(str(get(shard)) for get in columns.values()))
    Console().print(table)
    return 0
