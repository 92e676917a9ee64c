"""``shardsink bench consensus``: compare-and-set throughput under contention.

For each ``--store`` and each client count C, C client processes (each with its
own store opened from the URI) race to append to one shard for ``--seconds``:
read the head once, then compare-and-set ``head + 1``; on a mismatch retry from
the head the mismatch carries. Reported per run: committed versions per second,
compare-and-set attempts per second, the share of attempts that mismatched,
and the compare-and-set latency.
"""

from __future__ import annotations

import contextlib
import os
import time

import msgspec

from ..storage import (
    STORE_ENV,
    Committed,
    Consensus,
    StorageError,
    VersionedData,
    open_consensus,
    redact,
)
from . import clients as racing
from .showing import Status


class ConsensusClient(msgspec.Struct, forbid_unknown_fields=True):
    """A client's payload: compare-and-set ``shard`` for ``seconds``, each
    version ``payload_bytes`` long and marked as client ``client``'s."""

    shard: str
    client: int
    payload_bytes: int
    seconds: float


def _client(payload: ConsensusClient) -> None:
    """A client process (see :mod:`shardsink.bench.clients`): open the store,
    say ``ready``, wait for ``go`` on stdin, race as ``payload`` says, print
    the counts as one JSON line. The store's URI comes in the environment
    (``STORE_ENV``)."""
    shard, client, payload_bytes = payload.shard, payload.client, payload.payload_bytes
    seconds = payload.seconds
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
        [ConsensusClient(shard, c, payload_bytes, seconds) for c, shard in enumerate(shards)],
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


def run(
    stores: list[str],
    clients: list[int],
    seconds: float,
    shard: str,
    payload_bytes: int,
    *,
    status: Status = contextlib.nullcontext,
) -> list[dict]:
    """:func:`race` on ``shard`` of each store of ``stores`` with each
    client count of ``clients``, in that order, one after another.
    ``ValueError`` for a non-positive ``seconds`` or a store client
    processes cannot share, before anything runs (``RuntimeError`` as
    :func:`race`'s)."""
    racing.check_stores(stores, seconds)
    runs = []
    for uri in stores:
        for n in clients:
            with status(f"{redact(uri)}: {n} client(s), {seconds:g}s"):
                runs.append(race(uri, [shard] * n, seconds, payload_bytes))
    return runs
