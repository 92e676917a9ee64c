"""``shardsink bench appends``: compare-and-append throughput, in-process
machine against the consensus server, on the same store.

For each ``--store`` and client count C, C client processes append to one
shard for ``--seconds``, each interval a 4-row inline batch: once with each
client applying commands itself over the store (``local``: every client runs
its own compare-and-set loop, so they race), and once through a consensus
server started on that store (``server``: one process serializes the
commands). Reported: successful appends per second, upper mismatches (another
client appended that interval first; inherent to racing writers) and
compare-and-set mismatches at the store (lost races inside the machine; the
server should have none).

``--blob-parts`` makes each append one part in blob instead (a Parquet file
of the same 4 rows), so the server looks it up before it commits (one
``stat`` per part); ``--part-checks both`` runs a second server on the same
store with the lookup off (``--no-check-parts``), the two taking turns for
each client count, to show what the lookup costs.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import threading
import time
import uuid
from pathlib import Path

import msgspec

from ..storage import BLOB_ENV, STORE_ENV
from . import clients as racing
from .showing import Status


class AppendsClient(msgspec.Struct, forbid_unknown_fields=True):
    """An appending client's payload: a writer of each shard of ``shards``
    appending for ``seconds``, each append one blob part with
    ``blob_parts``, else one inline part."""

    shards: list[str]
    seconds: float
    blob_parts: bool = False


class IntervalsClient(msgspec.Struct, forbid_unknown_fields=True):
    """An interval client's payload: intervals of every shard of ``shards``
    appended for ``seconds``, each one transaction of them all with ``txn``,
    else their appends one after another."""

    shards: list[str]
    seconds: float
    txn: bool


def _client(payload: AppendsClient) -> None:
    """One appending client process (see :mod:`shardsink.bench.clients`):
    one writer per shard of ``payload``, each appending in a thread of its
    own (a process holding several shards' writers, as a sink with several
    collections does). The URIs come in the environment (``BLOB_ENV``,
    ``STORE_ENV``)."""
    with contextlib.ExitStack() as stack:
        appenders = [_Appender(stack, name, payload.blob_parts) for name in payload.shards]
        if not racing.ready():
            return
        cpu_started = time.process_time()
        end = time.monotonic() + payload.seconds
        threads = [threading.Thread(target=a.run_apart, args=(end,)) for a in appenders[1:]]
        for thread in threads:
            thread.start()
        appenders[0].run(end)
        for thread in threads:
            thread.join()
        cpu_s = time.process_time() - cpu_started
        for appender in appenders:
            if appender.error is not None:  # the client fails, as with one shard
                raise appender.error
        counts = [a.counts() for a in appenders]
        racing.report(
            {key: sum(c[key] for c in counts) for key in counts[0]}
            | {"latencies_us": [x for a in appenders for x in a.latencies_us], "cpu_s": cpu_s}
        )


class _Appender:
    """One shard's writer in a bench client: opened (and one interval
    appended) on construction, so the measured loop (:meth:`run`) starts warm."""

    def __init__(self, stack: contextlib.ExitStack, name: str, blob_parts: bool) -> None:
        from ..connect import open_shard
        from ..persist import ShardConfig, UpperMismatch
        from ..workloads import Workload

        self.workload = Workload("trickle", rows_per_interval=4, interval_ms=1)
        inline = 0 if blob_parts else ShardConfig().inline_max_bytes
        self.shard = stack.enter_context(
            open_shard(
                name,
                blob=os.environ[BLOB_ENV],
                consensus=os.environ[STORE_ENV],
                config=ShardConfig(inline_max_bytes=inline),
                create=True,
            )
        )
        self.writer = self.shard.writer()
        # one interval appended before the clock starts: a process's first
        # batch cost 25 ms of CPU (Arrow's kernels set up), 37 times a later
        # one, more than a short run's own share of a client's appends
        with contextlib.suppress(UpperMismatch):  # another client of the shard was first
            self.writer.compare_and_append(
                [self.writer.batch(self.workload.updates(0), 0, 1)], 0, 1
            )
        self.appended = self.upper_mismatches = 0
        self.latencies_us: list[int] = []
        self.building_s = 0.0  # this thread's CPU building batches, apart from appending them
        self.error: Exception | None = None

    def run_apart(self, end: float) -> None:
        """:meth:`run` in a thread of its own, keeping what it raised in ``error``."""
        try:
            self.run(end)
        except Exception as exc:
            self.error = exc

    def run(self, end: float) -> None:
        """Append one interval after another until ``end`` (``time.monotonic``)."""
        from ..persist import UpperMismatch

        upper = self.shard.state(refresh=True).upper
        while time.monotonic() < end:
            building = time.thread_time()
            batch = self.writer.batch(self.workload.updates(upper), upper, upper + 1)
            self.building_s += time.thread_time() - building
            started = time.perf_counter()
            try:
                upper = self.writer.compare_and_append([batch], upper, upper + 1)
                self.appended += 1
            except UpperMismatch as exc:
                self.upper_mismatches += 1
                upper = exc.actual
            self.latencies_us.append(round((time.perf_counter() - started) * 1e6))

    def counts(self) -> dict[str, int | float]:
        stats = self.shard.stats()
        return {
            "appended": self.appended,
            "upper_mismatches": self.upper_mismatches,
            "cas_mismatches": stats.cas_mismatches,
            "versions": stats.versions,
            "diff_bytes": stats.diff_bytes,
            "building_s": self.building_s,
        }


def _interval_client(payload: IntervalsClient) -> None:
    """One client process appending intervals of 4-row inline batches to
    every shard of ``payload`` for its seconds: with ``txn``, each interval
    one transaction of all the shards (``open_shards``); else each interval
    the shards' appends one after another. Reports shard-appends, and each
    interval's latency."""
    from ..connect import open_shards
    from ..persist import ShardConfig
    from ..workloads import Workload

    names, seconds, txn = payload.shards, payload.seconds, payload.txn
    workload = Workload("trickle", rows_per_interval=4, interval_ms=1)
    with open_shards(
        dict.fromkeys(names), blob=os.environ[BLOB_ENV], consensus=os.environ[STORE_ENV],
        config=ShardConfig(), create=True,
    ) as shards:  # fmt: skip
        upper, _ = _interval(shards, names, workload, 0, txn)  # warm, before the clock
        if not racing.ready():
            return
        latencies, building, cpu_started = [], 0.0, time.process_time()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            started = time.perf_counter()
            upper, built = _interval(shards, names, workload, upper, txn)
            building += built
            latencies.append(round((time.perf_counter() - started) * 1e6))
        cpu_s = time.process_time() - cpu_started
        stats = [shards.shard(n).stats() for n in names]
        racing.report({
            "appended": len(latencies) * len(names), "upper_mismatches": 0,
            "cas_mismatches": sum(s.cas_mismatches for s in stats),
            "versions": sum(s.versions for s in stats),
            "diff_bytes": sum(s.diff_bytes for s in stats),
            "building_s": building, "latencies_us": latencies, "cpu_s": cpu_s,
        })  # fmt: skip


def _interval(shards, names: list[str], workload, upper: int, txn: bool):
    """Append interval ``[upper, upper + 1)`` to every shard of ``names``
    (one transaction, or one append each); the new upper, and the thread's
    CPU seconds spent building batches."""
    building = time.thread_time()
    table = workload.updates(upper)
    if txn:
        transaction = shards.transaction()
        for name in names:
            transaction.append(name, table, upper, upper + 1)
        built = time.thread_time() - building
        new = max(transaction.commit().values())
    else:
        batches = {n: shards.writer(n).batch(table, upper, upper + 1) for n in names}
        built = time.thread_time() - building
        for name, batch in batches.items():
            new = shards.writer(name).compare_and_append([batch], upper, upper + 1)
    return new, built


def measure(
    store: str,
    via: str,
    consensus: str,
    blob: str,
    n: int,
    seconds: float,
    *,
    blob_parts: bool = False,
) -> dict:
    """One run: ``n`` clients appending through ``consensus`` for ``seconds``
    (one blob part each with ``blob_parts``, else one inline part)."""
    shard = f"bench-{re.sub('[^A-Za-z0-9]+', '-', via)}-{n}-{uuid.uuid4().hex[:8]}"
    parts = "blob" if blob_parts else "inline"
    reports = racing.race(
        "shardsink.bench.appends:_client",
        [AppendsClient([shard], seconds, blob_parts) for _ in range(n)],
        seconds,
        f"{via} appends on {store}",
        env={BLOB_ENV: blob, STORE_ENV: consensus},
    )
    latencies = sorted(x for r in reports for x in r["latencies_us"])
    appended = sum(r["appended"] for r in reports)
    return {
        "store": store,
        "via": via,
        "parts": parts,
        "clients": n,
        "seconds": seconds,
        "appends": appended,
        "appends_per_s": appended / seconds,
        "upper_mismatches": sum(r["upper_mismatches"] for r in reports),
        "cas_mismatches": sum(r["cas_mismatches"] for r in reports),
        "append_ms_p50": racing.quantile_ms(latencies, 0.5),
        "append_ms_p99": racing.quantile_ms(latencies, 0.99),
    }


def run(
    stores: list[str],
    clients: list[int],
    seconds: float,
    *,
    blob_parts: bool = False,
    unchecked: bool = False,
    status: Status = contextlib.nullcontext,
) -> list[dict]:
    """For each store of ``stores`` and client count of ``clients``, a
    :func:`measure` of its clients appending ``local`` (each over the store
    itself) and through a consensus server on it (``server``; with
    ``unchecked``, also ``server, no part checks``, through a second server
    that does not look parts up), those taking turns for each count. Each
    run's ``ratio_to_local`` is its appends/s over ``local``'s of the same
    store and count. ``ValueError`` for a non-positive ``seconds`` or a store
    client processes cannot share, before anything runs."""
    from ..process import ConsensusProcess
    from ..server import ServeConfig
    from ..storage import redact

    racing.check_stores(stores, seconds)
    runs = []
    scratch = Path(tempfile.mkdtemp(prefix="shardsink-bench-appends-"))
    try:
        blob = f"file://{scratch}/blob"
        for store in stores:
            shown = redact(store)
            with contextlib.ExitStack() as servers:
                via = {"local": store}
                checks = {"server": True}
                if unchecked:
                    checks["server, no part checks"] = False
                for i, (name, check_parts) in enumerate(checks.items()):
                    bind = f"ipc://{scratch}/sock/consensus-{i}"
                    serving = ServeConfig(bind=bind, check_parts=check_parts)
                    server = servers.enter_context(ConsensusProcess(store, blob, serving))
                    via[name] = server.address
                for n in clients:
                    for name, consensus in via.items():
                        with status(f"{shown}: {name}, {n} client(s)"):
                            got = measure(
                                shown, name, consensus, blob, n, seconds, blob_parts=blob_parts
                            )
                        runs.append(got)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    local = {(r["store"], r["clients"]): r["appends_per_s"] for r in runs if r["via"] == "local"}
    for r in runs:
        base = local.get((r["store"], r["clients"])) or float("nan")
        r["ratio_to_local"] = r["appends_per_s"] / base
    return runs
