"""The one harness every peer runs in: worker processes released together
for each interval, the interval committed the peer's way, the table read
back and compared with the workload's expected collection.

The driver (this process) starts ``groups * workers`` worker processes
(:mod:`.worker`), waits until every one has opened the table, then for
each interval sends each a :class:`~.wire.Go` and waits for every answer;
for a ``coalesced`` or ``per-interval`` peer it then commits the interval
itself. An interval's latency runs from its release to its commit (every
worker's, for ``per-worker``), as a cluster's append latency runs from
its mint to its append at ``--pace max``; the run is closed loop.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import msgspec
import pyarrow as pa

from ..._histograms import Latencies
from ...persist import parts as P
from ...workloads import Workload
from ..clients import START_TIMEOUT_S
from .formats import COMMIT_RETRIES, Committer, Format, Stored
from .registry import format_named
from .wire import Committed, FromWorker, Go, Handed, Outcome, Ready, Written, receive, send
from .worker import Commit, WorkerSpec

#: The most one interval may take, all its commits and retries included.
INTERVAL_TIMEOUT_S = 600.0
#: How long workers get to exit once told to stop.
STOP_TIMEOUT_S = 10.0
#: No interval is released after a run has written this long: with 32
#: committers released together, iceberg-per-worker took 35 s an interval
#: at the median and 58 s at p99 (4x8 R=128, 5 intervals, 780 lost races
#: retried after pyiceberg's backoff of 100 ms doubling; by hand), so 20
#: intervals would take one run a quarter of an hour.
RUN_BUDGET_S = 60.0


class Peer(NamedTuple):
    """A peer: its table format and how it commits an interval."""

    format: str
    commit: Commit


#: Every peer by its mode name (``bench cluster``'s ``mode``).
PEERS = {
    "delta-per-worker": Peer("delta", "per-worker"),
    "delta-per-interval": Peer("delta", "per-interval"),
    "delta-coalesced": Peer("delta", "coalesced"),
    "iceberg-per-worker": Peer("iceberg", "per-worker"),
    "iceberg-coalesced": Peer("iceberg", "coalesced"),
}
#: What each reply of a way of committing is.
_REPLY = {"per-worker": Committed, "per-interval": Written, "coalesced": Handed}


def peer_of(mode: str) -> Peer:
    """The peer ``mode`` names; ``ValueError`` for an unknown one."""
    if mode not in PEERS:
        raise ValueError(f"unknown peer mode {mode!r}; choose one of {', '.join(PEERS)}")
    return PEERS[mode]


class Writing(NamedTuple):
    """What writing the intervals did: the intervals written, rows written,
    every commit's outcome, each interval's latency and the wall time."""

    intervals: int
    rows: int
    outcomes: list[Outcome]
    latencies: Latencies
    wall_s: float


def run_peer(
    mode: str,
    groups: int,
    workers: int,
    workload: Workload,
    intervals: int,
    location: Path,
    retries: int = COMMIT_RETRIES,
    budget_s: float = RUN_BUDGET_S,
) -> dict:
    """Write ``intervals`` intervals of ``workload`` with ``groups *
    workers`` worker processes into a new table of peer ``mode`` at
    ``location``, releasing none after ``budget_s`` seconds of writing
    (``appends``: the intervals written); return the run's figures (see the
    package doc).
    ``ValueError`` for an unknown mode or a ``location`` that is not empty;
    ``RuntimeError`` naming the worker that failed or did not answer."""
    peer = peer_of(mode)
    if location.exists() and any(location.iterdir()):
        raise ValueError(f"peer table directory {location} is not empty")
    location.mkdir(parents=True, exist_ok=True)
    table_format = format_named(peer.format)
    table_format.create(location, retries)
    spec = WorkerSpec(
        format=peer.format,
        commit=peer.commit,
        location=str(location),
        worker=0,
        workers=groups * workers,
        workload=workload,
        retries=retries,
    )
    written = _write(spec, table_format, intervals, budget_s)
    return _figures(
        mode, groups, workers, workload, intervals, table_format.stored(location), written
    )


def _write(spec: WorkerSpec, table_format: Format, intervals: int, budget_s: float) -> Writing:
    """Every interval (none after ``budget_s``), released to every worker
    together, committed the peer's way; the driver's committer is opened
    before the first."""
    latencies = Latencies()
    outcomes: list[Outcome] = []
    rows = 0
    with _started(spec) as procs:
        committer = None
        if spec.commit != "per-worker":
            committer = table_format.open(Path(spec.location), spec.retries)
        started = time.perf_counter()
        done = 0
        while done < intervals and (not done or time.perf_counter() - started < budget_s):
            i, t0 = done, time.perf_counter()
            for proc in procs:
                send(proc.stdin, Go(interval=i))
            deadline = time.monotonic() + INTERVAL_TIMEOUT_S
            replies = [_reply(proc, w, i, spec.commit, deadline) for w, proc in enumerate(procs)]
            rows += sum(r.rows for r in replies)
            outcomes += _commit(spec.commit, committer, replies)
            latencies.record((time.perf_counter() - t0) * 1000)
            done += 1
        wall_s = time.perf_counter() - started
    return Writing(done, rows, outcomes, latencies, wall_s)


def _reply(
    proc: subprocess.Popen, worker: int, interval: int, commit: Commit, deadline: float
) -> FromWorker:
    """Worker ``worker``'s answer for ``interval``; ``RuntimeError`` if it is
    late, gone, or not the answer of a ``commit`` peer."""
    who = f"peer worker {worker} at interval {interval}"
    reply = receive(proc.stdout.fileno(), deadline, who)
    if not isinstance(reply, _REPLY[commit]) or reply.interval != interval:
        raise RuntimeError(f"{who} answered {reply!r}")
    return reply


def _commit(commit: Commit, committer: Committer | None, replies: list) -> list[Outcome]:
    """The outcomes of an interval's commits: the workers' own, or the
    driver's one commit of their rows (``coalesced``: one file) or files."""
    if commit == "per-worker":
        return [r.outcome for r in replies if r.rows]
    if commit == "coalesced":
        tables = [pa.ipc.open_stream(r.ipc).read_all() for r in replies if r.rows]
        return [committer.append(pa.concat_tables(tables))] if tables else []  # type: ignore[union-attr]
    files = [r.file for r in replies if r.file is not None]
    return [committer.commit_files(files)] if files else []  # type: ignore[union-attr]


@contextlib.contextmanager
def _started(spec: WorkerSpec) -> Iterator[list[subprocess.Popen]]:
    """The workers of ``spec``, each ready (its table open); on the way out
    told to stop, and killed if they do not, every one reaped."""
    code = "import sys; from shardsink.bench.peers.worker import main; main(sys.argv[1:])"
    procs: list[subprocess.Popen] = []
    try:
        for w in range(spec.workers):
            argv = msgspec.json.encode(msgspec.structs.replace(spec, worker=w)).decode()
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", code, argv],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    bufsize=0,
                )
            )
        deadline = time.monotonic() + START_TIMEOUT_S * (1 + spec.workers / 16)
        for w, proc in enumerate(procs):
            if not isinstance(receive(proc.stdout.fileno(), deadline, f"peer worker {w}"), Ready):
                raise RuntimeError(f"peer worker {w} did not start")
        yield procs
    finally:
        for proc in procs:
            proc.stdin.close()  # end of input: a worker stops
        for proc in procs:
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            proc.stdout.close()


def _figures(
    mode: str,
    groups: int,
    workers: int,
    workload: Workload,
    intervals: int,
    stored: Stored,
    written: Writing,
) -> dict:
    """The run's figures, in ``results.json``'s field names where they mean
    the same (docs/architecture.md section 10): ``blob_puts`` are the data
    files written, ``diff_bytes_per_append`` the metadata bytes per
    interval; ``appends`` the intervals written (fewer than ``intervals``
    past the budget); and whether the table read back equals the expected
    collection of the intervals written."""
    as_of = max(written.intervals * workload.interval_ms - 1, 0)
    expected = workload.expected(written.intervals)
    got = P.at_time(stored.rows, as_of)
    failed = [o.error for o in written.outcomes if o.error]
    per = max(written.intervals, 1)
    latency = written.latencies.distribution()
    row = {
        "mode": mode,
        "groups": groups,
        "workers": workers,
        "workload": workload.name,
        "rows_per_interval": workload.rows_per_interval,
        "intervals": intervals,
        "snapshot_rows": workload.snapshot_rows,
        "appends": written.intervals,
        "commits": stored.commits,
        "cas_per_append": stored.commits / per,
        "blob_puts": stored.data_files,
        "blob_put_bytes": stored.data_bytes,
        "files_per_interval": stored.data_files / per,
        "data_parts_per_append": stored.data_files / per,
        "inline_parts_per_append": 0.0,
        "inline_bytes_per_append": 0.0,
        "metadata_files": stored.metadata_files,
        "diff_bytes_per_append": stored.metadata_bytes / per,
        "metadata_bytes_per_interval": stored.metadata_bytes / per,
        "commit_retries": stored.retries + sum(o.retries for o in written.outcomes),
        "commit_failures": len(failed),
        "orphan_files": stored.orphans,
        "rows": written.rows,
        "wall_s": written.wall_s,
        "rows_per_s": written.rows / written.wall_s if written.wall_s else 0.0,
        "append_latency_ms_p50": latency.p50,
        "append_latency_ms_p99": latency.p99,
        "append_latency_ms": msgspec.to_builtins(latency),
        "append_latency_hdr": written.latencies.encoded(),
        "verified": got.equals(expected),
    }
    if not row["verified"]:
        row["error"] = (
            f"the table read back holds {got.num_rows:,} rows, the workload {expected.num_rows:,}"
            + (f"; {len(failed)} commit(s) failed, the first: {failed[0]}" if failed else "")
        )
    return row
