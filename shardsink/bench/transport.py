"""``shardsink bench transport``: the shared-memory transport against its baselines.

For each part size a worker process streams the same record batch (shaped like
the workloads' rows) to a builder process: one untimed warm-up repetition, then
several timed repetitions of many parts. The builder times each repetition from
a shared start until it holds the last batch. Throughput is the batch's Arrow
bytes times the parts over that time; each figure is the median over the timed
repetitions. Columns of ``transport.json`` (all GB/s):

- ``shm_gbps``: this transport end to end, as a worker uses it. The worker
  streams parts without waiting for each acknowledgement (as many may be
  outstanding as its arena holds): each is encoded straight into its arena and
  referenced over ZeroMQ. The builder reads each batch zero-copy, holds it,
  and acknowledges the parts it holds in one message once they fill
  :data:`ACK_WINDOW` of arena. Parts up to the default inline cut-off travel
  inline (all of 4 KiB).
- ``zmq_gbps``: the batch serialized to IPC bytes and sent with ``copy=False``
  (PUSH/PULL); the builder decodes the frame in place.
- ``queue_gbps``: a ``multiprocess.Queue`` carrying the pickled batch. This
  baseline, between the benchmark's own two processes, is the only place
  shardsink unpickles anything.
- ``memcpy_gbps``: the machine's limit for moving these bytes: one process
  copies the batch's IPC bytes (``numpy.copyto``) into successive part-sized
  slots of a warm (already written) buffer of :data:`RING_BYTES`, four times
  the last-level cache here, so each copy lands in memory as a stream of parts
  does, never in a destination still cached from the last lap.
- ``memcpy_cached_gbps``: the same copy into one warm buffer of the part's size,
  over and over; up to 1 MiB source and destination stay in the caches, so this
  is cache bandwidth, not what a stream of parts can reach.

The memcpy figures are timed in the shm worker's process, one repetition of
each just before each shm repetition while the builder waits: on a machine
shared with other work, the transport and its limit are then measured under
the same load, not minutes apart.

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
REPS = 7
# Enough bytes that one repetition outlasts a few scheduler time slices: the
# machine is shared, and shorter repetitions were mostly scheduling noise.
BYTES_PER_REP = 256 << 20
MIN_PARTS, MAX_PARTS = 16, 2000
# The memcpy baseline's destination: 4x the 32 MiB last-level cache here
# (DESIGN section 13 gives memcpy "into warm memory", 9.2 GB/s), so each copy
# lands in mapped memory that is no longer cached, as parts do once an arena
# cycles through more than the caches hold. A destination that stays cached
# across copies (memcpy_cached) runs 2-3x faster at 1 MiB: a cache figure,
# not the machine's limit for a stream of parts.
RING_BYTES = 128 << 20
# The shm builder acknowledges the parts it holds once they reach this many
# bytes. Each acknowledgement is a message and wakes threads on both sides; but
# the worker can only rewrite the arena space it has had back, and the more it
# cycles through, the less of it is still cached. Measured at 1 MiB (worker
# and builder processes, us per part, medians of 9 and of 7 on a shared
# machine): one acknowledgement per part 122 and 133, per 2 MiB 99 and 120,
# per 4 MiB 104 and 122, per 8 MiB 114.
ACK_WINDOW = 2 << 20
TIMEOUT = 60.0
_COLUMNS = ("shm", "zmq", "queue", "memcpy", "memcpy_cached")
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


class _Memcpy:
    """The memcpy baselines: copies of a batch's IPC bytes (see the module doc)."""

    def __init__(self) -> None:
        self.ring = np.ones(RING_BYTES, dtype=np.uint8)  # written: every page is mapped
        self.at = 0

    def seconds(self, batch: pa.RecordBatch, parts: int, cached: bool) -> float:
        """Seconds to copy the IPC bytes of ``batch`` ``parts`` times: into
        successive part-sized slots of the ring (whose destination is never
        still cached), or (``cached``) into one warm buffer of the part's size."""
        from shardsink.shm.arena import write_stream

        sink = pa.BufferOutputStream()
        write_stream(sink, batch)
        src = np.frombuffer(sink.getvalue(), dtype=np.uint8)
        slots = max(2, RING_BYTES // src.size)
        ring = self.ring[: slots * src.size].reshape(slots, src.size)
        dst = np.ones(src.size, dtype=np.uint8) if cached else None
        start = time.perf_counter()
        if dst is not None:
            for _ in range(parts):
                np.copyto(dst, src)
        else:
            at = self.at % slots
            for _ in range(parts):
                np.copyto(ring[at], src)
                at = (at + 1) % slots
            self.at = at
        return time.perf_counter() - start


def _worker(
    transport: str, endpoint: str, cluster: str, plan, reps: int, barrier, queue, out: str
) -> None:
    """Send ``parts`` copies of a batch of each ``size`` in ``plan``, ``reps`` times.
    For ``shm``, time the memcpy baselines just before each repetition, while
    the builder waits, and write their seconds per size to ``out`` as JSON."""
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
        # Timed in the same minute as the transport, one repetition each before
        # each of its repetitions: on a shared machine both then see the same load.
        memcpy = _Memcpy() if transport == "shm" else None
        seconds: dict[str, dict[int, list[float]]] = {"memcpy": {}, "memcpy_cached": {}}
        for size, parts in plan:
            batch = make_batch(size)
            for rep in range(1 + reps):  # a warm-up, then the timed repetitions
                if memcpy is not None:
                    for column, cached in (("memcpy", False), ("memcpy_cached", True)):
                        took = memcpy.seconds(batch, parts, cached)
                        if rep:
                            seconds[column].setdefault(size, []).append(took)
                barrier.wait(TIMEOUT)
                for _ in range(parts):
                    send(batch)
                if settle is not None:
                    settle()
        barrier.wait(TIMEOUT)  # every acknowledgement is in: the builder may close
    if memcpy is not None:
        Path(out).write_text(json.dumps(seconds))


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

            held: list = []
            held_bytes = 0

            def read(last: bool) -> pa.RecordBatch:
                # Like a builder holding parts until they are in its output, this
                # one acknowledges the parts it holds in one message once they
                # reach ACK_WINDOW bytes of arena (and at the end of a repetition).
                nonlocal held_bytes
                part = receiver.recv(TIMEOUT)
                if part is None:
                    raise TimeoutError(f"no part within {TIMEOUT}s")
                if part.ref is not None:  # inline parts need no acknowledgement
                    held.append(part)
                    held_bytes += part.ref.length
                if held and (last or held_bytes >= ACK_WINDOW):
                    receiver.ack(*held)
                    held.clear()
                    held_bytes = 0
                return part.batch

        seconds = {}
        for size, parts in plan:
            seconds[size] = []
            for rep in range(1 + reps):
                barrier.wait(TIMEOUT)
                start = time.perf_counter()
                if kind == "shm":
                    for i in range(1, parts + 1):
                        read(i == parts)
                else:
                    for _ in range(parts):
                        read()
                if rep:  # the first is the warm-up
                    seconds[size].append(time.perf_counter() - start)
        # Closing drops unsent messages: not before the worker has its acknowledgements.
        barrier.wait(TIMEOUT)
    Path(out).write_text(json.dumps({transport: seconds}))


def _run_pair(transport: str, sizes, reps: int, workdir: str, cluster: str):
    """Median seconds per repetition for each size of one transport, worker and
    builder in their own processes: ``{column: {size: seconds}}``, the columns
    being ``transport`` and, for ``shm``, the memcpy baselines."""
    import multiprocess

    ctx = multiprocess.get_context("spawn")
    endpoint = f"ipc://{workdir}/{transport}.sock"
    outs = [os.path.join(workdir, f"{transport}.{side}.json") for side in ("builder", "worker")]
    plan = [(size, parts_per_rep(size)) for size in sizes]
    barrier = ctx.Barrier(2)
    queue = ctx.Queue() if _TRANSPORTS[transport][0] == "queue" else None
    common = (transport, endpoint, cluster, plan, reps, barrier, queue)
    procs = (
        ctx.Process(target=_builder, args=(*common, outs[0])),
        ctx.Process(target=_worker, args=(*common, outs[1])),
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
    medians = {}
    for path in outs:
        if os.path.exists(path):
            for column, per_size in json.loads(Path(path).read_text()).items():
                medians[column] = {size: statistics.median(per_size[str(size)]) for size in sizes}
    return medians


def _pair(transport: str, sizes, reps: int, workdir: str, cluster: str):
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
    return {
        column: {int(size): secs for size, secs in per_size.items()}
        for column, per_size in json.loads(done.stdout).items()
    }


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
    "queue_gbps", "memcpy_gbps", "memcpy_cached_gbps"}, ...], "reps",
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
                seconds.update(_pair(transport, sizes, reps, workdir, cluster))
            if inline_sweep:
                for transport in ("inline", "shm_only"):
                    seconds.update(_pair(transport, sweep_sizes, reps, workdir, cluster))
    finally:
        unlink_cluster(cluster)

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
