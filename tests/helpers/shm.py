"""Helpers of the shm tests: numbered parts, and child processes that write or
read parts, driven by the tests through JSON lines on their stdout.

Run as a script this module is the child: ``writer`` (sends parts 0..COUNT-1,
part i with ROWS[i % len(ROWS)] rows), ``reader`` or ``leak`` (see :func:`main`).
Children die with the test process (``PR_SET_PDEATHSIG``) and never wait more
than :data:`HOLD` seconds for it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

HOLD = 60.0
KEY_STRIDE = 1_000_000
_clusters = itertools.count()


def make_part(i: int, rows: int) -> pa.RecordBatch:
    """Part ``i``: workload-shaped rows whose keys start at ``i * KEY_STRIDE``."""
    keys = np.arange(i * KEY_STRIDE, i * KEY_STRIDE + rows, dtype=np.int64)
    return pa.record_batch(
        {
            "key": keys,
            "val": pa.array([format(int(k), "032x") for k in keys], pa.string()),
            "ts": np.full(rows, i, dtype=np.uint64),
            "diff": np.ones(rows, dtype=np.int64),
        }
    )


def unique_cluster() -> str:
    """A cluster id no other test uses."""
    return f"t{os.getpid()}-{next(_clusters)}"


def part_number(batch: pa.RecordBatch) -> int:
    """Which part ``batch`` is, after checking it equals that part exactly."""
    i = int(batch.column("ts")[0].as_py())
    assert batch.equals(make_part(i, batch.num_rows)), f"part {i} arrived altered"
    return i


def shm_ranges(pid: int | str, segment: str) -> list[tuple[int, int]]:
    """Address ranges at which process ``pid`` maps ``/dev/shm/<segment>``."""
    ranges = []
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        if line.endswith(f"/dev/shm/{segment}") or line.endswith(f"/dev/shm/{segment} (deleted)"):
            start, end = line.split()[0].split("-")
            ranges.append((int(start, 16), int(end, 16)))
    return ranges


class Child:
    """A helper child process; ``expect`` reads its JSON events."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, *args], stdout=subprocess.PIPE, bufsize=0
        )
        self.pid = self.proc.pid
        self._pending = b""

    def events(self, timeout: float) -> list[dict]:
        """Every event the child prints within ``timeout`` seconds, or until it exits."""
        deadline = time.monotonic() + timeout
        found = []
        while (remaining := deadline - time.monotonic()) > 0:
            found += self._lines()
            if not select.select([self.proc.stdout], [], [], remaining)[0]:
                break
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            if not chunk:
                break
            self._pending += chunk
        return found + self._lines()

    def expect(self, event: str, timeout: float = 20.0) -> dict:
        """The next ``event`` the child prints; fails on another kind's error or timeout."""
        deadline = time.monotonic() + timeout
        while True:
            for line in self._lines():
                if line["event"] == event:
                    return line
                assert line["event"] != "error", f"child {self.pid} failed: {line}"
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"child {self.pid} printed no {event!r} in {timeout}s"
            if select.select([self.proc.stdout], [], [], remaining)[0]:
                chunk = os.read(self.proc.stdout.fileno(), 65536)
                assert chunk, f"child {self.pid} exited ({self.proc.wait()}) before {event!r}"
                self._pending += chunk

    def kill(self) -> None:
        """SIGKILL the child and reap it."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def wait(self, timeout: float = 20.0) -> int:
        return self.proc.wait(timeout)

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
        self.proc.stdout.close()

    def _lines(self) -> list[dict]:
        *lines, self._pending = self._pending.split(b"\n")
        return [json.loads(line) for line in lines if line]


def _emit(event: str, **fields) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def _writer(args: argparse.Namespace) -> None:
    from shardsink.shm import PartSender, ShmError

    sender = PartSender(
        args.endpoint,
        args.cluster,
        segment_size=args.segment,
        capacity=args.capacity,
        message_part_max_bytes=args.inline,
        timeout=args.timeout,
    )
    try:
        for i in range(args.count):
            seq = sender.send(make_part(i, args.rows[i % len(args.rows)]), {"part": i})
            _emit("sent", seq=seq, outstanding=sender.arena.outstanding)
        _emit("done", segments=sender.arena.segments)
        if args.then == "ack":
            sender.wait_acked()
            _emit("acked")
    except ShmError as exc:
        _emit("error", type=type(exc).__name__, message=str(exc), segments=sender.arena.segments)
    if args.then == "ack":
        sender.close()
    else:
        time.sleep(HOLD)  # to be killed with its parts outstanding


def _reader(args: argparse.Namespace) -> None:
    from shardsink.shm import PartReceiver

    receiver = PartReceiver(args.endpoint, args.cluster)
    _emit("ready")
    held = []
    for _ in range(args.count):
        part = receiver.recv(HOLD)
        assert part is not None, "no part arrived"
        held.append(part_number(part.batch))
    _emit("holding", parts=held, mapped=receiver.reader.mapped)
    time.sleep(HOLD)  # to be killed holding its mappings


def _leak(args: argparse.Namespace) -> None:
    from shardsink.shm import Arena

    arena = Arena(args.cluster, segment_size=1 << 20, capacity=4 << 20)
    arena.try_write(make_part(0, 100))
    _emit("leaked", segments=arena.segments)
    os._exit(0)  # no clean-up, as in a crash


def main() -> None:
    """Entry of a child process; see the module doc."""
    from shardsink.process.parent import die_with_parent

    die_with_parent(os.getppid())  # the test process
    parser = argparse.ArgumentParser()
    roles = parser.add_subparsers(dest="role", required=True)
    writer = roles.add_parser("writer")
    writer.add_argument("endpoint")
    writer.add_argument("cluster")
    writer.add_argument("count", type=int)
    writer.add_argument("rows", type=lambda v: [int(n) for n in v.split(",")], help="N[,N...]")
    writer.add_argument("--segment", type=int, default=1 << 20)
    writer.add_argument("--capacity", type=int, default=8 << 20)
    writer.add_argument("--inline", type=int, default=-1, help="-1: never inline")
    writer.add_argument("--timeout", type=float, default=20.0)
    writer.add_argument("--then", choices=("ack", "hold"), default="ack")
    writer.set_defaults(run=_writer)
    reader = roles.add_parser("reader")
    reader.add_argument("endpoint")
    reader.add_argument("cluster")
    reader.add_argument("count", type=int)
    reader.set_defaults(run=_reader)
    leak = roles.add_parser("leak")
    leak.add_argument("cluster")
    leak.set_defaults(run=_leak)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
