"""Content digests: what a batch holds, told without the rows.

A :class:`Digest` of a table of updates is its row count, the sum of its
diffs and ``hash = Σ diff · h(key, val) mod 2^64``, where ``h`` hashes one
row's key and value (``ts`` is left out). The hash part is linear in the
diffs, so it does not change when updates of one ``(key, val)`` are summed
(consolidation, compaction) or their times move (``since``), and the digest
of a union is the sum of the parts' digests in any order: the digests the
workers report for an interval add up to the one of the interval's batches,
and the batches of a shard add up to the one of its consolidated content.

``h`` is computed column by column with numpy, without a Python loop: each
leaf column (a struct is walked into its fields) is hashed to one ``uint64``
per row, the leaves are folded in schema order through the splitmix64
finalizer. A fixed-width value is hashed by its bits; a string or binary by
its 8-byte words, each mixed with its place in the value, summed, with its
length (one matrix of words when every value has the same length). A null
hashes to a constant. Types with no such layout (lists, maps, unions)
raise ``ValueError`` naming the field; shardsink cannot consolidate them
either.
"""

from __future__ import annotations

import os

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: Set to 1, no digest is computed (:func:`written` is ``None``): only
#: ``bench cluster``'s digest-cost section sets it, to measure their cost.
NO_DIGEST_ENV = "SHARDSINK_NO_DIGEST"
_MASK = (1 << 64) - 1
_P = np.uint64(0x100000001B3)
_STEP = np.uint64(0xA0761D6478BD642F)
_NULL = np.uint64(0x9E3779B97F4A7C15)
_LENGTH = np.uint64(0xD6E8FEB86659FD93)


class Digest(msgspec.Struct, frozen=True, forbid_unknown_fields=True, array_like=True):
    """``rows`` updates whose diffs sum to ``diffs`` and whose hash (see the
    module doc) is ``hash``. ``rows`` is what was written; consolidation
    changes it, so only :meth:`same_content` is kept by compaction."""

    rows: int = 0
    diffs: int = 0
    hash: int = 0

    def __add__(self, other: Digest) -> Digest:
        return Digest(
            self.rows + other.rows, self.diffs + other.diffs, (self.hash + other.hash) & _MASK
        )

    def same_content(self, other: Digest) -> bool:
        """Whether both describe the same collection (diffs and hash; not rows)."""
        return (self.diffs, self.hash) == (other.diffs, other.hash)

    def describe(self) -> str:
        return f"{self.rows} rows, diffs {self.diffs}, hash {self.hash:016x}"


def total(digests) -> Digest:
    """The sum of ``digests`` (an empty one for none)."""
    out = Digest()
    for d in digests:
        out = out + d
    return out


def total_known(digests) -> Digest | None:
    """The sum of ``digests``; ``None`` if one of them is (unknown)."""
    digests = list(digests)
    return None if any(d is None for d in digests) else total(digests)


def digest(table: pa.Table | pa.RecordBatch) -> Digest:
    """The digest of ``table`` (columns ``key``, ``val``, ``diff``; ``ts`` and
    others ignored). ``ValueError`` naming a field whose type cannot be hashed."""
    n = table.num_rows
    if n == 0:
        return Digest()
    diffs = _numpy(table.column("diff")).astype(np.int64, copy=False)
    h = row_hashes(table)
    with np.errstate(over="ignore"):
        hashed = int(np.sum(h * diffs.view(np.uint64), dtype=np.uint64))
    return Digest(n, int(diffs.sum()), hashed)


def written(table: pa.Table | pa.RecordBatch) -> Digest | None:
    """:func:`digest` of ``table`` as a writer records it; ``None`` when
    :data:`NO_DIGEST_ENV` turns digests off."""
    return None if os.environ.get(NO_DIGEST_ENV) == "1" else digest(table)


def row_hashes(
    table: pa.Table | pa.RecordBatch, columns: tuple[str, ...] = ("key", "val")
) -> np.ndarray:
    """``h(key, val)`` of every row of ``table`` (or the hash of other
    ``columns``), as ``uint64``."""
    acc = np.zeros(table.num_rows, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for name in columns:
            for path, leaf in leaves(name, table.column(name)):
                acc = mix(acc * _P + _leaf(path, leaf))
    return acc


def check_hashable(schema: pa.Schema) -> None:
    """``ValueError`` naming the first field of ``key`` or ``val`` that
    :func:`digest` cannot hash."""
    for name in ("key", "val"):
        for path, leaf in leaves(name, pa.chunked_array([], schema.field(name).type)):
            kind = leaf.type
            _kind(path, kind.value_type if pa.types.is_dictionary(kind) else kind)


def leaves(path: str, column: pa.ChunkedArray | pa.Array):
    """``(path, column)`` of every non-struct leaf under ``column``, in field
    order (``val.price``); a struct's nulls are its fields' (``flatten``)."""
    if pa.types.is_struct(column.type):
        for i, child in enumerate(column.flatten()):
            yield from leaves(f"{path}.{column.type.field(i).name}", child)
    else:
        yield path, column


def _kind(path: str, kind: pa.DataType) -> str:
    if pa.types.is_boolean(kind):
        return "bool"
    if pa.types.is_string(kind) or pa.types.is_binary(kind):
        return "var"
    if pa.types.is_large_string(kind) or pa.types.is_large_binary(kind):
        return "var"
    if pa.types.is_string_view(kind) or pa.types.is_binary_view(kind):
        return "view"
    width = _width(kind)
    if width in (8, 16, 32, 64) and not pa.types.is_decimal(kind):
        return "word"
    if width and width % 8 == 0:
        return "fixed"
    raise ValueError(
        f"field {path} of type {kind} cannot be hashed or sorted: shardsink consolidates "
        "updates by (key, val, ts); use numbers, strings, binary, temporal types or structs "
        "of them"
    )


def _width(kind: pa.DataType) -> int:
    """``kind``'s bits per value, 0 if it has no fixed width."""
    try:
        return kind.bit_width
    except ValueError:
        return 0


def _leaf(path: str, array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks() if array.num_chunks != 1 else array.chunk(0)
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    kind = _kind(path, array.type)
    if kind == "view":
        array = array.cast(pa.large_binary())
        kind = "var"
    if kind == "bool":
        h = _numpy(pc.cast(array, pa.uint8())).astype(np.uint64)
    elif kind == "word":
        width = array.type.bit_width // 8
        data = np.frombuffer(array.buffers()[1], dtype=f"<u{width}")
        h = data[array.offset : array.offset + len(array)].astype(np.uint64)
    elif kind == "fixed":
        width = _width(array.type) // 8
        data = np.frombuffer(array.buffers()[1], dtype=np.uint8)
        data = data[array.offset * width : (array.offset + len(array)) * width]
        h = _bytes_hash(data, np.arange(0, width * (len(array) + 1), width, dtype=np.int64))
    else:
        large = pa.types.is_large_string(array.type) or pa.types.is_large_binary(array.type)
        offsets = np.frombuffer(array.buffers()[1], dtype=np.int64 if large else np.int32)
        offsets = offsets[array.offset : array.offset + len(array) + 1].astype(np.int64)
        data = np.frombuffer(array.buffers()[2] or b"", dtype=np.uint8)
        h = _bytes_hash(data[offsets[0] : offsets[-1]], offsets - offsets[0])
    h = mix(h)
    if array.null_count:
        h = np.where(_numpy(array.is_valid()), h, _NULL)
    return h


def _bytes_hash(data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per row ``r``, ``Σ_j mix(w_j + j·STEP)`` over the little-endian 8-byte
    words ``w_j`` of ``data[offsets[r]:offsets[r+1]]`` (the last one
    zero-padded), plus its length times a constant: eight bytes per element,
    and the same for a row wherever it lies in its buffer."""
    rows = len(offsets) - 1
    lengths = np.diff(offsets)
    if rows == 0:
        return np.empty(0, dtype=np.uint64)
    width = int(lengths[0])
    if (lengths == width).all():  # one length (fixed-width values): a matrix of words
        words = np.zeros((rows, (width + 7) // 8 * 8), dtype=np.uint8)
        words[:, :width] = data[: rows * width].reshape(rows, width)
        words = words.view("<u8")
        steps = np.arange(words.shape[1], dtype=np.uint64) * _STEP
        with np.errstate(over="ignore"):
            sums = mix(words + steps).sum(axis=1, dtype=np.uint64)
    else:
        sums = _ragged_words(data, offsets, lengths)
    with np.errstate(over="ignore"):
        return sums + lengths.astype(np.uint64) * _LENGTH


def _ragged_words(data: np.ndarray, offsets: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """:func:`_bytes_hash`'s sums for rows of differing lengths: every word
    gathered from a view of the bytes at each offset."""
    padded = np.zeros(len(data) + 8, dtype=np.uint8)
    padded[: len(data)] = data
    at_each_byte = np.ndarray((len(data) + 1,), dtype="<u8", buffer=padded, strides=(1,))
    counts = (lengths + 7) // 8
    first = np.cumsum(counts) - counts
    row = np.repeat(np.arange(len(counts)), counts)
    j = np.arange(int(counts.sum()), dtype=np.int64) - first[row]
    words = at_each_byte[offsets[:-1][row] + 8 * j]
    tail = (lengths[row] - 8 * j).clip(0, 8)  # bytes of the row in this word
    keep = np.where(tail >= 8, ~np.uint64(0), (np.uint64(1) << (8 * tail).astype(np.uint64)) - 1)
    with np.errstate(over="ignore"):
        hashed = mix((words & keep) + j.astype(np.uint64) * _STEP)
    prefix = np.zeros(len(hashed) + 1, dtype=np.uint64)
    np.cumsum(hashed, out=prefix[1:])
    with np.errstate(over="ignore"):
        return prefix[first + counts] - prefix[first]


def mix(z: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer, element-wise (wrapping)."""
    with np.errstate(over="ignore"):
        z = z ^ (z >> np.uint64(30))
        z = z * np.uint64(0xBF58476D1CE4E5B9)
        z = z ^ (z >> np.uint64(27))
        z = z * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _numpy(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    return column.to_numpy(zero_copy_only=False)
