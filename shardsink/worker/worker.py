"""The worker process: its slice of every minted interval, shared or its own.

For each :class:`~shardsink.protocol.Mint` the worker produces the
updates its workload assigns it (:func:`shardsink.workloads.shard_updates`,
with the interval's time; docs/workloads.md), consolidates them, digests them
(:mod:`shardsink.persist.digest`, reported to the coordinator) and stages
them as Arrow. In ``best-effort`` and ``barrier`` mode, staged
updates of at most ``shared_max_bytes`` go to the group's builder through
shared memory (the last part finishes the worker's handle); larger ones, and
every interval in ``off`` mode, become the worker's own batch, written in
parallel with the others. A workload of several shards is all of that once
per shard, apart: a handle, a threshold, an own batch and a report per
shard (one shard's rows never go into another's batch).

In best-effort mode the worker joins the shared batch as soon as the mint
arrives (an empty part), so its handle is open while it works on the
interval, as a streaming worker's is while the interval's data arrives; the
workers of a group that work at the same time share one batch. A worker that
shares nothing still finishes, with an empty part, so the batch can be handed
off (and, under a barrier, the barrier can close); it may be the last
finisher and receive the batch. The worker then waits for the builder's
:class:`~shardsink.protocol.Handoff` and reports to the coordinator. With
``coalesce`` host, the last finisher of a group generation also reports
where its builder passed the generation on (``delivered``), and receives the
host batch if its group finished last at the host builder.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import NamedTuple

import msgspec
import pyarrow as pa
import zmq

from .. import faults, protocol, workloads
from ..persist import Batch, Digest, PersistError, ShardStats, build_batch, written
from ..process import enter_member
from ..shm import PartSender
from ..storage import Blob, StorageError

log = logging.getLogger(__name__)


class Abandoned(Exception):
    """The coordinator abandoned the attempt the worker was waiting on."""


class ShutdownRequested(Exception):
    """The coordinator asked the worker to exit."""


class _Own(NamedTuple):
    """A worker's own batch of one shard and an interval: the batch (``None``
    if it wrote none), its writes, why writing it failed, how long it took."""

    batch: Batch | None
    stats: ShardStats
    error: str | None
    write_s: float


class Worker:
    """One worker's sockets and state (see the module doc)."""

    def __init__(self, spec: protocol.ChildSpec, ctx: zmq.Context, blob: Blob) -> None:
        config = spec.config
        self.spec = spec
        self.config = config
        self.group = spec.group
        self.index = spec.index
        self.global_index = spec.group * config.workers + spec.index
        self.workload = workloads.of(config)
        # by shard index, in the workload's order (the mint's writers')
        self.schemas = workloads.shard_schemas(self.workload, config.workload, config.shard)
        self.names = list(self.schemas)
        self.empty = [protocol.empty_part(schema) for schema in self.schemas.values()]
        self.blob = blob
        self.coord = ctx.socket(zmq.DEALER)
        self.coord.setsockopt(zmq.IDENTITY, f"g{self.group}/w{self.index}".encode())
        self.coord.setsockopt(zmq.LINGER, 1000)
        self.handoff = ctx.socket(zmq.DEALER)
        self.handoff.setsockopt(zmq.IDENTITY, protocol.worker_identity(self.index))
        self.handoff.setsockopt(zmq.LINGER, 0)
        self.poller = zmq.Poller()
        self.poller.register(self.coord, zmq.POLLIN)
        self.poller.register(self.handoff, zmq.POLLIN)
        self.sender: PartSender | None = None
        self._queued: list[protocol.ToChild] = []

    def start(self) -> None:
        """Connect, get welcomed by the builder, then say hello to the coordinator."""
        self.spec.connect_coordinator(self.coord)
        self.handoff.connect(self.spec.handoff)
        self.sender = PartSender(
            self.spec.parts,
            self.spec.cluster_id,
            message_part_max_bytes=self.config.message_part_max_bytes,
            timeout=self.config.interval_timeout_s,
            identity=protocol.worker_identity(self.index),
        )
        self.handoff.send(protocol.encode(protocol.HandoffHello(self.index)))
        if not self.handoff.poll(int(self.config.start_timeout_s * 1000)):
            raise TimeoutError(
                f"builder g{self.group} did not welcome worker {self.index} within "
                f"{self.config.start_timeout_s}s"
            )
        if not isinstance(protocol.decode_handoff(self.handoff.recv()), protocol.Welcome):
            raise ValueError(f"builder g{self.group} answered the hello with something else")
        self.coord.send(
            protocol.encode(protocol.Hello("worker", self.group, self.index, os.getpid()))
        )

    def serve(self) -> None:
        """Handle coordinator messages until :class:`~shardsink.protocol.Shutdown`."""
        while True:
            msg = self._next_message()
            if isinstance(msg, protocol.Shutdown):
                return
            if isinstance(msg, protocol.Mint):
                try:
                    reports = self.interval(msg)
                except Abandoned:
                    continue
                except ShutdownRequested:
                    return
                faults.point("worker.before_report")
                for report in reports:
                    self.coord.send(protocol.encode(report))

    def interval(self, mint: protocol.Mint) -> list[protocol.Report]:
        """Produce, stage, write or share one interval; the reports on it,
        one per shard (each shard's rows are shared or written apart)."""
        joins = mint.mode != "off"
        if mint.mode == "best-effort":
            # The handle is open while the worker works on the interval, so the
            # workers of a group that work on it at the same time share a batch.
            for shard, empty in enumerate(self.empty):
                self._send(mint, shard, empty, last=False)
        n = self.config.n_workers
        tables = workloads.shard_updates(
            self.workload, self.schemas, mint.interval, self.global_index, n, mint.lower
        )
        staged = [(table, written(table)) for table in tables.values()]
        faults.point("worker.after_encode")
        shares = [joins and t.num_rows > 0 and t.nbytes <= mint.shared_max_bytes for t, _ in staged]
        for shard, (table, _) in enumerate(staged):
            if shares[shard]:
                self._share(mint, shard, table)
            elif joins:  # finish with nothing, so that the batch can be handed off
                self._finish(mint, shard, self.empty[shard])
        owns = [
            self._own(mint, shard, table, content)
            if table.num_rows and not shares[shard]
            else _Own(None, ShardStats(), None, 0.0)
            for shard, (table, content) in enumerate(staged)
        ]
        answers = self._await_handoffs(mint) if joins else {}
        if any(answer.shared is not None for answer in answers.values()):
            faults.point("worker.last_finisher")
        return [
            self._report(
                mint, shard, *staged[shard], shares[shard], owns[shard], answers.get(shard)
            )
            for shard in range(len(staged))
        ]

    def _report(
        self,
        mint: protocol.Mint,
        shard: int,
        table: pa.Table,
        content: Digest | None,
        share: bool,
        own: _Own,
        answer: protocol.Handoff | None,
    ) -> protocol.Report:
        """The report on ``shard``: its rows ``table`` (digest ``content``),
        shared or not, its own batch and the builder's ``answer``."""
        rows = table.num_rows
        return protocol.Report(
            interval=mint.interval,
            attempt=mint.attempt,
            group=self.group,
            worker=self.index,
            rows=rows,
            shard=shard,
            own=own.batch,
            shared=protocol.Contribution(answer.generation, rows) if share and answer else None,
            received=answer.shared if answer is not None else None,
            delivered=answer.share if answer is not None else None,
            blob_puts=own.stats.blob_puts,
            blob_put_bytes=own.stats.blob_put_bytes,
            error=own.error or (answer.error if answer is not None else None),
            staged_bytes=table.nbytes if rows else 0,
            write_s=own.write_s,
            digest=content,
        )

    def _own(
        self, mint: protocol.Mint, shard: int, table: pa.Table, content: Digest | None
    ) -> _Own:
        """Write ``table`` as this worker's own batch of ``shard``."""
        stats = ShardStats()
        started = time.monotonic()
        try:
            batch = build_batch(
                self.blob,
                self.names[shard],
                table,
                mint.lower,
                mint.upper,
                writer=mint.writers[shard],
                inline_max_bytes=self.spec.inline_max_bytes,
                target_bytes=self.config.blob_target_bytes,
                stats=stats,
                content=content,
            )
        except (StorageError, PersistError, ValueError) as exc:
            error = f"writing its own batch failed: {type(exc).__name__}: {exc}"
            return _Own(None, stats, error, time.monotonic() - started)
        return _Own(batch, stats, None, time.monotonic() - started)

    def close(self) -> None:
        """Unlink the arena and close the sockets; idempotent."""
        if self.sender is not None:
            self.sender.close()
            self.sender = None
        self.coord.close()
        self.handoff.close()

    def _share(self, mint: protocol.Mint, shard: int, table: pa.Table) -> None:
        pieces = protocol.parts_of(table)
        for batch in pieces[:-1]:
            self._send(mint, shard, batch, last=False)
        self._finish(mint, shard, pieces[-1])

    def _finish(self, mint: protocol.Mint, shard: int, batch: pa.RecordBatch) -> None:
        """Send the part that finishes this worker's handle on ``shard``
        (fault points around it)."""
        faults.point("worker.before_finish")
        self._send(mint, shard, batch, last=True)
        faults.point("worker.after_push")

    def _send(self, mint: protocol.Mint, shard: int, batch: pa.RecordBatch, *, last: bool) -> None:
        assert self.sender is not None
        meta = protocol.Contribute(
            interval=mint.interval,
            attempt=mint.attempt,
            lower=mint.lower,
            upper=mint.upper,
            barrier=int(mint.mode == "barrier"),
            worker=self.index,
            rows=batch.num_rows,
            last=int(last),
            writer=mint.writers[shard],
            shard=shard,
        )
        self.sender.send(batch, protocol.contribute_meta(meta))

    def _await_handoffs(self, mint: protocol.Mint) -> dict[int, protocol.Handoff]:
        """The builder's answers to this attempt's finishes, by shard. Raises
        :class:`Abandoned` or :class:`ShutdownRequested` if the coordinator
        gives up on the attempt first."""
        answers: dict[int, protocol.Handoff] = {}
        while len(answers) < len(self.empty):
            events = dict(self.poller.poll())
            if self.handoff in events:
                answer = self._decode(protocol.decode_handoff, self.handoff.recv())
                if isinstance(answer, protocol.Handoff) and (answer.interval, answer.attempt) == (
                    mint.interval,
                    mint.attempt,
                ):
                    answers[answer.shard] = answer
            if self.coord in events:
                msg = self._decode(protocol.decode_to_child, self.coord.recv())
                if isinstance(msg, protocol.Shutdown):
                    raise ShutdownRequested
                if isinstance(msg, protocol.Abandon) and (msg.interval, msg.attempt) == (
                    mint.interval,
                    mint.attempt,
                ):
                    raise Abandoned
                if isinstance(msg, protocol.Mint):  # a newer attempt: this one is over
                    self._queued.append(msg)
                    raise Abandoned
        return answers

    def _next_message(self) -> protocol.ToChild:
        if self._queued:
            return self._queued.pop(0)
        while (msg := self._decode(protocol.decode_to_child, self.coord.recv())) is None:
            pass
        return msg

    def _decode(self, decode, raw: bytes):
        """``decode(raw)``, or ``None`` (and a log line) if it is malformed."""
        try:
            return decode(raw)
        except msgspec.DecodeError as exc:
            log.warning("worker g%d/w%d: malformed message: %s", self.group, self.index, exc)
            return None


def main(payload: bytes) -> int:
    """The worker's process main (:data:`~shardsink.protocol.WORKER_ROLE`):
    ``payload`` is its :class:`~shardsink.protocol.ChildSpec`; its exit status."""
    spec = protocol.decode_spec(payload)
    enter_member("worker", f"g{spec.group}/w{spec.index}")
    return run_worker(spec)


def run_worker(spec: protocol.ChildSpec) -> int:
    """The worker process's main; returns the exit code."""
    from ..faults import open_blob

    ctx = zmq.Context()
    blob = open_blob(spec.config.blob_uri)
    worker = Worker(spec, ctx, blob)
    try:
        worker.start()
        worker.serve()
        return 0
    except Exception as exc:
        log.exception("worker g%d/w%d failed", spec.group, spec.index)
        with contextlib.suppress(zmq.ZMQError):
            failure = protocol.Failure(os.getpid(), f"{type(exc).__name__}: {exc}")
            worker.coord.send(protocol.encode(failure), zmq.NOBLOCK)
        return 1
    finally:
        worker.close()
        blob.close()
        ctx.term()
