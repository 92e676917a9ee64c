"""``shardsink bench transport``: the shared-memory transport against its baselines.

For each part size a worker process streams the same record batch (shaped like
the workloads' rows) to a builder process: one untimed warm-up repetition, then
several timed repetitions of many parts. The builder reads every byte of every
batch it receives (:func:`read_batch`: a checksum over the batch's buffers) and
checks it against the sent batch's, and times each repetition from a shared
start until it has read the last batch. Every column therefore moves the same
bytes and reads them where they arrive: a zero-copy transport cannot score by
leaving bytes untouched, and a corrupted part fails the run. Throughput is the
batch's Arrow bytes times the parts over that time. The pairs run side by
side: each of ``reps`` rounds runs every transport's pair once (a warm-up
and one timed repetition), the pairs of each round in an order of its own
(:func:`~shardsink.bench.cluster.matrices.repeat_order`; ``order`` in
``transport.json``); each figure is the median over the rounds and
``gbps_range`` their lowest and highest. Columns of ``transport.json`` (all GB/s):

- ``shm_gbps``: this transport end to end, as a worker uses it. The worker
  streams parts without waiting for each acknowledgement (as many may be
  outstanding as its arena holds): each is encoded straight into its arena and
  referenced over ZeroMQ. The builder maps each batch zero-copy, reads it in
  place, holds it, and acknowledges the parts it holds in one message once they fill
  :data:`ACK_WINDOW` of arena. Parts up to the default inline cut-off travel
  inline (all of 4 KiB).
- ``zmq_gbps``: the batch serialized to IPC bytes and sent with ``copy=False``
  (PUSH/PULL); the builder decodes the frame in place and reads it.
- ``queue_gbps``: a ``multiprocess.Queue`` carrying the pickled batch, read
  once unpickled. This
  baseline, between the benchmark's own two processes, is the only place
  shardsink unpickles anything.
- ``memcpy_gbps``: the machine's limit for moving these bytes and reading
  them: one process copies the batch's IPC bytes (``numpy.copyto``) into
  successive part-sized slots of a warm (already written) buffer of
  :data:`RING_BYTES`, four times the last-level cache here, so each copy lands
  in memory as a stream of parts does, never in a destination still cached
  from the last lap; then it reads the copy (:func:`read_buffer`).
- ``memcpy_cached_gbps``: the same copy and read with one warm buffer of the
  part's size, over and over; up to 1 MiB source and destination stay in the
  caches, so this is cache bandwidth, not what a stream of parts can reach.

``bytes_read`` gives, per column, the bytes its reader read of each part: the
batch's buffers for the transports, its IPC stream (a few hundred bytes of
schema and message more) for memcpy.

The memcpy figures are timed in the shm worker's process, one repetition of
each just before each shm repetition while the builder waits: on a machine
shared with other work, the transport and its limit are then measured under
the same load, not minutes apart.

``--inline-sweep`` adds small sizes sent always inline and always through
shared memory, the measurement behind ``shardsink.shm.MESSAGE_PART_MAX_BYTES``.
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
from typing import NamedTuple

import numpy as np
import pyarrow as pa

SIZES = (4 << 10, 64 << 10, 1 << 20, 16 << 20)
SWEEP_SIZES = (1 << 10, 4 << 10, 16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10)
REPS = 7
# Enough bytes that one repetition outlasts a few scheduler time slices: the
# machine is shared, and shorter repetitions were mostly scheduling noise.
BYTES_PER_REP = 256 << 20
MIN_PARTS, MAX_PARTS = 16, 2000
# The memcpy baseline's destination: 4x the 32 MiB last-level cache here, so
# each copy lands in mapped memory that is no longer cached, as parts do once
# an arena cycles through more than the caches hold. The memcpy_cached row
# (one warm buffer, same run) is the cache's figure beside it, not the
# machine's limit for a stream of parts.
RING_BYTES = 128 << 20
# The shm builder acknowledges the parts it holds once they reach this many
# bytes. Each acknowledgement is a message and wakes threads on both sides; but
# the worker can only rewrite the arena space it has had back, and the more it
# cycles through, the less of it is still cached. Measured at 1 MiB (worker
# and builder processes, us per part, medians of 9 and of 7 on a shared
# machine): one acknowledgement per part 122 and 133, per 2 MiB 99 and 120,
# per 4 MiB 104 and 122, per 8 MiB 114.
ACK_WINDOW = 2 << 20
# Every wait of the worker and the builder (a barrier, a part, an
# acknowledgement) gives up after this long: nothing moving for a minute is a hang.
TIMEOUT = 60.0
#: The columns of the figures: each transport, then memcpy's two baselines.
COLUMNS = ("shm", "zmq", "queue", "memcpy", "memcpy_cached")
_ROW_BYTES = 60  # int64 key, 32-char string value (+ int32 offset), uint64 ts, int64 diff
# transport -> (kind, message_part_max_bytes); None keeps the default cut-off
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


class Read(NamedTuple):
    """What reading some bytes found: their checksum and how many there were."""

    checksum: int
    nbytes: int


_MASK = (1 << 64) - 1


def read_buffer(data) -> Read:
    """Read every byte of ``data`` (anything exporting a contiguous buffer):
    the sum modulo 2**64 of its little-endian 64-bit words, the last one
    zero-padded. A sum rather than a CRC because it runs at memory bandwidth
    (about 5x zlib's crc32 here), so reading costs what touching the bytes
    costs; a changed byte still changes it."""
    view = memoryview(data).cast("B")
    words = view.nbytes // 8
    total = int(np.add.reduce(np.frombuffer(view, np.uint64, count=words))) if words else 0
    total += int.from_bytes(view[words * 8 :], "little")
    return Read(total & _MASK, view.nbytes)


def read_batch(batch: pa.RecordBatch) -> Read:
    """Read every byte of every buffer of ``batch`` (:func:`read_buffer`),
    wherever they live: a shared-memory segment, a ZeroMQ frame, the heap."""
    total = nbytes = 0
    for column in batch.columns:
        for buf in column.buffers():
            if buf is not None:
                read = read_buffer(buf)
                total += read.checksum
                nbytes += read.nbytes
    return Read(total & _MASK, nbytes)


def _check(read: Read, sent: Read, what: str) -> None:
    """``RuntimeError`` unless the bytes read are the bytes sent."""
    if read != sent:
        raise RuntimeError(f"{what}: read {read}, but the sender sent {sent}")


class _Memcpy:
    """The memcpy baselines: copies of a batch's IPC bytes (see the module doc)."""

    def __init__(self) -> None:
        self.ring = np.ones(RING_BYTES, dtype=np.uint8)  # written: every page is mapped
        self.at = 0

    def seconds(self, batch: pa.RecordBatch, parts: int, cached: bool) -> tuple[float, int]:
        """Seconds to copy the IPC bytes of ``batch`` ``parts`` times and read
        each copy (checked against the source): into successive part-sized
        slots of the ring (whose destination is never still cached), or
        (``cached``) into one warm buffer of the part's size; and the bytes
        read of each copy. ``RuntimeError`` if a copy reads wrong."""
        from shardsink.shm.arena import write_stream

        sink = pa.BufferOutputStream()
        write_stream(sink, batch)
        src = np.frombuffer(sink.getvalue(), dtype=np.uint8)
        sent = read_buffer(src)
        slots = 1 if cached else max(2, RING_BYTES // src.size)
        ring = (
            np.ones((1, src.size), dtype=np.uint8)
            if cached
            else self.ring[: slots * src.size].reshape(slots, src.size)
        )
        at = 0 if cached else self.at % slots
        start = time.perf_counter()
        for _ in range(parts):
            np.copyto(ring[at], src)
            _check(read_buffer(ring[at]), sent, "memcpy")
            at = (at + 1) % slots
        took = time.perf_counter() - start
        if not cached:
            self.at = at
        return took, sent.nbytes


def _worker(
    transport: str, endpoint: str, cluster: str, plan, reps: int, barrier, queue, out: str
) -> None:
    """Send ``parts`` copies of a batch of each ``size`` in ``plan``, ``reps`` times.
    For ``shm``, time the memcpy baselines just before each repetition, while
    the builder waits, and write their seconds and bytes read per size to
    ``out`` as JSON (:func:`_write_out`)."""
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
            options = {} if inline_max is None else {"message_part_max_bytes": inline_max}
            sender = stack.enter_context(PartSender(endpoint, cluster, timeout=TIMEOUT, **options))
            send, settle = sender.send, sender.wait_acked
        # Timed in the same minute as the transport, one repetition each before
        # each of its repetitions: on a shared machine both then see the same load.
        memcpy = _Memcpy() if transport == "shm" else None
        seconds: dict[str, dict[int, list[float]]] = {"memcpy": {}, "memcpy_cached": {}}
        bytes_read: dict[str, dict[int, int]] = {"memcpy": {}, "memcpy_cached": {}}
        for size, parts in plan:
            batch = make_batch(size)
            for rep in range(1 + reps):  # a warm-up, then the timed repetitions
                if memcpy is not None:
                    for column, cached in (("memcpy", False), ("memcpy_cached", True)):
                        took, bytes_read[column][size] = memcpy.seconds(batch, parts, cached)
                        if rep:
                            seconds[column].setdefault(size, []).append(took)
                barrier.wait(TIMEOUT)
                for _ in range(parts):
                    send(batch)
                if settle is not None:
                    settle()
        barrier.wait(TIMEOUT)  # every acknowledgement is in: the builder may close
    if memcpy is not None:
        _write_out(out, seconds, bytes_read)


def _builder(
    transport: str, endpoint: str, cluster: str, plan, reps: int, barrier, queue, out: str
) -> None:
    """Time each repetition of :func:`_worker` from the shared start until the
    last batch is read (:func:`read_batch`, checked against the sent batch's);
    write the seconds and bytes read per size to ``out`` as JSON
    (:func:`_write_out`). ``RuntimeError`` if a batch reads wrong."""
    from shardsink.shm import PartReceiver, decode_part

    kind, _ = _TRANSPORTS[transport]
    release = None
    with contextlib.ExitStack() as stack:
        if kind == "queue":

            def receive() -> pa.RecordBatch:
                return queue.get(timeout=TIMEOUT)

        elif kind == "zmq":
            import zmq

            ctx = stack.enter_context(zmq.Context())
            sock = stack.enter_context(ctx.socket(zmq.PULL))
            sock.setsockopt(zmq.RCVTIMEO, int(TIMEOUT * 1000))
            sock.setsockopt(zmq.LINGER, 0)
            sock.bind(endpoint)

            def receive() -> pa.RecordBatch:
                return decode_part(pa.py_buffer(sock.recv(copy=False).buffer), "zmq frame")

        else:
            receiver = stack.enter_context(PartReceiver(endpoint, cluster))

            held: list = []
            held_bytes = 0

            def receive() -> pa.RecordBatch:
                nonlocal held_bytes
                part = receiver.recv(TIMEOUT)
                if part is None:
                    raise TimeoutError(f"no part within {TIMEOUT}s")
                if part.ref is not None:  # inline parts need no acknowledgement
                    held.append(part)
                    held_bytes += part.ref.length
                return part.batch

            def release(last: bool) -> None:
                # Like a builder holding parts until they are in its output, this
                # one acknowledges the parts it holds (and has read: the worker
                # reuses acknowledged space) in one message once they reach
                # ACK_WINDOW bytes of arena, and at the end of a repetition.
                nonlocal held_bytes
                if held and (last or held_bytes >= ACK_WINDOW):
                    receiver.ack(*held)
                    held.clear()
                    held_bytes = 0

        seconds: dict[int, list[float]] = {}
        bytes_read: dict[int, int] = {}
        for size, parts in plan:
            sent = read_batch(make_batch(size))
            seconds[size] = []
            for rep in range(1 + reps):
                barrier.wait(TIMEOUT)
                start = time.perf_counter()
                for i in range(1, parts + 1):
                    _check(read_batch(receive()), sent, transport)
                    if release is not None:
                        release(i == parts)
                if rep:  # the first is the warm-up
                    seconds[size].append(time.perf_counter() - start)
            bytes_read[size] = sent.nbytes  # every part read as many, or _check raised
        # Closing drops unsent messages: not before the worker has its acknowledgements.
        barrier.wait(TIMEOUT)
    _write_out(out, {transport: seconds}, {transport: bytes_read})


def _write_out(out: str, seconds: dict, bytes_read: dict) -> None:
    """Write one process's figures, ``{column: {size: ...}}`` each, to ``out``."""
    Path(out).write_text(json.dumps({"seconds": seconds, "bytes_read": bytes_read}))


def _run_pair(transport: str, sizes, reps: int, workdir: str, cluster: str):
    """Median seconds per repetition and bytes read of each part for each size
    of one transport, worker and builder in their own processes:
    ``{"seconds": {column: {size: seconds}}, "bytes_read": {column: {size:
    bytes}}}``, the columns being ``transport`` and, for ``shm``, the memcpy
    baselines."""
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
        deadline = time.monotonic() + _bound_s(plan, reps)
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
    figures: dict[str, dict] = {"seconds": {}, "bytes_read": {}}
    for path in outs:
        if os.path.exists(path):
            written = json.loads(Path(path).read_text())
            for column, per_size in written["seconds"].items():
                figures["seconds"][column] = {
                    size: statistics.median(per_size[str(size)]) for size in sizes
                }
            figures["bytes_read"].update(written["bytes_read"])
    return figures


def _bound_s(sizes, reps: int) -> float:
    """A bound on one transport's run over ``sizes``: each of its steps (a
    repetition of one size, between two barriers) is bounded by its own
    waits, so this only catches a run that crawls without ever hanging; on a
    loaded machine a single step can take many seconds."""
    return TIMEOUT * (len(sizes) * (1 + reps) + 2)


def _pair(transport: str, sizes, reps: int, workdir: str, cluster: str):
    """:func:`_run_pair` in a driver process of its own, so the helper process
    that ``multiprocess`` starts for spawned children ends with the driver."""
    config = json.dumps([transport, list(sizes), reps, workdir, cluster])
    try:
        done = subprocess.run(
            [sys.executable, "-m", __name__, config],
            capture_output=True,
            text=True,
            timeout=_bound_s(sizes, reps) + TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"transport benchmark {transport!r} timed out") from None
    if done.returncode != 0:
        raise RuntimeError(f"transport benchmark {transport!r} failed:\n{done.stderr[-3000:]}")
    return {
        figure: {
            column: {int(size): value for size, value in per_size.items()}
            for column, per_size in columns.items()
        }
        for figure, columns in json.loads(done.stdout).items()
    }


def _rounds(pairs: list, reps: int, cluster: str) -> tuple[dict, dict, list[list[str]]]:
    """``reps`` rounds of every pair, each round's pairs in their own order
    (:func:`~.cluster.matrices.repeat_order`): the seconds of each round by
    column and size, the bytes read, and each round's order."""
    from .cluster.matrices import repeat_order

    rounds: dict[str, dict[int, list[float]]] = {}
    bytes_read: dict[str, dict[int, int]] = {}
    order = []
    with tempfile.TemporaryDirectory(prefix="shardsink-bench-") as workdir:  # mode 0700
        # Side by side: one timed repetition of every pair per round, so no
        # transport is measured minutes before another.
        for rep in range(reps):
            order.append([t for t, _ in repeat_order(pairs, rep)])
            for transport, measured_sizes in repeat_order(pairs, rep):
                figures = _pair(transport, measured_sizes, 1, workdir, cluster)
                for column, per_size in figures["seconds"].items():
                    for size, took in per_size.items():
                        rounds.setdefault(column, {}).setdefault(size, []).append(took)
                bytes_read.update(figures["bytes_read"])
    return rounds, bytes_read, order


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
    "queue_gbps", "memcpy_gbps", "memcpy_cached_gbps", "bytes_read": {column:
    bytes}}, ...], "reps",
    "message_part_max_bytes"}`` plus ``"inline_sweep": [{"size", "inline_gbps",
    "shm_gbps"}, ...]`` if asked. ``sizes``, ``sweep_sizes`` and ``reps``
    default to the published configuration. Raises ``RuntimeError`` if a
    worker or builder process fails (a part read wrong, say) or exceeds its
    timeout."""
    from shardsink.shm import MESSAGE_PART_MAX_BYTES, unlink_cluster

    from .cluster.matrices import ORDER_SEED

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cluster = f"bench{os.getpid()}"
    measured = {*sizes, *sweep_sizes} if inline_sweep else set(sizes)
    batch_bytes = {size: make_batch(size).nbytes for size in measured}
    pairs = [(t, sizes) for t in ("shm", "zmq", "queue")]
    if inline_sweep:
        pairs += [(t, sweep_sizes) for t in ("inline", "shm_only")]
    try:
        rounds, bytes_read, order = _rounds(pairs, reps, cluster)
    finally:
        unlink_cluster(cluster)
    seconds = {
        column: {size: statistics.median(took) for size, took in per_size.items()}
        for column, per_size in rounds.items()
    }

    def gbps(transport: str, size: int, took: float | None = None) -> float:
        took = seconds[transport][size] if took is None else took
        return round(batch_bytes[size] * parts_per_rep(size) / took / 1e9, 3)

    def spread(transport: str, size: int) -> list[float]:
        """The lowest and highest GB/s of the rounds."""
        return sorted({gbps(transport, size, max(rounds[transport][size])),
                       gbps(transport, size, min(rounds[transport][size]))})  # fmt: skip

    result: dict = {
        "parts": [
            {
                "size": size,
                "batch_bytes": batch_bytes[size],
                "parts_per_rep": parts_per_rep(size),
                **{f"{t}_gbps": gbps(t, size) for t in COLUMNS},
                "gbps_range": {t: spread(t, size) for t in COLUMNS},
                "bytes_read": {t: bytes_read[t][size] for t in COLUMNS},
            }
            for size in sizes
        ],
        "reps": reps,
        "order": order,
        "order_seed": ORDER_SEED,
        "message_part_max_bytes": MESSAGE_PART_MAX_BYTES,
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


if __name__ == "__main__":  # the driver of one transport's pair, see _pair
    print(json.dumps(_run_pair(*json.loads(sys.argv[1]))))
