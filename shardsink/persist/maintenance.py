"""Maintenance of a shard, run by whoever owns its state.

Compaction, garbage collection and the leaked-blob sweep retire and delete
blobs, so they run where the shard's state is owned: in this process over
its stores (:class:`LocalMaintenance`), or in the consensus server holding
the shard, asked by a client (``shardsink.server.client``), never as state
commands a client sends (a server refuses those: ``commands.CLIENT_COMMANDS``).
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Protocol, runtime_checkable

import pyarrow as pa

from ..storage import Blob, StorageError
from .commands import ExpireWriter, Registered, RegisterWriter
from .compaction import CompactionReport, compact
from .errors import PersistError
from .gc import GcReport, collect_garbage, sweep_leaked_blobs
from .machine import LocalMachine, ShardMachine
from .stats import ShardStats

log = logging.getLogger(__name__)


@runtime_checkable
class Maintenance(Protocol):
    """Compaction, GC and the leaked-blob sweep of one shard.

    - ``compact()`` merges runs of adjacent small batches
      (:func:`~.compaction.compact`) as a writer of the maintainer's own,
      and reports what it did.
    - ``collect_garbage()`` expires readers and writers, deletes the blobs
      no held version references and truncates old versions
      (:func:`~.gc.collect_garbage`).
    - ``sweep_leaked_blobs(grace_ms)`` deletes unreferenced blobs of writers
      gone from state, older than ``grace_ms`` (``None``: the configured
      grace); ``ValueError`` for a grace shorter than the writer lease
      (:func:`~.gc.sweep_leaked_blobs`). Returns what it removed.

    Each is safe to run at any time, concurrently with appends and reads.
    """

    def compact(self) -> CompactionReport: ...

    def collect_garbage(self) -> GcReport: ...

    def sweep_leaked_blobs(self, grace_ms: int | None = None) -> list[str]: ...


def register_writer(machine: ShardMachine, name: str) -> str:
    """Register a writer called ``name`` and return its id; ``ValueError``
    if the machine refuses the name."""
    result = machine.run(RegisterWriter(name))
    if not isinstance(result, Registered):
        raise ValueError(f"shard {machine.shard!r}: registering writer {name!r}: {result!r}")
    return result.writer_id


class LocalMaintenance:
    """:class:`Maintenance` in this process over ``machine`` and ``blob``;
    ``stats`` counts the blob writes of its compactions."""

    def __init__(
        self, machine: LocalMachine, blob: Blob, schema: pa.Schema, stats: ShardStats
    ) -> None:
        self.machine = machine
        self.blob = blob
        self.schema = schema
        self.stats = stats

    def compact(self) -> CompactionReport:
        """:func:`~.compaction.compact`, as a writer registered for this call
        and expired after it (what a refused merge leaves behind is its own to
        delete; what a crash leaves, the sweep takes once the writer is gone)."""
        writer = register_writer(self.machine, f"compaction-{uuid.uuid4().hex}")
        try:
            return compact(
                self.machine,
                self.blob,
                self.schema,
                target_bytes=self.machine.config.blob_target_bytes,
                stats=self.stats,
                writer_id=writer,
            )
        finally:
            try:
                self.machine.run(ExpireWriter(writer))
            except (StorageError, PersistError) as exc:
                log.warning(
                    "shard %r: compaction writer %s stays until its lease: %s",
                    self.machine.shard,
                    writer,
                    exc,
                )

    def collect_garbage(self) -> GcReport:
        report = collect_garbage(self.machine, self.blob)
        self.stats.gc_runs += 1
        self.stats.blobs_deleted += len(report.blobs_deleted)
        return report

    def sweep_leaked_blobs(self, grace_ms: int | None = None) -> list[str]:
        grace = self.machine.config.leaked_blob_grace_ms if grace_ms is None else grace_ms
        leaked = sweep_leaked_blobs(self.machine, self.blob, grace, time.time() * 1000)
        self.stats.blobs_deleted += len(leaked)
        return leaked
