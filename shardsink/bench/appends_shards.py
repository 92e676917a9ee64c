"""``shardsink bench appends --shards S[,S...] [--clients C[,C...]]
[--processes P[,P...]]``: many shards through one consensus server against
raw compare-and-set on the same store, in the same run.

For each ``--store``, each shard count S, client count C (C >= S; without
``--clients``, one client per shard) and process count P (without
``--processes``, P = C), C clients append for ``--seconds``, client i to
shard i mod S:

- ``server``: through one consensus server on the store (loopback
  ``tcp://`` with CURVE, as a server on another machine's clients is
  reached), each append a 4-row inline batch; the C clients run in P
  processes, client i in process i mod P, a thread each (a process holding
  several shards' writers, as a sink with several collections does);
- ``raw``: each client, a process of its own, compare-and-sets its shard's
  versions straight on the store, payloads of the server run's mean diff size.

``--repeats`` runs each that many times, the two variants in turn.
Reported: appends (committed versions) per second, the server's share of
raw, the server's CPU time per append (user + system of its process over
the measured seconds, ``psutil``) and its request loop's alone (its main
thread; the rest is maintenance: the spine's merges, GC, expiry, and
ZeroMQ's I/O thread), the clients' CPU time per append (every client
process's over its loop) and how much of it built the batches
(``Writer.batch``, before the append is sent, each thread's CPU), append
latency p50 and p99. ``--out DIR`` writes ``results.json``, ``report.md``
and ``appends.png``.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import statistics
import tempfile
import uuid
from pathlib import Path

from .._curve import KEYS_ENV
from .._figures import report_head
from ..storage import BLOB_ENV, STORE_ENV, redact
from . import clients as racing
from .appends import AppendsClient, IntervalsClient
from .consensus import race as raw_race
from .showing import Status

#: The columns of the console table and of ``report.md``: header, key, format.
COLUMNS = [
    ("store", "store", "{}"),
    ("shards", "shards", "{}"),
    ("clients", "clients", "{}"),
    ("processes", "processes", "{}"),
    ("server appends/s", "server_per_s", "{:,.0f}"),
    ("raw CaS/s", "raw_per_s", "{:,.0f}"),
    ("server/raw", "ratio", "{:.2f}"),
    ("server CPU ms/append", "server_cpu_ms", "{:.3f}"),
    ("loop CPU ms/append", "loop_cpu_ms", "{:.3f}"),
    ("client CPU ms/append", "client_cpu_ms", "{:.3f}"),
    ("of it building", "build_cpu_ms", "{:.3f}"),
    ("p50 ms", "append_ms_p50", "{:.2f}"),
    ("p99 ms", "append_ms_p99", "{:.2f}"),
    ("raw p50 ms", "raw_ms_p50", "{:.2f}"),
    ("CaS mismatches", "cas_mismatches", "{}"),
]


def runs_of(
    shards: list[int], clients: list[int] | None, processes: list[int] | None = None
) -> list[tuple[int, int, int]]:
    """The ``(shards, clients, processes)`` runs (without ``clients``, one
    client per shard; without ``processes``, a process per client; never
    more processes than clients); ``ValueError`` if a run would leave a
    shard without a client."""
    out = []
    for s in shards:
        for c in clients or [s]:
            if c < s:
                raise ValueError(
                    f"--clients {c} is fewer than --shards {s}: every shard needs a client "
                    "(client i appends to shard i mod S)"
                )
            out += [(s, c, min(p, c)) for p in processes or [c]]
    return list(dict.fromkeys(out))


def server_run(
    server: tuple[str, int, str],
    blob: str,
    shards: int,
    clients: int,
    seconds: float,
    processes: int,
) -> dict:
    """``clients`` writers appending 4-row inline batches through the
    ``server`` (its address, its pid, its CURVE key directory) to ``shards``
    fresh shards, in ``processes`` processes (client i in process i mod P),
    a thread per writer; the server's CPU seconds over the measured time
    come from its pid."""
    import psutil

    address, pid, keys = server
    process = psutil.Process(pid)
    prefix = f"bench-s{shards}-c{clients}-{uuid.uuid4().hex[:8]}"
    cpu: list[float] = []
    loop: list[float] = []  # its main thread: the request loop, where group commit runs

    def sample() -> None:
        times = process.cpu_times()
        cpu.append(times.user + times.system)
        main = next(t for t in process.threads() if t.id == pid)
        loop.append(main.user_time + main.system_time)

    names = [f"{prefix}-{i % shards}" for i in range(clients)]
    reports = racing.race(
        "shardsink.bench.appends:_client",
        [AppendsClient(names[p::processes], seconds) for p in range(processes)],
        seconds,
        f"server appends, {shards} shard(s)",
        env={BLOB_ENV: blob, STORE_ENV: address, KEYS_ENV: keys},
        on_go=sample,
    )
    sample()
    latencies = sorted(x for r in reports for x in r["latencies_us"])
    appended = sum(r["appended"] for r in reports)
    versions = sum(r["versions"] for r in reports)
    return {
        "appends": appended,
        "server_per_s": appended / seconds,
        "server_cpu_s": cpu[1] - cpu[0],
        "server_cpu_ms": (cpu[1] - cpu[0]) * 1000 / max(appended, 1),
        "loop_cpu_ms": (loop[1] - loop[0]) * 1000 / max(appended, 1),
        "client_cpu_ms": sum(r["cpu_s"] for r in reports) * 1000 / max(appended, 1),
        "build_cpu_ms": sum(r["building_s"] for r in reports) * 1000 / max(appended, 1),
        "upper_mismatches": sum(r["upper_mismatches"] for r in reports),
        "cas_mismatches": sum(r["cas_mismatches"] for r in reports),
        "diff_bytes_mean": sum(r["diff_bytes"] for r in reports) / max(versions, 1),
        "append_ms_p50": racing.quantile_ms(latencies, 0.5),
        "append_ms_p99": racing.quantile_ms(latencies, 0.99),
    }


def interval_run(
    server: tuple[str, int, str], blob: str, shards: int, seconds: float, mode: str
) -> dict:
    """One client appending intervals to ``shards`` fresh shards through
    ``server``: ``txn`` (each interval one transaction of them all) or
    ``apart`` (each interval the shards' appends one after another), side by
    side with each other; the server's CPU per shard-append, latency per
    interval."""
    import psutil

    address, pid, keys = server
    process = psutil.Process(pid)
    prefix = f"bench-{mode}-s{shards}-{uuid.uuid4().hex[:8]}"
    cpu: list[float] = []

    def sample() -> None:
        times = process.cpu_times()
        cpu.append(times.user + times.system)

    (report,) = racing.race(
        "shardsink.bench.appends:_interval_client",
        [IntervalsClient([f"{prefix}-{i}" for i in range(shards)], seconds, mode == "txn")],
        seconds,
        f"{mode} intervals of {shards} shard(s)",
        env={BLOB_ENV: blob, STORE_ENV: address, KEYS_ENV: keys},
        on_go=sample,
    )
    sample()
    appended = report["appended"]
    latencies = sorted(report["latencies_us"])
    return {
        f"{mode}_per_s": appended / seconds,
        f"{mode}_server_cpu_ms": (cpu[1] - cpu[0]) * 1000 / max(appended, 1),
        f"{mode}_client_cpu_ms": report["cpu_s"] * 1000 / max(appended, 1),
        f"{mode}_ms_p50": racing.quantile_ms(latencies, 0.5),
        f"{mode}_ms_p99": racing.quantile_ms(latencies, 0.99),
    }


def raw_run(store: str, shards: int, clients: int, seconds: float, payload_bytes: int) -> dict:
    """``clients`` processes compare-and-setting ``shards`` fresh shards on
    ``store`` directly (client i on shard i mod S)."""
    prefix = f"raw-s{shards}-c{clients}-{uuid.uuid4().hex[:8]}"
    got = raw_race(
        store, [f"{prefix}-{i % shards}" for i in range(clients)], seconds, payload_bytes
    )
    return {
        "raw_per_s": got["committed_per_s"],
        "raw_mismatches": got["mismatches"],
        "raw_errors": got["errors"],
        "raw_ms_p50": got["cas_ms_p50"],
        "raw_ms_p99": got["cas_ms_p99"],
    }


def measure(
    store: str,
    blob: str,
    scratch: Path,
    runs: list[tuple[int, int, int]],
    seconds: float,
    repeats: int,
    txn: bool = False,
) -> list[dict]:
    """Every run of ``runs`` (:func:`runs_of`) on ``store``, ``repeats``
    times, server (see :func:`server_run`) then raw (a process per client;
    its payloads the size of the server's diffs just measured), with
    ``txn`` then the intervals of :func:`interval_run`, ``txn`` and
    ``apart`` in turn; one row per run with each figure the median over its
    repeats."""
    from ..process import ConsensusProcess
    from ..server import ServeConfig

    keys = str(scratch / "keys")
    rows = []
    measured: dict[tuple[int, int, int], list[dict]] = {run: [] for run in runs}
    serving = ServeConfig(bind="tcp://127.0.0.1:0", keys=keys)
    with ConsensusProcess(store, blob, serving) as server:
        served = (server.address, server.pids()[0], keys)
        for _ in range(repeats):
            for shards, clients, processes in runs:
                got = server_run(served, blob, shards, clients, seconds, processes)
                got |= raw_run(store, shards, clients, seconds, round(got["diff_bytes_mean"]))
                if txn:
                    for mode in ("txn", "apart"):
                        got |= interval_run(served, blob, shards, seconds, mode)
                measured[(shards, clients, processes)].append(got)
    for (shards, clients, processes), repeats_of in measured.items():
        row = {"store": redact(store), "shards": shards, "clients": clients}
        row |= {"processes": processes, "seconds": seconds}
        for key in repeats_of[0]:
            row[key] = statistics.median(r[key] for r in repeats_of)
        row["ratio"] = row["server_per_s"] / row["raw_per_s"] if row["raw_per_s"] else 0.0
        row["repeats"] = repeats_of
        rows.append(row)
    return rows


def run(
    stores: list[str],
    runs: list[tuple[int, int, int]],
    seconds: float,
    repeats: int,
    *,
    txn: bool = False,
    status: Status = contextlib.nullcontext,
) -> list[dict]:
    """:func:`measure` on each store of ``stores``, its blob store a scratch
    directory removed afterwards; the rows of every store in turn.
    ``ValueError`` for a non-positive ``seconds`` or a store client
    processes cannot share, before anything runs."""
    racing.check_stores(stores, seconds)
    rows: list[dict] = []
    scratch = Path(tempfile.mkdtemp(prefix="shardsink-bench-shards-"))
    blob = f"file://{scratch}/blob"
    try:
        for store in stores:
            with status(f"{redact(store)}: {len(runs)} run(s) x {repeats}"):
                rows += measure(store, blob, scratch, runs, seconds, repeats, txn=txn)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return rows


def save(rows: list[dict], out: Path, command: str, elapsed_s: float) -> Path:
    """Write ``results.json`` (``command`` and ``rows``), ``report.md``
    (:func:`write_report`) and ``appends.png`` (:func:`plot`) into ``out``,
    made if missing; the report's path."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(
        json.dumps({"command": command, "runs": rows}, indent=2) + "\n"
    )
    report = write_report(rows, out, command, elapsed_s)
    plot(rows, out / "appends.png")
    return report


#: ``--txn``'s columns: each interval one transaction of all S shards against
#: the same intervals as S appends one after another (one client each).
TXN_COLUMNS = [
    ("store", "store", "{}"),
    ("shards", "shards", "{}"),
    ("txn shard-appends/s", "txn_per_s", "{:,.0f}"),
    ("apart shard-appends/s", "apart_per_s", "{:,.0f}"),
    ("txn server CPU ms/shard-append", "txn_server_cpu_ms", "{:.3f}"),
    ("apart server CPU ms/shard-append", "apart_server_cpu_ms", "{:.3f}"),
    ("txn p50 / p99 ms", ("txn_ms_p50", "txn_ms_p99"), "{:.2f}"),
    ("apart p50 / p99 ms", ("apart_ms_p50", "apart_ms_p99"), "{:.2f}"),
]


def txn_rows(rows: list[dict]) -> list[list[str]]:
    def cell(row: dict, key, fmt: str) -> str:
        if isinstance(key, tuple):
            return " / ".join(fmt.format(row[k]) for k in key)
        return fmt.format(row[key])

    return [[cell(r, key, fmt) for _, key, fmt in TXN_COLUMNS] for r in rows if "txn_per_s" in r]


def table_rows(rows: list[dict]) -> list[list[str]]:
    return [[fmt.format(row[key]) for _, key, fmt in COLUMNS] for row in rows]


def write_report(rows: list[dict], out: Path, command: str, elapsed_s: float) -> Path:
    """``report.md``: the command, the machine, the table and the plot."""
    lines = [
        *report_head("shardsink bench appends --shards", command, elapsed_s),
        "Each row: the median of its repeats; `server/raw` is the server's appends/s "
        "over raw compare-and-sets/s on the same store in the same run.",
        "",
        "| " + " | ".join(h for h, _, _ in COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    lines += ["| " + " | ".join(cells) + " |" for cells in table_rows(rows)]
    if any("txn_per_s" in r for r in rows):
        lines += [
            "", "One interval of S shards: one transaction of them all against S appends one "
            "after another (one client each; latency per interval).", "",
            "| " + " | ".join(h for h, _, _ in TXN_COLUMNS) + " |", "|" + "---|" * len(TXN_COLUMNS),
        ]  # fmt: skip
        lines += ["| " + " | ".join(cells) + " |" for cells in txn_rows(rows)]
    lines += ["", "![appends/s and server CPU per append](appends.png)", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path


def plot(rows: list[dict], path: Path) -> Path:
    """Appends/s (server and raw) and server CPU per append against shards."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for k, series in enumerate(dict.fromkeys(_series(r) for r in rows)):
        mine = [r for r in rows if _series(r) == series]
        xs = [r["shards"] for r in mine]
        label = f"{re.sub(r'[?].*', '', series[0])[:40]}, {series[1]}"
        axes[0].plot(xs, [r["server_per_s"] for r in mine], "o-", color=f"C{k}", label=label)
        axes[0].plot(
            xs, [r["raw_per_s"] for r in mine], "s:", color=f"C{k}", label=f"{label}: raw CaS"
        )
        axes[1].plot(xs, [r["server_cpu_ms"] for r in mine], "o-", color=f"C{k}", label=label)
        axes[1].plot(
            xs, [r["loop_cpu_ms"] for r in mine], "^--", color=f"C{k}", label=f"{label}: loop"
        )
    for ax, title in zip(axes, ("appends/s", "server CPU ms per append"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("shards (one server)")
        ax.set_title(title)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _series(row: dict) -> tuple[str, str]:
    """A plot's line: the store and how its clients ran."""
    if row["processes"] == row["clients"]:
        return row["store"], "a process per client"
    return row["store"], f"{row['processes']} client processes"
