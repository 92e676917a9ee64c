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
the polynomial ``Σ b_j · P^j`` over its bytes (mod 2^64, ``P`` odd, so one
pass of prefix sums serves every row and shifting a row's sum by the odd
power's inverse makes it independent of where the row lies in its buffer),
with its length. A null hashes to a constant. Types with no such layout
(lists, maps, unions) raise ``ValueError`` naming the field; shardsink
cannot consolidate them either.
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
_P = np.uint64(0x100000001B3)  # odd: invertible mod 2^64
_P_INV = np.uint64(pow(int(_P), -1, 1 << 64))
_NULL = np.uint64(0x9E3779B97F4A7C15)
_LENGTH = np.uint64(0xD6E8FEB86659FD93)
#: Bytes of string data hashed at once: the power tables and the prefix sums
#: are ``uint64`` per byte, so a block costs 8x its size in scratch memory.
_BLOCK = 1 << 20
_powers: np.ndarray = np.empty(0, dtype=np.uint64)
_inverses: np.ndarray = np.empty(0, dtype=np.uint64)


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


def row_hashes(table: pa.Table | pa.RecordBatch) -> np.ndarray:
    """``h(key, val)`` of every row of ``table``, as ``uint64``."""
    acc = np.zeros(table.num_rows, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for name in ("key", "val"):
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
    """Per row ``r``, the polynomial hash of ``data[offsets[r]:offsets[r+1]]``
    mixed with its length, rows taken a block of about :data:`_BLOCK` bytes at a time."""
    rows = len(offsets) - 1
    out = np.empty(rows, dtype=np.uint64)
    start = 0
    while start < rows:
        limit = offsets[start] + _BLOCK
        stop = max(start + 1, int(np.searchsorted(offsets, limit, side="right")) - 1)
        stop = min(stop, rows)
        base = offsets[start]
        lo, hi = offsets[start:stop] - base, offsets[start + 1 : stop + 1] - base
        chunk = data[base : offsets[stop]]
        powers, inverses = _tables(len(chunk))
        prefix = np.zeros(len(chunk) + 1, dtype=np.uint64)
        np.cumsum(np.multiply(chunk, powers[: len(chunk)], dtype=np.uint64), out=prefix[1:])
        sums = (prefix[hi] - prefix[lo]) * inverses[lo]
        out[start:stop] = sums + (hi - lo).astype(np.uint64) * _LENGTH
        start = stop
    return out


def _tables(n: int) -> tuple[np.ndarray, np.ndarray]:
    """``P^j`` and ``P^-j`` for ``j < n`` at least (kept, grown by doubling)."""
    global _powers, _inverses
    if len(_powers) < n + 1:
        size = max(n + 1, 2 * len(_powers), 1 << 12)
        with np.errstate(over="ignore"):
            _powers = np.empty(size, dtype=np.uint64)
            _powers[0] = 1
            _powers[1:] = np.cumprod(np.full(size - 1, _P, dtype=np.uint64), dtype=np.uint64)
            _inverses = np.empty(size, dtype=np.uint64)
            _inverses[0] = 1
            _inverses[1:] = np.cumprod(np.full(size - 1, _P_INV, dtype=np.uint64), dtype=np.uint64)
    return _powers, _inverses


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
