"""``shardsink bench consensus``: compare-and-set throughput under contention.

For each ``--store`` and each client count C, C client processes (each with its
own store opened from the URI) race to append to one shard for ``--seconds``:
read the head once, then compare-and-set ``head + 1``; on a mismatch retry from
the head the mismatch carries. Reported per run: committed versions per second,
compare-and-set attempts per second, the share of attempts that mismatched,
and the compare-and-set latency.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from ..storage.backend import open_consensus
from ..storage.contracts import Committed, Consensus, VersionedData
from ..storage.errors import StorageError
from ..storage.uri import STORE_ENV, redact
from . import clients as racing


def register(bench: argparse._SubParsersAction) -> None:
    parser = bench.add_parser(
        "consensus",
        help="compare-and-set throughput of consensus stores under contention",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    racing.add_race_arguments(parser)
    parser.add_argument("--shard", default="bench-consensus", help="shard the clients append to")
    parser.add_argument(
        "--bytes", type=int, default=128, help="payload bytes per version (default 128)"
    )
    parser.set_defaults(func=_run)


def _client(argv: list[str]) -> None:
    """A client process: open the store, say ``ready``, wait for ``go`` on stdin,
    race for the given seconds, print the counts as one JSON line. The store's
    URI comes in the environment (``STORE_ENV``)."""
    shard, client, payload_bytes, seconds = argv
    client, payload_bytes, seconds = int(client), int(payload_bytes), float(seconds)
    store = open_consensus(os.environ[STORE_ENV])
    try:
        if not racing.ready():
            return
        pad = b"." * payload_bytes
        committed = mismatches = errors = 0
        latencies_us: list[int] = []
        head = store.head(shard)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            seqno = 0 if head is None else head.seqno + 1
            new = VersionedData(seqno, (f"{client}:{seqno}:".encode() + pad)[:payload_bytes])
            started = time.perf_counter()
            try:
                result = store.compare_and_set(shard, None if head is None else head.seqno, new)
            except StorageError:
                errors += 1
                head = _reread(store, shard)
                continue
            finally:
                latencies_us.append(round((time.perf_counter() - started) * 1e6))
            if isinstance(result, Committed):
                committed += 1
                head = new
            else:
                mismatches += 1
                head = result.current
        counts = {"committed": committed, "mismatches": mismatches, "errors": errors}
        racing.report({**counts, "latencies_us": latencies_us})
    finally:
        store.close()


def _reread(store: Consensus, shard: str) -> VersionedData | None:
    """The head after a failed call, retrying briefly while the store is failing."""
    for _ in range(50):
        try:
            return store.head(shard)
        except StorageError:
            time.sleep(0.1)
    return store.head(shard)


def race(uri: str, shards: list[str], seconds: float, payload_bytes: int = 128) -> dict:
    """Run one measurement: a process per entry of ``shards`` appending to
    that shard for ``seconds`` (several on one shard race). Raises
    ``RuntimeError`` if a client fails to start or to report."""
    n_clients = len(shards)
    reports = racing.race(
        "shardsink.bench.consensus:_client",
        [[shard, str(c), str(payload_bytes), str(seconds)] for c, shard in enumerate(shards)],
        seconds,
        redact(uri),
        env={STORE_ENV: uri},
    )
    latencies = sorted(x for r in reports for x in r["latencies_us"])
    committed = sum(r["committed"] for r in reports)
    mismatches = sum(r["mismatches"] for r in reports)
    errors = sum(r["errors"] for r in reports)
    attempts = len(latencies)
    return {
        "store": redact(uri),
        "clients": n_clients,
        "seconds": seconds,
        "committed": committed,
        "attempts": attempts,
        "mismatches": mismatches,
        "errors": errors,
        "committed_per_s": committed / seconds,
        "attempts_per_s": attempts / seconds,
        "mismatch_rate": mismatches / attempts if attempts else 0.0,
        "cas_ms_p50": racing.quantile_ms(latencies, 0.50),
        "cas_ms_p99": racing.quantile_ms(latencies, 0.99),
    }


def _run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    if args.bytes < 1:
        raise ValueError(f"--bytes must be positive, got {args.bytes}")
    racing.check_stores(args.store, args.seconds)
    # Piped output (CI logs, tee) gets room for whole store URIs, not 80 columns.
    console = Console() if sys.stdout.isatty() else Console(width=200)
    runs = []
    for uri in args.store:
        for clients in args.clients:
            with console.status(f"{redact(uri)}: {clients} client(s), {args.seconds:g}s"):
                runs.append(race(uri, [args.shard] * clients, args.seconds, args.bytes))
    table = Table(title=f"compare-and-set on one shard, {args.seconds:g}s per run")
    for column in (
        "store",
        "clients",
        "committed/s",
        "attempts/s",
        "mismatch rate",
        "CaS p50 ms",
        "CaS p99 ms",
        "errors",
    ):
        table.add_column(column, justify="left" if column == "store" else "right")
    for r in runs:
        table.add_row(
            r["store"],
            str(r["clients"]),
            f"{r['committed_per_s']:,.0f}",
            f"{r['attempts_per_s']:,.0f}",
            f"{r['mismatch_rate']:.1%}",
            f"{r['cas_ms_p50']:.2f}",
            f"{r['cas_ms_p99']:.2f}",
            str(r["errors"]),
        )
    console.print(table)
    if args.json:
        args.json.write_text(json.dumps({"runs": runs}, indent=2) + "\n")
        console.print(f"figures written to {args.json}")
    return 0
