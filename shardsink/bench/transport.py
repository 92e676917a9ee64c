"""``shardsink bench transport``: the shared-memory transport against its baselines.

For each part size a worker process sends the same record batch (shaped like
the workloads' rows) to a builder process, several repetitions of many parts;
the builder times each repetition from a shared start until it holds the last
batch. Throughput is the batch's Arrow bytes times the parts over that time;
each figure is the median over the repetitions.

- ``shm``: this transport end to end (worker encodes into its arena, builder
  reads the batch zero-copy and acknowledges), with the default inline cut-off.
- ``zmq``: the batch serialized to IPC bytes and sent with ``copy=False``
  (PUSH/PULL); the builder decodes the frame in place.
- ``queue``: a ``multiprocess.Queue`` carrying the pickled batch. This baseline,
  between the benchmark's own two processes, is the only place shardsink
  unpickles anything.
- ``memcpy``: a numpy copy of the batch's IPC bytes into a preallocated, warm
  buffer of the same size, in one process: the machine's limit. Up to 1 MiB
  source and destination stay in the caches, so this is cache bandwidth;
  ``memcpy_ring`` copies into successive slots of a warm buffer as large as an
  arena (64 MiB), the limit for a stream of parts landing in memory.

``--inline-sweep`` adds small sizes sent always inline and always through
shared memory, the measurement behind ``shardsink.shm.INLINE_MAX_BYTES``.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

SIZES = (4 << 10, 64 << 10, 1 << 20, 16 << 20)
SWEEP_SIZES = (1 << 10, 4 << 10, 16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10)
REPS = 5
BYTES_PER_REP = 64 << 20
MIN_PARTS, MAX_PARTS = 8, 2000
TIMEOUT = 60.0
_COLUMNS = ("shm", "zmq", "queue", "memcpy", "memcpy_ring")
_ROW_BYTES = 60  # int64 key, 32-char string value (+ int32 offset), uint64 ts, int64 diff
# transport -> (kind, inline_max_bytes); None keeps the default cut-off
_TRANSPORTS = {
    "shm": ("shm", None),
    "zmq": ("zmq", None),
    "queue": ("queue", None),
    "inline": ("shm", 1 << 62),
    "shm_only": ("shm", -1),
}


def make_batch(size: int) -> pa.RecordBatch:
    """A batch of workload-shaped rows (``key, val, ts, diff``) of about ``size`` Arrow bytes."""
    keys = np.arange(max(1, size // _ROW_BYTES), dtype=np.int64)
    return pa.record_batch(
        {
            "key": keys,
            "val": pa.array([format(int(k), "032x") for k in keys]),
            "ts": np.zeros(len(keys), dtype=np.uint64),
            "diff": np.ones(len(keys), dtype=np.int64),
        }
    )


def parts_per_rep(size: int) -> int:
    """How many parts of ``size`` bytes one repetition sends."""
    return min(MAX_PARTS, max(MIN_PARTS, BYTES_PER_REP // size))


def _worker(transport: str, endpoint: str, cluster: str, plan, reps: int, barrier, queue) -> None:
    """Send ``parts`` copies of a batch of each ``size`` in ``plan``, ``reps`` times."""
    from shardsink.shm import PartSender
    from shardsink.shm.arena import write_stream

    kind, inline_max = _TRANSPORTS[transport]
    with contextlib.ExitStack() as stack:
        settle = None
        if kind == "queue":
            send = queue.put
        elif kind == "zmq":
            import zmq

            ctx = stack.enter_context(zmq.Context())
            sock = stack.enter_context(ctx.socket(zmq.PUSH))
            sock.setsockopt(zmq.SNDTIMEO, int(TIMEOUT * 1000))
            sock.setsockopt(zmq.LINGER, int(TIMEOUT * 1000))
            sock.connect(endpoint)

            def send(batch: pa.RecordBatch) -> None:
                sink = pa.BufferOutputStream()
                write_stream(sink, batch)
                sock.send(sink.getvalue(), copy=False)

        else:
            options = {} if inline_max is None else {"inline_max_bytes": inline_max}
            sender = stack.enter_context(PartSender(endpoint, cluster, timeout=TIMEOUT, **options))
            send, settle = sender.send, sender.wait_acked
        for size, parts in plan:
            batch = make_batch(size)
            for _ in range(reps):
                barrier.wait(TIMEOUT)
                for _ in range(parts):
                    send(batch)
                if settle is not None:
                    settle()


def _builder(
    transport: str, endpoint: str, cluster: str, plan, reps: int, barrier, queue, out: str
) -> None:
    """Time each repetition of :func:`_worker` from the shared start to the last
    batch in hand; write the seconds per size to ``out`` as JSON."""
    from shardsink.shm import PartReceiver, decode_part

    kind, _ = _TRANSPORTS[transport]
    with contextlib.ExitStack() as stack:
        if kind == "queue":
            read = queue.get
        elif kind == "zmq":
            import zmq

            ctx = stack.enter_context(zmq.Context())
            sock = stack.enter_context(ctx.socket(zmq.PULL))
            sock.setsockopt(zmq.RCVTIMEO, int(TIMEOUT * 1000))
            sock.setsockopt(zmq.LINGER, 0)
            sock.bind(endpoint)

            def read() -> pa.RecordBatch:
                return decode_part(pa.py_buffer(sock.recv(copy=False).buffer), "zmq frame")

        else:
            receiver = stack.enter_context(PartReceiver(endpoint, cluster))

            def read() -> pa.RecordBatch:
                part = receiver.recv(TIMEOUT)
                if part is None:
                    raise TimeoutError(f"no part within {TIMEOUT}s")
                receiver.ack(part)
                return part.batch

        seconds = {}
        for size, parts in plan:
            seconds[size] = []
            for _ in range(reps):
                barrier.wait(TIMEOUT)
                start = time.perf_counter()
                for _ in range(parts):
                    read()
                seconds[size].append(time.perf_counter() - start)
    Path(out).write_text(json.dumps(seconds))


def _run_pair(transport: str, sizes, reps: int, workdir: str, cluster: str) -> dict[int, float]:
    """Median seconds per repetition for each size of one transport, worker and
    builder in their own processes."""
    import multiprocess

    ctx = multiprocess.get_context("spawn")
    endpoint = f"ipc://{workdir}/{transport}.sock"
    out = os.path.join(workdir, f"{transport}.json")
    plan = [(size, parts_per_rep(size)) for size in sizes]
    barrier = ctx.Barrier(2)
    queue = ctx.Queue() if _TRANSPORTS[transport][0] == "queue" else None
    common = (transport, endpoint, cluster, plan, reps, barrier, queue)
    procs = (
        ctx.Process(target=_builder, args=(*common, out)),
        ctx.Process(target=_worker, args=common),
    )
    try:
        for proc in procs:
            proc.start()
        deadline = time.monotonic() + TIMEOUT * 2
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        failed = [p for p in procs if p.exitcode != 0]
        if failed:
            raise RuntimeError(
                f"transport benchmark {transport!r}: process(es) "
                f"{[(p.name, p.exitcode) for p in failed]} failed or timed out"
            )
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        if queue is not None:
            queue.close()
            queue.join_thread()
    seconds = json.loads(Path(out).read_text())
    return {size: statistics.median(seconds[str(size)]) for size in sizes}


def _pair(transport: str, sizes, reps: int, workdir: str, cluster: str) -> dict[int, float]:
    """:func:`_run_pair` in a driver process of its own, so the helper process
    that ``multiprocess`` starts for spawned children ends with the driver."""
    config = json.dumps([transport, list(sizes), reps, workdir, cluster])
    try:
        done = subprocess.run(
            [sys.executable, "-m", __name__, config],
            capture_output=True,
            text=True,
            timeout=TIMEOUT * 3,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"transport benchmark {transport!r} timed out") from None
    if done.returncode != 0:
        raise RuntimeError(f"transport benchmark {transport!r} failed:\n{done.stderr[-3000:]}")
    return {int(size): secs for size, secs in json.loads(done.stdout).items()}


def _memcpy(sizes, reps: int, ring: bool) -> dict[int, float]:
    """Median seconds per repetition of copying each size's IPC bytes: into one
    warm buffer of the same size, or (``ring``) into successive slots of a warm
    buffer as large as an arena, as a stream of parts would land."""
    from shardsink.shm.arena import DEFAULT_CAPACITY, write_stream

    figures = {}
    for size in sizes:
        sink = pa.BufferOutputStream()
        write_stream(sink, make_batch(size))
        src = np.frombuffer(sink.getvalue(), dtype=np.uint8)
        slots = max(1, DEFAULT_CAPACITY // src.size) if ring else 1
        dst = np.zeros((slots, src.size), dtype=np.uint8)
        parts = parts_per_rep(size)
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            for i in range(parts):
                np.copyto(dst[i % slots], src)
            times.append(time.perf_counter() - start)
        figures[size] = statistics.median(times)
    return figures


def run(
    out_dir: str | os.PathLike,
    *,
    inline_sweep: bool = False,
    sizes: tuple[int, ...] = SIZES,
    sweep_sizes: tuple[int, ...] = SWEEP_SIZES,
    reps: int = REPS,
) -> dict:
    """Run the benchmark, write ``out_dir/transport.json`` and return its content:
    ``{"parts": [{"size", "batch_bytes", "parts_per_rep", "shm_gbps", "zmq_gbps",
    "queue_gbps", "memcpy_gbps", "memcpy_ring_gbps"}, ...], "reps",
    "inline_max_bytes"}`` plus ``"inline_sweep": [{"size", "inline_gbps",
    "shm_gbps"}, ...]`` if asked. ``sizes``, ``sweep_sizes`` and ``reps``
    default to the published configuration. Raises ``RuntimeError`` if a
    worker or builder process fails or exceeds its timeout."""
    from shardsink.shm import INLINE_MAX_BYTES, unlink_cluster

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cluster = f"bench{os.getpid()}"
    measured = {*sizes, *sweep_sizes} if inline_sweep else set(sizes)
    batch_bytes = {size: make_batch(size).nbytes for size in measured}
    seconds: dict[str, dict[int, float]] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="shardsink-bench-") as workdir:  # mode 0700
            for transport in ("shm", "zmq", "queue"):
                seconds[transport] = _pair(transport, sizes, reps, workdir, cluster)
            if inline_sweep:
                for transport in ("inline", "shm_only"):
                    seconds[transport] = _pair(transport, sweep_sizes, reps, workdir, cluster)
    finally:
        unlink_cluster(cluster)
    seconds["memcpy"] = _memcpy(sizes, reps, ring=False)
    seconds["memcpy_ring"] = _memcpy(sizes, reps, ring=True)

    def gbps(transport: str, size: int) -> float:
        return round(batch_bytes[size] * parts_per_rep(size) / seconds[transport][size] / 1e9, 3)

    result: dict = {
        "parts": [
            {
                "size": size,
                "batch_bytes": batch_bytes[size],
                "parts_per_rep": parts_per_rep(size),
                **{f"{t}_gbps": gbps(t, size) for t in _COLUMNS},
            }
            for size in sizes
        ],
        "reps": reps,
        "inline_max_bytes": INLINE_MAX_BYTES,
    }
    if inline_sweep:
        result["inline_sweep"] = [
            {
                "size": size,
                "inline_gbps": gbps("inline", size),
                "shm_gbps": gbps("shm_only", size),
            }
            for size in sweep_sizes
        ]
    (out / "transport.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def print_table(result: dict) -> None:
    """Print the figures of :func:`run` as tables (GB/s, medians)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"transport GB/s (median of {result['reps']})")
    for column in ("size", *_COLUMNS, "shm/memcpy", "shm/queue"):
        table.add_column(column, justify="right")
    for row in result["parts"]:
        table.add_row(
            _size(row["size"]),
            *(f"{row[f'{t}_gbps']:.2f}" for t in _COLUMNS),
            f"{row['shm_gbps'] / row['memcpy_gbps']:.2f}",
            f"{row['shm_gbps'] / row['queue_gbps']:.1f}",
        )
    console = Console()
    console.print(table)
    if "inline_sweep" in result:
        sweep = Table(title=f"inline vs shm GB/s (cut-off {_size(result['inline_max_bytes'])})")
        for column in ("size", "inline", "shm"):
            sweep.add_column(column, justify="right")
        for row in result["inline_sweep"]:
            sweep.add_row(_size(row["size"]), f"{row['inline_gbps']:.3f}", f"{row['shm_gbps']:.3f}")
        console.print(sweep)


def _size(n: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n >> shift} {unit}"
    return f"{n} B"


if __name__ == "__main__":  # the driver of one transport's pair, see _pair
    print(json.dumps(_run_pair(*json.loads(sys.argv[1]))))
