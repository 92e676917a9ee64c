"""A shard a consensus server has loaded: its machine, the writer its
compactions write as, the maintenance running for it and what the server
did for it (the counters ``consensus stats`` shows)."""

from __future__ import annotations

import os
import threading
import time
import uuid
from concurrent.futures import Future

from ..persist import (
    CompactionReport,
    GcReport,
    HeartbeatWriter,
    LocalMachine,
    ShardStats,
    WriterGone,
    register_writer,
)

#: The kinds of maintenance a server runs for a shard, as its failures are
#: counted (``ShardCounters.failures``).
MAINTENANCE_KINDS = ("expiry", "retention", "gc", "sweep", "compaction")


class LoadedShard:
    """A loaded shard, the writer its compactions write as, and what the
    server did for it."""

    def __init__(self, machine: LocalMachine) -> None:
        self.machine = machine
        self.writer = self.register()
        self.commands = 0
        self.gc_runs = 0
        self.blobs_deleted = 0
        self.leaked_swept = 0
        self.readers_expired = 0
        self.writers_expired = 0
        self.compactions = 0
        self.compactions_abandoned = 0
        self.compacted_batches = 0
        self.compaction_puts = 0
        self.compaction_put_bytes = 0
        self.last_run = dict.fromkeys(("expiry", "compact", "gc", "sweep"), time.monotonic())
        self.maintenance: Future | None = None
        #: passes of the spine's merges running, by lane, with their inputs' ids
        self.merging: dict[int, tuple[Future, frozenset[str]]] = {}
        self.counts_lock = threading.Lock()  # merge lanes count concurrently
        #: maintenance that raised, by kind (it is retried on schedule), and
        #: the last such error, one line
        self.failures = dict.fromkeys(MAINTENANCE_KINDS, 0)
        self.last_failure = ""

    def register(self) -> str:
        """Register a writer of this server's for the shard's compactions (a
        fresh one each time: an expired id never comes back)."""
        return register_writer(self.machine, f"consensus-{os.getpid()}-{uuid.uuid4().hex[:12]}")

    def heartbeat(self) -> None:
        """Keep the server's writer registered; if it expired anyway (the
        server paused past its lease), register a new one."""
        if isinstance(self.machine.run(HeartbeatWriter(self.writer)), WriterGone):
            self.writer = self.register()

    def count_failure(self, kind: str, exc: BaseException) -> None:
        with self.counts_lock:
            self.failures[kind] += 1
            self.last_failure = f"{kind}: {type(exc).__name__}: {exc}"

    def count_gc(self, report: GcReport) -> None:
        self.gc_runs += 1
        self.readers_expired += len(report.readers_expired)
        self.writers_expired += len(report.writers_expired)
        self.blobs_deleted += len(report.blobs_deleted)

    def count_pass(self, report: CompactionReport, stats: ShardStats) -> None:
        with self.counts_lock:
            self.compactions += report.applied
            self.compactions_abandoned += report.skipped
            self.compacted_batches += report.batches_merged
            self.compaction_puts += stats.blob_puts
            self.compaction_put_bytes += stats.blob_put_bytes
