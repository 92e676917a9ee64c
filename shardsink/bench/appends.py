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

import argparse
import contextlib
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from ..storage.uri import BLOB_ENV, STORE_ENV
from . import appends_shards
from . import clients as racing


def register(bench: argparse._SubParsersAction) -> None:
    parser = bench.add_parser(
        "appends",
        help="compare-and-append throughput: in-process machine vs consensus server",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    racing.add_race_arguments(parser)
    parser.add_argument(
        "--blob-parts",
        action="store_true",
        help="each append one blob part instead of an inline one",
    )
    parser.add_argument(
        "--part-checks",
        choices=("on", "both"),
        default="on",
        help="both: also through a server that does not look parts up (default on)",
    )
    parser.add_argument(
        "--shards",
        type=racing.counts,
        metavar="S[,S...]",
        help="many shards through one server against raw compare-and-set on the same store "
        "(--clients: clients per run, default one per shard; see appends_shards)",
    )
    parser.add_argument(
        "--processes",
        type=racing.counts,
        metavar="P[,P...]",
        help="with --shards: the server runs' clients in P processes, a thread each "
        "(default: a process per client; raw compare-and-set always has one per client)",
    )
    parser.add_argument(
        "--repeats", type=int, default=1, help="with --shards: runs of each pair (default 1)"
    )
    parser.add_argument(
        "--txn",
        action="store_true",
        help="with --shards S: also one client appending an interval to all S shards as one "
        "transaction, against the same intervals as S appends one after another, side by side",
    )
    parser.add_argument(
        "--out", type=Path, metavar="DIR", help="with --shards: results.json, report.md, plot"
    )
    # None tells --shards runs that --clients was not given (one client per shard)
    parser.set_defaults(func=_run, clients=None)


def _client(argv: list[str]) -> None:
    """One appending client process (see :mod:`shardsink.bench.clients`):
    one writer per shard of the comma-separated ``argv[0]``, each appending
    in a thread of its own (a process holding several shards' writers, as a
    sink with several collections does). The URIs come in the environment
    (``BLOB_ENV``, ``STORE_ENV``)."""
    names, seconds, blob_parts = argv[0].split(","), float(argv[1]), argv[2] == "blob"
    with contextlib.ExitStack() as stack:
        appenders = [_Appender(stack, name, blob_parts) for name in names]
        if not racing.ready():
            return
        cpu_started = time.process_time()
        end = time.monotonic() + seconds
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


def _interval_client(argv: list[str]) -> None:
    """One client process appending intervals of 4-row inline batches to
    every shard of the comma-separated ``argv[0]`` for ``argv[1]`` seconds:
    ``argv[2]`` ``txn``, each interval one transaction of all the shards
    (``open_shards``); ``apart``, each interval the shards' appends one
    after another. Reports shard-appends, and each interval's latency."""
    from ..connect import open_shards
    from ..persist import ShardConfig
    from ..workloads import Workload

    names, seconds, txn = argv[0].split(","), float(argv[1]), argv[2] == "txn"
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
        [[shard, str(seconds), parts] for _ in range(n)],
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


def _run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from ..process import ConsensusProcess
    from ..server.config import ServeConfig
    from ..storage.uri import redact

    if args.shards:
        if args.blob_parts or args.part_checks != "on":
            raise ValueError("--shards runs inline appends: drop --blob-parts and --part-checks")
        return appends_shards.run(args)
    if args.out or args.repeats != 1 or args.processes is not None:
        raise ValueError("--out, --processes and --repeats go with --shards")
    args.clients = args.clients or [1, 4]
    racing.check_stores(args.store, args.seconds)
    console = Console() if sys.stdout.isatty() else Console(width=200)
    runs = []
    scratch = Path(tempfile.mkdtemp(prefix="shardsink-bench-appends-"))
    try:
        blob = f"file://{scratch}/blob"
        for store in args.store:
            shown = redact(store)
            with contextlib.ExitStack() as servers:
                via = {"local": store}
                checks = {"server": True}
                if args.part_checks == "both":
                    checks["server, no part checks"] = False
                for i, (name, check_parts) in enumerate(checks.items()):
                    bind = f"ipc://{scratch}/sock/consensus-{i}"
                    serving = ServeConfig(bind=bind, check_parts=check_parts)
                    server = servers.enter_context(ConsensusProcess(store, blob, serving))
                    via[name] = server.address
                for n in args.clients:
                    for name, consensus in via.items():
                        with console.status(f"{shown}: {name}, {n} client(s)"):
                            runs.append(
                                measure(
                                    shown,
                                    name,
                                    consensus,
                                    blob,
                                    n,
                                    args.seconds,
                                    blob_parts=args.blob_parts,
                                )
                            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    parts = "one blob part" if args.blob_parts else "one inline part"
    table = Table(title=f"compare-and-append on one shard, {parts} each, {args.seconds:g}s per run")
    for column in (
        "store", "via", "clients", "appends/s", "server/local", "upper mismatches",
        "CaS mismatches", "p50 ms", "p99 ms",
    ):  # fmt: skip
        table.add_column(column, justify="left" if column in ("store", "via") else "right")
    local = {(r["store"], r["clients"]): r["appends_per_s"] for r in runs if r["via"] == "local"}
    for r in runs:
        base = local.get((r["store"], r["clients"])) or float("nan")
        r["ratio_to_local"] = r["appends_per_s"] / base
        table.add_row(
            r["store"], r["via"], str(r["clients"]), f"{r['appends_per_s']:,.0f}",
            f"{r['ratio_to_local']:.2f}", str(r["upper_mismatches"]), str(r["cas_mismatches"]),
            f"{r['append_ms_p50']:.2f}", f"{r['append_ms_p99']:.2f}",
        )  # fmt: skip
    console.print(table)
    if args.json:
        args.json.write_text(json.dumps({"runs": runs}, indent=2) + "\n")
        console.print(f"figures written to {args.json}")
    return 0
