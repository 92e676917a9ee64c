"""A peer's worker process: a fresh interpreter (no fork of the driver,
whose table libraries run threads of their own) that writes its slice of
each interval the way its peer commits (:mod:`shardsink.bench.peers`),
told by the driver over its stdin and answering on its stdout
(:mod:`.wire`); its stderr is the driver's.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Literal

import msgspec
import pyarrow as pa

from ...workloads import Workload
from .formats import Committer
from .registry import format_named
from .wire import Committed, FromWorker, Handed, Outcome, Ready, Written, receive_blocking, send

#: How a peer commits an interval: every worker its own commit, every worker
#: a file and the driver one commit of them all, or the driver one file and
#: one commit of every worker's rows.
Commit = Literal["per-worker", "per-interval", "coalesced"]


class WorkerSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What a worker writes: global worker ``worker`` of ``workers`` of
    ``workload``, into the ``format`` table at ``location``, committing as
    ``commit`` says, a lost race retried up to ``retries`` times."""

    format: str
    commit: Commit
    location: str
    worker: int
    workers: int
    workload: Workload
    retries: int


def main(argv: list[str]) -> None:
    """Run the worker ``argv[0]`` (a :class:`WorkerSpec` as JSON) describes
    until the driver says stop or goes away."""
    spec = msgspec.json.decode(argv[0], type=WorkerSpec)
    # frames go on the real stdout; whatever a library prints, to stderr
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    committer = None
    if spec.commit != "coalesced":
        committer = format_named(spec.format).open(Path(spec.location), spec.retries)
    send(out, Ready())
    while (message := receive_blocking(sys.stdin.buffer)) is not None:
        data = spec.workload.updates(message.interval, spec.worker, spec.workers)
        send(out, _written(spec.commit, committer, message.interval, data))


def _written(
    commit: Commit, committer: Committer | None, interval: int, data: pa.Table
) -> FromWorker:
    """What the worker did with its slice ``data`` of ``interval``."""
    rows = data.num_rows
    if commit == "coalesced":
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, data.schema) as stream:
            stream.write_table(data)
        return Handed(interval=interval, rows=rows, ipc=sink.getvalue().to_pybytes())
    if commit == "per-interval":
        file = committer.write_file(data) if rows else None  # type: ignore[union-attr]
        return Written(interval=interval, rows=rows, file=file)
    outcome = committer.append(data) if rows else Outcome()  # type: ignore[union-attr]
    return Committed(interval=interval, rows=rows, outcome=outcome)
