"""The builder side of the arena: map segments once, read parts zero-copy.

A part is read by slicing the cached read-only mapping of its segment and
decoding the Arrow IPC stream in place, so the returned batch's buffers point
into shared memory. Before a batch is returned the reader checks, and raises a
clear error naming segment, offset and length otherwise:

- the segment is a shardsink segment of the expected cluster (and creator, if
  the reader was given the accepted creator pids), owned by this user and
  private to it (:class:`UnknownSegment`);
- offset and length lie inside the segment (:class:`PartOutOfBounds`);
- the bytes are exactly one IPC stream, end to end, holding exactly one record
  batch that is structurally valid and stamped with the reference's part id
  (:class:`CorruptPart`); the stamp catches a stale or misdirected reference;
- the schema equals the expected one, if given (:class:`SchemaMismatch`).

There is no checksum over the data: zlib's crc32 runs at 4.2 GB/s here, so on
both sides it would cap the transport below that, against 10-16 GB/s without
it for 1-16 MiB parts; nor could it protect a zero-copy batch from being
overwritten after the check. A byte changed inside a data buffer is therefore
not detected: integrity of the data rests on the arena never reusing
unacknowledged space and on segments being private to this user.
``full_validation=True`` adds Arrow's full validation (offsets in range, valid
UTF-8), so that no damage can yield a batch unsafe to use; it costs about 90 us
per MiB of the workloads' batches and is off by default.

Lifetime: a returned batch pins the mapping it points into. :meth:`forget` and
:meth:`close` drop the reader's own references and unmap at once when no batch
is alive; otherwise the mapping goes when the last such batch is collected.
Reading a batch is always safe; reading it after acknowledging its part may
see the writer's next part, which is why a builder acknowledges only when done.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import stat
import struct
from collections.abc import Callable, Collection

import posix_ipc
import pyarrow as pa

from .arena import STAMP_KEY, has_dictionary
from .errors import CorruptPart, PartOutOfBounds, SchemaMismatch, UnknownSegment
from .messages import PartRef
from .sweep import SegmentName, check_cluster_id

# Built once: pyarrow's open_stream would build default options for every part.
_READ_OPTIONS = pa.ipc.IpcReadOptions()
_EOS = pa.py_buffer(b"\xff\xff\xff\xff\x00\x00\x00\x00")  # continuation, length 0


def decode_part(
    buf: pa.Buffer,
    where: str | Callable[[], str],
    *,
    part_id: int | None = None,
    schema: pa.Schema | None = None,
    full_validation: bool = False,
) -> pa.RecordBatch:
    """Decode ``buf`` as one Arrow IPC stream with one record batch, zero-copy.

    ``where`` names the part in errors; on the transport's hot path it is a
    function, called only on failure (formatting a name for every part costs
    a microsecond). If ``part_id`` is given the batch must carry that stamp;
    if ``schema`` is given the batch must have it. Raises
    :class:`CorruptPart` or :class:`SchemaMismatch`.
    """
    try:
        return _decode(buf, part_id, schema, full_validation)
    except (CorruptPart, SchemaMismatch) as exc:
        place = where if isinstance(where, str) else where()
        raise type(exc)(f"{place}: {exc}") from exc.__cause__


def _decode(
    buf: pa.Buffer, part_id: int | None, schema: pa.Schema | None, full_validation: bool
) -> pa.RecordBatch:
    batch = _read_usual(buf, part_id)
    if batch is None:
        batch = _read_any(buf, part_id)
    try:
        batch.validate(full=full_validation)
    except (pa.ArrowException, OSError) as exc:
        raise CorruptPart(f"not a valid Arrow IPC part: {exc}") from exc
    if schema is not None and not batch.schema.equals(schema):
        raise SchemaMismatch(
            f"schema ({_fields(batch.schema)}) is not the expected ({_fields(schema)})"
        )
    return batch


def _read_usual(buf: pa.Buffer, part_id: int | None) -> pa.RecordBatch | None:
    """The batch of a part as a worker writes it: a schema message whose bytes
    are those of a schema already read, one record batch message stamped with
    ``part_id``, the end-of-stream marker. ``None`` for anything else, for
    :func:`_read_any` to read or explain. Opening a stream reader parses the
    schema afresh, 60% of the cost of a part here; this skips that."""
    try:
        source = pa.BufferReader(buf)
        schema = _schemas.get(pa.ipc.read_message(source).metadata.to_pybytes())
        if schema is None:
            return None
        body = pa.ipc.read_message(source)
        end = source.tell()
        if body.type != "record batch" or not (
            end == buf.size or (end + 8 == buf.size and buf.slice(end).equals(_EOS))
        ):
            return None
        if part_id is not None:
            # The stamp as the writer lays it out: two flatbuffer strings (length,
            # bytes, NUL) of the message's only custom metadata entry.
            flat = body.metadata.to_pybytes()
            if _STAMP_KEY_STRING not in flat or _flat_string(b"%016x" % part_id) not in flat:
                return None
        return pa.ipc.read_record_batch(body, schema)
    except (pa.ArrowException, OSError, EOFError):
        return None


def _read_any(buf: pa.Buffer, part_id: int | None) -> pa.RecordBatch:
    """The batch of ``buf`` read as a stream, or :class:`CorruptPart` saying why
    it is not one stamped with ``part_id``. Remembers the schema for
    :func:`_read_usual` if it has no dictionaries."""
    source = pa.BufferReader(buf)
    try:
        reader = pa.ipc.RecordBatchStreamReader(source, options=_READ_OPTIONS)
        batch, custom = reader.read_next_batch_with_custom_metadata()
        end = source.tell()
        if end + 8 == buf.size and buf.slice(end).equals(_EOS):
            end = buf.size  # the end-of-stream marker, known without a StopIteration
        elif end != buf.size:  # read on to say what follows the batch
            try:
                reader.read_next_batch()
            except StopIteration:
                pass
            else:
                raise CorruptPart("holds more than one record batch")
            end = source.tell()
    except StopIteration:
        raise CorruptPart("holds no record batch") from None
    except (pa.ArrowException, OSError) as exc:
        raise CorruptPart(f"not a valid Arrow IPC part: {exc}") from exc
    if end != buf.size:
        raise CorruptPart(f"the stream ends at byte {end} of {buf.size}")
    if part_id is not None:
        found = custom.get(STAMP_KEY) if custom is not None else None
        if found != b"%016x" % part_id:
            raise CorruptPart(f"stamped {found!r}, expected part id {part_id}")
    if not has_dictionary(batch.schema.types):
        if len(_schemas) >= _SCHEMAS_KEPT:
            _schemas.clear()
        key = pa.ipc.read_message(pa.BufferReader(buf)).metadata.to_pybytes()
        _schemas[key] = batch.schema
    return batch


def _flat_string(data: bytes) -> bytes:
    return struct.pack("<I", len(data)) + data + b"\0"


_STAMP_KEY_STRING = _flat_string(STAMP_KEY)
# Schemas read from parts, by the bytes of their schema message (see _read_usual).
_schemas: dict[bytes, pa.Schema] = {}
_SCHEMAS_KEPT = 64


def _where(ref: PartRef) -> str:
    return f"part at offset {ref.offset}, length {ref.length} of segment {ref.segment}"


def _fields(schema: pa.Schema) -> str:
    return ", ".join(f"{field.name}: {field.type}" for field in schema)


class _Mapping:
    __slots__ = ("buffer", "mm")

    def __init__(self, name: SegmentName) -> None:
        try:
            shm = posix_ipc.SharedMemory(name.ipc_name)
        except posix_ipc.ExistentialError:
            raise UnknownSegment(f"segment {name} does not exist") from None
        try:
            info = os.fstat(shm.fd)
            if info.st_uid != os.geteuid() or stat.S_IMODE(info.st_mode) & 0o077:
                raise UnknownSegment(
                    f"segment {name} is owned by uid {info.st_uid} with mode "
                    f"{stat.S_IMODE(info.st_mode):o}; expected uid {os.geteuid()}, mode 600"
                )
            if info.st_size == 0:
                raise UnknownSegment(f"segment {name} is empty")
            self.mm = mmap.mmap(shm.fd, info.st_size, access=mmap.ACCESS_READ)
        finally:
            shm.close_fd()
        self.buffer = pa.py_buffer(self.mm)

    def close(self) -> None:
        self.buffer = None
        # Batches still pointing into the mapping keep it until they are collected.
        with contextlib.suppress(BufferError):
            self.mm.close()


class SegmentReader:
    """Reads parts of the arenas of one cluster (see the module doc).

    ``creators``: if given, only segments created by these pids are accepted.
    Not thread-safe; :meth:`close` is idempotent.
    """

    def __init__(
        self,
        cluster: str,
        *,
        creators: Collection[int] | None = None,
        full_validation: bool = False,
    ) -> None:
        self.cluster = check_cluster_id(cluster)
        self.creators = None if creators is None else frozenset(creators)
        self.full_validation = full_validation
        self._maps: dict[str, _Mapping] = {}
        self._closed = False

    def read(self, ref: PartRef, schema: pa.Schema | None = None) -> pa.RecordBatch:
        """The record batch of part ``ref``, zero-copy; see the module doc for
        the checks and errors. ``ValueError`` if the reader is closed."""
        mapping = self._maps.get(ref.segment) or self._mapping(ref.segment)
        buffer = mapping.buffer
        offset, length = ref.offset, ref.length
        if offset < 0 or length <= 0 or offset + length > buffer.size:
            raise PartOutOfBounds(
                f"{_where(ref)}: reaches past the segment's end ({buffer.size} bytes)"
            )
        return decode_part(
            buffer.slice(offset, length),
            lambda: _where(ref),
            part_id=ref.id,
            schema=schema,
            full_validation=self.full_validation,
        )

    def mapping(self, segment: str) -> pa.Buffer | None:
        """The reader's mapping of ``segment`` (all of it, read-only), or ``None``
        if it is not mapped; batches read from it point inside this buffer."""
        mapping = self._maps.get(segment)
        return None if mapping is None else mapping.buffer

    @property
    def mapped(self) -> list[str]:
        """Names of the segments currently mapped."""
        return list(self._maps)

    def forget(self, segments: Collection[str]) -> None:
        """Drop the mappings of ``segments`` (unlinked by their writer)."""
        for segment in segments:
            mapping = self._maps.pop(segment, None)
            if mapping is not None:
                mapping.close()

    def close(self) -> None:
        """Drop every mapping; idempotent (see the module doc for live batches)."""
        self._closed = True
        self.forget(list(self._maps))

    def __enter__(self) -> SegmentReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _mapping(self, segment: str) -> _Mapping:
        if self._closed:
            raise ValueError("segment reader is closed")
        mapping = self._maps.get(segment)
        if mapping is not None:
            return mapping
        try:
            name = SegmentName.parse(segment)
        except ValueError as exc:
            raise UnknownSegment(str(exc)) from None
        if name.cluster != self.cluster:
            raise UnknownSegment(f"segment {segment} is not of cluster {self.cluster!r}")
        if self.creators is not None and name.pid not in self.creators:
            raise UnknownSegment(
                f"segment {segment} was created by pid {name.pid}, "
                f"not one of {sorted(self.creators)}"
            )
        mapping = self._maps[segment] = _Mapping(name)
        return mapping
