"""Garbage collection of a shard: retired blobs, old versions, leaked blobs.

Safety rests on two facts the transitions keep: a blob leaves the state only
by being *retired* at the version that stopped referencing it, and a reader's
seqno hold only moves forward (a new reader holds the newest version). So a
blob retired at version ``r`` is referenced by no version ``>= r``, and once
every live reader holds a seqno ``>= r`` nobody can read it any more.
"""

from __future__ import annotations

import msgspec

from .. import faults
from ..storage import Blob, temp_files
from .commands import ExpireReaders, ExpireWriters, ForgetRetired, ForgetRollups
from .machine import LocalMachine, ShardMachine
from .state import part_writer


class GcReport(msgspec.Struct, kw_only=True):
    """What one :func:`collect_garbage` run did."""

    readers_expired: tuple[str, ...] = ()
    writers_expired: tuple[str, ...] = ()
    seqno_hold: int = 0
    blobs_deleted: tuple[str, ...] = ()
    truncated_below: int = 0
    versions_truncated: int = 0
    rollups_retired: int = 0


def expire(machine: ShardMachine) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Drop the readers whose lease ran out (releasing their seqno holds) and
    the writers not seen for the machine's ``config.writer_lease_ms``; return
    the ids of the readers and of the writers dropped. Cheap when nothing
    expired: no new version is written."""
    before = machine.state(refresh=True)
    machine.run(ExpireReaders())
    machine.run(ExpireWriters(machine.config.writer_lease_ms))
    after = machine.state()
    return (
        tuple(sorted(before.readers.keys() - after.readers.keys())),
        tuple(sorted(before.writers.keys() - after.writers.keys())),
    )


def collect_garbage(machine: LocalMachine, blob: Blob) -> GcReport:
    """:func:`expire` readers and writers; delete the blobs retired at or
    below the smallest held seqno; truncate consensus below the latest rollup
    at or below that seqno (every held version stays rebuildable) and retire
    the older rollups. Safe to run concurrently with anything, including
    itself; a run cut short leaves work for the next one, never damage."""
    readers_expired, writers_expired = expire(machine)
    state = machine.state()
    hold = state.seqno_hold()
    live = {k for b in state.batches.values() for k in b.blob_keys()}
    live.update(r.key for r in state.rollups.values())
    due = sorted(s for s in state.retired if s <= hold)
    faults.point("gc.before_delete")
    deleted = []
    for seqno in due:
        for key in state.retired[seqno]:
            if key not in live:
                blob.delete(key)
                deleted.append(key)
    if due:
        machine.run(ForgetRetired(tuple(due)))
    # holds only move forward, so a rollup at or below the hold always remains
    keep = max(s for s in state.rollups if s <= hold)
    truncated = machine.truncate_below(keep)
    older = sum(1 for s in state.rollups if s < keep)
    if older:
        machine.run(ForgetRollups(keep))
    return GcReport(
        readers_expired=readers_expired,
        writers_expired=writers_expired,
        seqno_hold=hold,
        blobs_deleted=tuple(deleted),
        truncated_below=keep,
        versions_truncated=truncated,
        rollups_retired=older,
    )


def check_grace(grace_ms: int, writer_lease_ms: int) -> None:
    """``ValueError`` unless the sweep's ``grace_ms`` is at least the writer
    lease: a live writer's parts are spared by their prefix, but a blob
    without one (a rollup stored before its version names it, a part of a
    version before writer prefixes) is told from an in-flight one only by
    its age, and nothing of a live writer's is in flight longer than its
    lease without it heartbeating."""
    if grace_ms < writer_lease_ms:
        raise ValueError(
            f"the leaked-blob sweep's grace ({grace_ms} ms) is shorter than the writer lease "
            f"({writer_lease_ms} ms): a blob that young may still be on its way into an "
            f"append; give a grace of at least {writer_lease_ms} ms"
        )


def sweep_leaked_blobs(
    machine: ShardMachine, blob: Blob, grace_ms: int, now_ms: float
) -> list[str]:
    """Delete blobs under the shard's prefix that the latest state does not
    reference (as a part, a rollup or a retired key), and the temporary files
    that writers killed mid-``set`` left there (a ``blob`` that
    :class:`~shardsink.storage.contracts.LeavesTempFiles`), each only if last
    modified at least ``grace_ms`` before ``now_ms`` (milliseconds since the
    epoch) and, for a writer's part (:func:`~.state.part_writer`), only once
    its writer is gone from state. Returns the keys of the blobs, then the
    names of the temporary files, removed. ``ValueError`` for a grace shorter
    than the machine's writer lease (:func:`check_grace`).

    Why this loses nothing: a writer's id is never reused, and a writer gone
    from state can commit nothing any more (its appends are refused), so a
    part of a gone writer that no state references never will be. Blobs are
    listed before the state is read, so a blob appended meanwhile is seen as
    referenced, and one written by a writer registered meanwhile is under a
    live writer's prefix.
    """
    check_grace(grace_ms, machine.config.writer_lease_ms)
    shard = machine.shard
    prefix = f"{shard}/"
    cutoff = (now_ms - grace_ms) / 1000.0
    old = [m.key for m in blob.list_meta(prefix) if m.modified <= cutoff]
    stale = [t.name for t in temp_files(blob, prefix) if t.modified <= cutoff]
    if not (old or stale):
        return []
    state = machine.state(refresh=True)
    referenced = state.referenced_keys()
    writers = state.writers.keys()

    def live(key: str) -> bool:
        return part_writer(shard, key) in writers

    leaked = [key for key in old if key not in referenced and not live(key)]
    stale = [name for name in stale if not live(name.partition("~")[0])]
    faults.point("gc.before_delete")
    for key in leaked:
        blob.delete(key)
    for name in stale:
        blob.delete_temp(name)  # only a blob that LeavesTempFiles lists any
    return leaked + stale
