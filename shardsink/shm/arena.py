"""A worker's arena: pooled shared-memory segments that hold Arrow IPC parts.

The writer encodes a record batch as an Arrow IPC stream straight into a free
region of a segment (no intermediate bytes object) and gets back a
:class:`~shardsink.shm.messages.PartRef`. The region stays reserved until the
reference is :meth:`Arena.release`\\ d, i.e. until the builder acknowledges it;
nothing outstanding is ever overwritten, evicted or moved.

Allocation is first fit at the lowest address over the segments in creation
order, with adjacent free extents merged on release. Releases may come in any
order. Reusing the lowest free address keeps rewriting the same, already
mapped and cache-warm memory: a fresh tmpfs page costs a fault and a zeroing,
which made first writes about 4x slower than rewrites here.

Segments are ``segment_size`` bytes; a part that does not fit one gets a segment
of its own (rounded up to a multiple of ``segment_size``) that stays pooled for
later parts. The bytes of all segments together stay within ``capacity``: idle
segments are unlinked to make room, and when that is not enough
:meth:`Arena.try_write` returns ``None`` and the caller waits for releases. A
single part larger than ``capacity`` is written once nothing else is
outstanding, so one such part may exceed the bound.
"""

from __future__ import annotations

import bisect
import itertools
import mmap
import os

import posix_ipc
import pyarrow as pa

from .errors import ShmError
from .messages import PartRef
from .sweep import SegmentName, check_cluster_id, unlink_segment

ALIGNMENT = 64
DEFAULT_SEGMENT_SIZE = 8 << 20
DEFAULT_CAPACITY = 64 << 20
STAMP_KEY = b"shardsink.part"
_STAMP_ROOM = 256  # the stamp adds 80 bytes to a batch message
_DICTIONARY = pa.dictionary(pa.int32(), pa.string()).id


def _stamp(part_id: int) -> dict[bytes, bytes]:
    # Fixed width, so the size of a stamped stream does not depend on the id.
    return {STAMP_KEY: b"%016x" % part_id}


# Explicit options: the current format whatever the environment says, and
# pyarrow's ``new_stream`` would re-read two environment variables per part.
_WRITE_OPTIONS = pa.ipc.IpcWriteOptions(metadata_version=pa.ipc.MetadataVersion.V5)
# The last schema :func:`size_bound` saw and its serialized size (``None``: it
# has dictionaries). A worker sends one schema over and over; serializing it
# again for every part cost a quarter of the per-part overhead at 1 MiB.
_last_schema: tuple[pa.Schema, int | None] | None = None


def write_stream(sink: pa.NativeFile, batch: pa.RecordBatch, part_id: int | None = None) -> None:
    """Write ``batch`` to ``sink`` as a one-batch Arrow IPC stream, stamped with
    ``part_id`` in the batch message's custom metadata when given."""
    with pa.ipc.RecordBatchStreamWriter(sink, batch.schema, options=_WRITE_OPTIONS) as writer:
        if part_id is None:
            writer.write_batch(batch)
        else:
            writer.write_batch(batch, custom_metadata=_stamp(part_id))


def size_bound(batch: pa.RecordBatch) -> int:
    """An upper bound, within a few hundred bytes, of the length of ``batch``
    written to an arena (a stamped one-batch IPC stream)."""
    global _last_schema
    schema = batch.schema
    cached = _last_schema
    if cached is not None and cached[0].equals(schema, check_metadata=True):
        schema_size = cached[1]
    else:
        # Dictionary batches precede the record batch; only a dry run sizes them.
        schema_size = None if has_dictionary(schema.types) else schema.serialize().size
        _last_schema = (schema, schema_size)
    if schema_size is None:
        mock = pa.MockOutputStream()
        write_stream(mock, batch, 0)
        return mock.size()
    # A dry run costs ~20 us; this ~2 us: schema message + batch message + end of
    # stream, plus room for the stamp in the batch message's custom metadata.
    return schema_size + pa.ipc.get_record_batch_size(batch) + 8 + _STAMP_ROOM


def has_dictionary(types) -> bool:
    for t in types:
        if t.id == _DICTIONARY or (
            t.num_fields and has_dictionary([t.field(i).type for i in range(t.num_fields)])
        ):
            return True
    return False


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


class _Segment:
    """One mapped segment and its free extents ``(offset, size)``, sorted."""

    __slots__ = ("free", "label", "live", "mm", "name", "size", "view")

    def __init__(self, name: SegmentName, size: int) -> None:
        try:
            shm = posix_ipc.SharedMemory(name.ipc_name, posix_ipc.O_CREX, mode=0o600, size=size)
        except posix_ipc.ExistentialError as exc:
            raise ShmError(f"shared-memory segment {name} already exists") from exc
        try:
            os.fchmod(shm.fd, 0o600)  # whatever the umask
            self.mm = mmap.mmap(shm.fd, size)
        except BaseException:
            shm.unlink()
            raise
        finally:
            shm.close_fd()
        self.name = name
        self.label = str(name)
        self.size = size
        self.view = memoryview(self.mm)
        self.free: list[tuple[int, int]] = [(0, size)]
        self.live = 0

    def take(self, n: int) -> int | None:
        for i, (offset, size) in enumerate(self.free):
            if size >= n:
                if size == n:
                    del self.free[i]
                else:
                    self.free[i] = (offset + n, size - n)
                self.live += 1
                return offset
        return None

    def give(self, offset: int, n: int) -> None:
        i = bisect.bisect_left(self.free, (offset, 0))
        if i > 0 and sum(self.free[i - 1]) == offset:
            offset, n = self.free[i - 1][0], self.free[i - 1][1] + n
            i -= 1
            del self.free[i]
        if i < len(self.free) and offset + n == self.free[i][0]:
            n += self.free[i][1]
            del self.free[i]
        self.free.insert(i, (offset, n))
        self.live -= 1

    def close(self, unlink: bool) -> None:
        if unlink:
            unlink_segment(self.name)
        self.view.release()
        self.mm.close()


class Arena:
    """Pooled shared-memory segments of one writer process (see the module doc).

    Not thread-safe. Segments are created mode 0600 and named after
    ``cluster`` and this process (see :mod:`shardsink.shm.sweep`). Use as a
    context manager or call :meth:`close`, which unlinks every segment.
    """

    def __init__(
        self,
        cluster: str,
        *,
        segment_size: int = DEFAULT_SEGMENT_SIZE,
        capacity: int = DEFAULT_CAPACITY,
    ) -> None:
        self.cluster = check_cluster_id(cluster)
        if segment_size <= 0 or segment_size % mmap.PAGESIZE:
            raise ValueError(
                f"segment_size {segment_size} must be a positive multiple of {mmap.PAGESIZE}"
            )
        if capacity < segment_size:
            raise ValueError(f"capacity {capacity} is below segment_size {segment_size}")
        self.segment_size = segment_size
        self.capacity = capacity
        self._segments: list[_Segment] = []
        self._outstanding: dict[tuple[str, int], tuple[_Segment, int, PartRef]] = {}
        self._ids = itertools.count()
        self._retired: list[str] = []
        self._pid = os.getpid()
        self._closed = False

    @property
    def outstanding(self) -> int:
        """Parts written and not yet released."""
        return len(self._outstanding)

    @property
    def outstanding_bytes(self) -> int:
        """Bytes reserved by outstanding parts (alignment included)."""
        return sum(n for _, n, _ in self._outstanding.values())

    @property
    def mapped_bytes(self) -> int:
        """Bytes of all segments of the arena."""
        return sum(seg.size for seg in self._segments)

    @property
    def segments(self) -> list[str]:
        """Names of the arena's segments, oldest first."""
        return [seg.label for seg in self._segments]

    def try_write(self, batch: pa.RecordBatch, bound: int | None = None) -> PartRef | None:
        """Write ``batch`` into the arena; ``None`` if there is no room until
        parts are released.

        ``bound`` is :func:`size_bound` of ``batch`` if the caller has it already.
        The part keeps all of the space reserved for the bound, so a later part
        of the same shape fits exactly where it was. Raises ``ValueError`` if
        the arena is closed.
        """
        if self._closed:
            raise ValueError("arena is closed")
        if bound is None:
            bound = size_bound(batch)
        reserved = _round_up(bound, ALIGNMENT)
        found = self._allocate(reserved)
        if found is None:
            return None
        seg, offset = found
        part_id = next(self._ids)
        try:
            sink = pa.FixedSizeBufferWriter(pa.py_buffer(seg.view[offset : offset + bound]))
            write_stream(sink, batch, part_id)
        except BaseException:
            seg.give(offset, reserved)
            raise
        ref = PartRef(seg.label, offset, sink.tell(), part_id)
        self._outstanding[(ref.segment, offset)] = (seg, reserved, ref)
        return ref

    def release(self, ref: PartRef) -> None:
        """Free the space of an outstanding part (the builder acknowledged it).

        Raises ``ValueError`` if ``ref`` is not outstanding in this arena.
        """
        entry = self._outstanding.get((ref.segment, ref.offset))
        if entry is None or entry[2] != ref:
            raise ValueError(f"part {ref} is not outstanding in this arena")
        del self._outstanding[(ref.segment, ref.offset)]
        seg, n, _ = entry
        seg.give(ref.offset, n)

    def take_retired(self) -> list[str]:
        """Names of segments unlinked since the last call (to tell the reader)."""
        retired, self._retired = self._retired, []
        return retired

    def close(self) -> None:
        """Unlink and unmap every segment; idempotent. Outstanding parts are
        abandoned: readers that mapped them keep their mappings. In a forked
        child the parent's segments are only unmapped, never unlinked."""
        if self._closed:
            return
        self._closed = True
        owner = os.getpid() == self._pid
        for seg in self._segments:
            seg.close(unlink=owner)
            self._retired.append(seg.label)
        self._segments.clear()
        self._outstanding.clear()

    def __enter__(self) -> Arena:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _allocate(self, n: int) -> tuple[_Segment, int] | None:
        for seg in self._segments:
            offset = seg.take(n)
            if offset is not None:
                return seg, offset
        size = max(self.segment_size, _round_up(n, self.segment_size))
        excess = self.mapped_bytes + size - self.capacity
        if excess > 0:
            idle = sorted((s for s in self._segments if s.live == 0), key=lambda s: -s.size)
            if not self._outstanding or sum(s.size for s in idle) >= excess:
                for seg in idle:
                    if excess <= 0:
                        break
                    self._evict(seg)
                    excess -= seg.size
            if excess > 0 and self._outstanding:
                return None
        seg = _Segment(SegmentName.fresh(self.cluster), size)
        self._segments.append(seg)
        offset = seg.take(n)
        assert offset is not None
        return seg, offset

    def _evict(self, seg: _Segment) -> None:
        self._segments.remove(seg)
        seg.close(unlink=True)
        self._retired.append(seg.label)
