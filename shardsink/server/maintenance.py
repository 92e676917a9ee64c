"""A consensus server's maintenance of the shards it holds: what runs
beside the request loop, on threads of its own, so that no blob read,
write or delete ever waits in the loop.

- **The schedule** (:meth:`ServerMaintenance.schedule`, called by the loop
  at every turn, looking at most every :data:`LOOK_S`): per shard, every
  tenth of the writer lease *expiry* (readers whose lease ran out, writers
  not seen for the lease; the server's own writer heartbeated) and then
  *retention* (``since`` kept ``retain`` behind the upper); every
  ``gc_interval_s`` *GC*; every ``sweep_interval_s`` the *leaked-blob sweep*;
  each on the one maintenance thread, one shard's at a time.
- **Merges**: every ``compact_interval_s`` the spine's next pass
  (:func:`~shardsink.persist.spine.next_pass`) in one of the spine's lanes
  (:data:`LANE_CAPS`), a thread each, so a long merge of old batches never
  holds up the merges of new ones; a pass's compactions are stored through
  the loop (``own``), with the appends of their group commit.
- **Jobs clients ask for** (``Maintain``: ``shard gc``, ``shard compact``,
  the sweep) on the maintenance thread, answered by the loop when done
  (:meth:`ServerMaintenance.done_jobs`).

Every run that raises is counted by kind on its shard
(:meth:`~.loaded.LoadedShard.count_failure`: ``consensus stats`` and
``/metrics`` show it), logged, and retried on schedule; nothing here ever
stops the loop. State changes all go through the shard's thread-safe
machine.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial

from .._allocator import release_freed_pages
from ..persist import (
    COMPACT_PART_BYTES,
    Batch,
    Retain,
    ShardConfig,
    ShardState,
    ShardStats,
    collect_garbage,
    compact,
    expire,
    merge_runs,
    schema_from_bytes,
    spine,
    sweep_leaked_blobs,
)
from ..storage import Blob
from .group_commit import OwnCommands
from .loaded import LoadedShard
from .wire import Maintain, MaintainedReply

log = logging.getLogger(__name__)

#: How often the loop looks at most for maintenance that is due (its
#: intervals are a tenth of a second and more).
LOOK_S = 0.01
#: The most encoded bytes a pass merges in each of the spine's lanes (see
#: ``spine.next_pass``), one thread each. A pass that took in a large old
#: batch ran for seconds in a 20,000-interval soak while appends added
#: hundreds of small batches; a 4 MiB lane takes well under a second on a busy
#: machine, and a 64 MiB one keeps the 4 MiB outputs of the appends during a
#: long merge within the spine's rule.
LANE_CAPS = (4 << 20, 64 << 20, None)


class ServerMaintenance:
    """The maintenance of a server's shards (see the module doc), over
    ``blob``, with the server's ``config`` (lease, retention, grace, part
    size), its ``clock``, and ``own``, through which merges store their
    compactions in the loop's group commit. Intervals of ``0`` turn a job
    off. :meth:`close` (idempotent) stops the threads, cancelling what has
    not started."""

    def __init__(
        self,
        blob: Blob,
        config: ShardConfig,
        clock: Callable[[], int],
        own: OwnCommands,
        *,
        gc_interval_s: float,
        sweep_interval_s: float,
        compact_interval_s: float,
        compact_slack: int,
    ) -> None:
        self._blob = blob
        self._config = config
        self._clock = clock
        self._own = own
        self._intervals = {
            "expiry": config.writer_lease_ms / 10_000,
            "gc": gc_interval_s,
            "sweep": sweep_interval_s,
        }
        self._compact_interval_s = compact_interval_s
        self._compact_slack = compact_slack
        self._looked = 0.0  # when the shards were last looked at
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="shardsink-gc")
        self._lanes = [
            ThreadPoolExecutor(1, thread_name_prefix=f"shardsink-merge-{lane}")
            for lane in range(len(LANE_CAPS))
        ]
        #: jobs clients asked for, with whom to answer: (peer, request id, job)
        self._jobs: list[tuple[bytes, bytes, Future]] = []
        self._closed = False

    # --- the schedule -------------------------------------------------------------

    def schedule(self, shards: Iterator[LoadedShard]) -> None:
        """Start what is due for each of ``shards`` (the loop calls this at
        every turn)."""
        now = time.monotonic()
        # every shard is looked at, at most every LOOK_S: at every turn of a
        # busy loop, 64 shards' looks were 15% of the loop's samples (py-spy)
        if now - self._looked < LOOK_S:
            return
        self._looked = now
        for shard in shards:
            every = self._compact_interval_s
            if every > 0 and now - shard.last_run["compact"] >= every:
                shard.last_run["compact"] = now
                self._schedule_merge(shard)
            if shard.maintenance is not None and not shard.maintenance.done():
                continue
            due = {
                job
                for job, every in self._intervals.items()
                if every > 0 and now - shard.last_run[job] >= every
            }
            if due:
                shard.last_run.update(dict.fromkeys(due, now))
                shard.maintenance = self._thread.submit(self._maintain, shard, due)

    def _maintain(self, shard: LoadedShard, due: set[str]) -> None:
        """Runs on the maintenance thread: each job due, on its own, a
        failure counted (a GC that fails must not hold the sweep up)."""
        machine = shard.machine

        def expiry() -> None:
            shard.heartbeat()
            if "gc" not in due:  # GC expires first itself
                readers, writers = expire(machine)
                shard.readers_expired += len(readers)
                shard.writers_expired += len(writers)

        jobs = {
            "expiry": expiry,
            "retention": lambda: machine.run(Retain(self._config.retain)),
            "gc": lambda: shard.count_gc(collect_garbage(machine, self._blob)),
            "sweep": lambda: self._sweep(shard, self._config.leaked_blob_grace_ms),
        }
        if "expiry" in due and self._config.retain:
            due = due | {"retention"}
        for kind, job in jobs.items():
            if kind not in due:
                continue
            try:
                job()
            except Exception as exc:
                shard.count_failure(kind, exc)
                log.exception("%s of shard %r failed; retrying on schedule", kind, machine.shard)

    def _sweep(self, shard: LoadedShard, grace_ms: int) -> tuple[str, ...]:
        swept = tuple(sweep_leaked_blobs(shard.machine, self._blob, grace_ms, self._clock()))
        shard.leaked_swept += len(swept)
        return swept

    # --- merges -------------------------------------------------------------------

    def _schedule_merge(self, shard: LoadedShard) -> None:
        """Start a pass of the spine's merges in a free lane when one is due
        (``compact_slack``) among the batches newer than those being merged
        (:func:`~shardsink.persist.spine.next_pass`)."""
        shard.merging = {
            lane: (future, ids)
            for lane, (future, ids) in shard.merging.items()
            if not future.done()
        }
        if len(shard.merging) == len(LANE_CAPS):
            return
        # the machine's own state is current: this server is the shard's one writer
        state = shard.machine.state()
        running = {lane: ids for lane, (_, ids) in shard.merging.items()}
        chosen = spine.next_pass(state, running, self._compact_slack, LANE_CAPS)
        if chosen is not None:
            lane, runs = chosen
            future = self._lanes[lane].submit(self._merge, shard, state, runs)
            shard.merging[lane] = (future, frozenset(b.id for run in runs for b in run))

    def _merge(self, shard: LoadedShard, state: ShardState, runs: list[list[Batch]]) -> None:
        """Runs in a merge lane: the pass's blob reads and writes happen here."""
        stats = ShardStats()
        try:
            # its compactions are stored in the loop's batches, with the appends
            run = partial(self._own.submit, state.shard)
            report = merge_runs(
                shard.machine, self._blob, state, runs, self._part_bytes, stats, shard.writer,
                run=run,
            )  # fmt: skip
        except Exception as exc:
            if not self._closed:  # closing fails the compactions waiting on the loop
                shard.count_failure("compaction", exc)
                log.exception("compaction of shard %r failed; retrying on schedule", state.shard)
            return
        finally:
            # the pools keep a pass's freed pages otherwise (its last part's
            # Parquet encoding among them): a server that runs for days would
            # stay at the size of its largest merge
            release_freed_pages()
        shard.count_pass(report, stats)

    @property
    def _part_bytes(self) -> int:
        return min(self._config.blob_target_bytes, COMPACT_PART_BYTES)

    # --- jobs clients ask for ----------------------------------------------------

    def ask(self, peer: bytes, request_id: bytes, shard: LoadedShard, request: Maintain) -> None:
        """Run ``request`` on the maintenance thread; :meth:`done_jobs`
        hands its answer back."""
        self._jobs.append((peer, request_id, self._thread.submit(self._run_job, shard, request)))

    def done_jobs(self) -> Iterator[tuple[bytes, bytes, MaintainedReply | BaseException]]:
        """``(peer, request id, reply or the error it raised)`` of each job
        finished since the last call."""
        running = []
        for peer, request_id, job in self._jobs:
            if not job.done():
                running.append((peer, request_id, job))
                continue
            exc = job.exception()
            yield peer, request_id, job.result() if exc is None else exc
        self._jobs = running

    def _run_job(self, shard: LoadedShard, request: Maintain) -> MaintainedReply:
        """Runs on the maintenance thread: one job a client asked for."""
        machine = shard.machine
        if request.job == "compact":
            stats = ShardStats()
            schema = schema_from_bytes(machine.state().schema)
            report = compact(
                machine, self._blob, schema, target_bytes=self._part_bytes, stats=stats,
                writer_id=shard.writer,
            )  # fmt: skip
            shard.count_pass(report, stats)
            return MaintainedReply(compaction=report)
        if request.job == "gc":
            report = collect_garbage(machine, self._blob)
            shard.count_gc(report)
            return MaintainedReply(gc=report)
        grace = self._config.leaked_blob_grace_ms if request.grace_ms is None else request.grace_ms
        return MaintainedReply(swept=self._sweep(shard, grace))

    def close(self) -> None:
        """Stop the threads (waiting for what runs, cancelling the rest),
        failing the compactions that wait on the loop (``own``: it has
        stopped). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._own.close()
        self._thread.shutdown(wait=True, cancel_futures=True)
        for lane in self._lanes:
            lane.shutdown(wait=True, cancel_futures=True)
