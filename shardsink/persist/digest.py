"""Content digests: what a batch holds, told without the rows.

A :class:`Digest` of a table of updates is its row count, the sum of its
diffs and ``hash = Σ diff · h(key, val) mod 2^64``, where ``h`` hashes one
row's key and value (``ts`` is left out). The hash part is linear in the
diffs, so it does not change when updates of one ``(key, val)`` are summed
(consolidation, compaction) or their times move (``since``), and the digest
of a union is the sum of the parts' digests in any order: the digests the
workers report for an interval add up to the one of the interval's batches,
and the batches of a shard add up to the one of its consolidated content.

``h`` is computed column by column with numpy, without a Python loop: every
8-byte word of a row's leaves (a struct is walked into its fields; a
fixed-width value is its bits, a string or binary its little-endian words
and its length) is multiplied by an odd constant of its own leaf and place,
the products are summed, and the splitmix64 finalizer mixes the sum into
``h``. Odd constants make a change of any one word change the sum, and the
finalizer (a bijection) then ``h``; one finalizer per row, not per word,
keeps the digest a small share of a worker's CPU (``bench cluster``'s
``digest`` section measures it). A null counts as a constant. Types with
no such layout (lists, maps, unions) raise ``ValueError`` naming the
field; shardsink cannot consolidate them either.
"""

from __future__ import annotations

import functools
import operator
import os
import struct
import threading

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: Set to 1, no digest is computed (:func:`written` is ``None``): only
#: ``bench cluster``'s digest-cost section sets it, to measure their cost.
NO_DIGEST_ENV = "SHARDSINK_NO_DIGEST"
_MASK = (1 << 64) - 1
_STEP = np.uint64(0xA0761D6478BD642F)
_NULL = np.uint64(0x9E3779B97F4A7C15)
_LENGTH = np.uint64(0xD6E8FEB86659FD93)
#: The splitmix64 finalizer: xor with the value shifted right, then multiply.
_MIX_STEPS = ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB), (31, None))


#: The hash this module computes. Digests stored with another (``0``, the
#: first one, which mixed every word) are not compared: their sums mean
#: nothing to this one (:func:`comparable`).
SCHEME = 1


class Digest(msgspec.Struct, frozen=True, forbid_unknown_fields=True, array_like=True):
    """``rows`` updates whose diffs sum to ``diffs`` and whose hash (see the
    module doc) by hash ``scheme`` is ``hash``. ``rows`` is what was written;
    consolidation changes it, so only :meth:`same_content` is kept by
    compaction. An empty digest (all zero) is the same in every scheme."""

    rows: int = 0
    diffs: int = 0
    hash: int = 0
    #: last, defaulted: a digest stored before schemes were recorded decodes as 0
    scheme: int = 0

    def __add__(self, other: Digest) -> Digest:
        """The digest of both; ``ValueError`` if they are of two schemes."""
        if other.empty():
            return self
        if self.empty():
            return other
        if self.scheme != other.scheme:
            raise ValueError(f"digests of hash schemes {self.scheme} and {other.scheme}")
        return Digest(
            self.rows + other.rows,
            self.diffs + other.diffs,
            (self.hash + other.hash) & _MASK,
            self.scheme,
        )

    def empty(self) -> bool:
        return (self.rows, self.diffs, self.hash) == (0, 0, 0)

    def same_content(self, other: Digest) -> bool:
        """Whether both describe the same collection (diffs and hash; not rows)."""
        return (self.diffs, self.hash) == (other.diffs, other.hash)

    def describe(self) -> str:
        return f"{self.rows} rows, diffs {self.diffs}, hash {self.hash:016x}"


def total(digests) -> Digest:
    """The sum of ``digests`` (an empty one for none); ``ValueError`` if
    they are of two schemes."""
    out = Digest()
    for d in digests:
        out = out + d
    return out


def total_known(digests) -> Digest | None:
    """The sum of ``digests``; ``None`` if one of them is (unknown) or they
    are of two schemes."""
    digests = list(digests)
    if any(d is None for d in digests) or len({d.scheme for d in digests if not d.empty()}) > 1:
        return None
    return total(digests)


def comparable(stored: Digest) -> bool:
    """Whether ``stored`` can be checked against a digest computed now:
    empty, or of :data:`SCHEME`."""
    return stored.empty() or stored.scheme == SCHEME


def digest(table: pa.Table | pa.RecordBatch) -> Digest:
    """The digest of ``table`` (columns ``key``, ``val``, ``diff``; ``ts`` and
    others ignored). ``ValueError`` naming a field whose type cannot be hashed."""
    n = table.num_rows
    if n == 0:
        return Digest()
    if n <= SMALL_ROWS:
        small = _small_digest(table)
        if small is not None:
            return small
    return _array_digest(table)


def _array_digest(table: pa.Table | pa.RecordBatch) -> Digest:
    """:func:`digest` with numpy, column by column."""
    n = table.num_rows
    diffs = _numpy(table.column("diff")).astype(np.int64, copy=False)
    with np.errstate(over="ignore"):
        hashed = int(np.dot(row_hashes(table), diffs.view(np.uint64)))
    return Digest(n, int(diffs.sum()), hashed, SCHEME)


#: Up to this many rows a table is small: Python's loops over its values
#: cost less than numpy's and Arrow's calls (:func:`_small_digest`, and
#: consolidation's and the ts check's looks in ``parts``).
SMALL_ROWS = 64


def _small_digest(table: pa.Table | pa.RecordBatch) -> Digest | None:
    """:func:`digest` in Python, the same hash; ``None`` unless every leaf of
    key and val is an integer, string or binary column without nulls. Why:
    numpy's calls cost the same for 4 rows as for thousands; a 4-row
    append's digest took 35 us with them (by hand, ``perf_counter``)."""
    shares = []
    index = 0
    for name in ("key", "val"):
        for path, leaf in leaves(name, table.column(name)):
            index += 1
            kind = leaf.type
            if leaf.null_count or pa.types.is_dictionary(kind):
                return None
            if pa.types.is_integer(kind):
                mask = (1 << kind.bit_width) - 1
                constant = _int_constants(index, 1)[0][0]
                shares.append([(v & mask) * constant for v in leaf.to_pylist()])
            elif _kind(path, kind) == "var":
                shares.append([_small_bytes_hash(v, index) for v in leaf.to_pylist()])
            else:
                return None
    diffs = table.column("diff").to_pylist()
    if None in diffs:
        return None
    hashed = 0
    for row, diff in enumerate(diffs):
        hashed += _mix_one(sum(share[row] for share in shares) & _MASK) * (diff & _MASK)
    return Digest(len(diffs), sum(diffs), hashed & _MASK, SCHEME)


def _small_bytes_hash(value: str | bytes, index: int) -> int:
    """:func:`_bytes_hash` of one value, unmasked."""
    data = value.encode() if isinstance(value, str) else value
    count = (len(data) + 7) // 8
    words = struct.unpack(f"<{count}Q", data.ljust(8 * count, b"\0"))
    constants, length = _int_constants(index, count)
    return sum(map(operator.mul, constants, words)) + len(data) * length


@functools.lru_cache(maxsize=1024)
def _int_constants(index: int, count: int) -> tuple[tuple[int, ...], int]:
    """Leaf ``index``'s first ``count`` word constants and its length
    constant, as Python ints."""
    constants = _constants(index, max(count, 1))[:count]
    return tuple(int(c) for c in constants), int(_length_constant(index))


def _mix_one(z: int) -> int:
    """:func:`mix` of one 64-bit value."""
    for shift, factor in _MIX_STEPS:
        z ^= z >> shift
        if factor is not None:
            z = (z * factor) & _MASK
    return z


def written(table: pa.Table | pa.RecordBatch) -> Digest | None:
    """:func:`digest` of ``table`` as a writer records it; ``None`` when
    :data:`NO_DIGEST_ENV` turns digests off."""
    return None if os.environ.get(NO_DIGEST_ENV) == "1" else digest(table)


def row_hashes(
    table: pa.Table | pa.RecordBatch, columns: tuple[str, ...] = ("key", "val")
) -> np.ndarray:
    """``h(key, val)`` of every row of ``table`` (or the hash of other
    ``columns``), as ``uint64``."""
    acc = np.empty(table.num_rows, dtype=np.uint64)
    share = _scratch(table.num_rows)
    index = 0
    with np.errstate(over="ignore"):
        for name in columns:
            for path, leaf in leaves(name, table.column(name)):
                index += 1
                # the first leaf's share is the sum so far: no zeroing, no add
                # (two passes over the rows of six, the digest being bound by
                # memory traffic rather than arithmetic)
                _leaf(path, leaf, index, acc if index == 1 else share)
                if index > 1:
                    acc += share
    if index == 0:
        acc[:] = 0
    return mix(acc, scratch=share)


#: Rows up to which a thread keeps its :func:`_scratch` array (8 MiB).
SCRATCH_ROWS = 1 << 20
_scratches = threading.local()


def _scratch(rows: int) -> np.ndarray:
    """A ``uint64`` array of ``rows`` for this thread's intermediate sums,
    reused by the next digest. Why: a fresh 400 kB array page-faults; with
    fresh ones for each step, a digest of 50,000 trickle rows cost 0.84 ms
    of CPU, against 0.60 ms reusing one (``process_time``, by hand). Beyond
    :data:`SCRATCH_ROWS`, a fresh one (not kept)."""
    if rows > SCRATCH_ROWS:
        return np.empty(rows, dtype=np.uint64)
    kept = getattr(_scratches, "array", None)
    if kept is None or len(kept) < rows:
        kept = _scratches.array = np.empty(max(rows, 1024), dtype=np.uint64)
    return kept[:rows]


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


def _leaf(path: str, array: pa.Array | pa.ChunkedArray, index: int, out: np.ndarray) -> None:
    """Write into ``out`` the ``index``-th leaf's share of each row's sum:
    its words times odd constants of its own (see :func:`_constants`)."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks() if array.num_chunks != 1 else array.chunk(0)
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    kind = _kind(path, array.type)
    if kind == "view":
        array = array.cast(pa.large_binary())
        kind = "var"
    constant = _constants(index, 1)[0]
    with np.errstate(over="ignore"):
        if kind == "bool":
            np.multiply(_numpy(pc.fill_null(pc.cast(array, pa.uint8()), 0)), constant, out=out)
        elif kind == "word":
            width = array.type.bit_width // 8
            data = np.frombuffer(array.buffers()[1], dtype=f"<u{width}")
            np.multiply(data[array.offset : array.offset + len(array)], constant, out=out)
        elif kind == "fixed":
            width = _width(array.type) // 8
            data = np.frombuffer(array.buffers()[1], dtype=np.uint8)
            data = data[array.offset * width : (array.offset + len(array)) * width]
            offsets = np.arange(0, width * (len(array) + 1), width, dtype=np.int64)
            _bytes_hash(data, offsets, index, out)
        else:
            large = pa.types.is_large_string(array.type) or pa.types.is_large_binary(array.type)
            offsets = np.frombuffer(array.buffers()[1], dtype=np.int64 if large else np.int32)
            offsets = offsets[array.offset : array.offset + len(array) + 1]
            data = np.frombuffer(array.buffers()[2] or b"", dtype=np.uint8)
            _bytes_hash(data, offsets, index, out)
    if array.null_count:
        np.putmask(out, ~_numpy(array.is_valid()), _NULL * constant)


@functools.lru_cache(maxsize=256)
def _constants(index: int, count: int) -> np.ndarray:
    """``count`` odd 64-bit constants of leaf ``index`` (one per word place):
    odd, so a change of any one word changes the row's sum. Cached: a
    digest of a few rows must not pay for making them again."""
    places = np.arange(count, dtype=np.uint64) + np.uint64((index * int(_STEP)) & _MASK)
    constants = mix(places) | np.uint64(1)
    constants.flags.writeable = False
    return constants


@functools.lru_cache(maxsize=256)
def _length_constant(index: int) -> np.uint64:
    """What leaf ``index`` multiplies a value's length by."""
    return np.uint64((int(_constants(index, 1)[0]) * int(_LENGTH)) & _MASK)


def _bytes_hash(data: np.ndarray, offsets: np.ndarray, index: int, out: np.ndarray) -> None:
    """Write into ``out``, per row ``r``, ``Σ_j K_j · w_j`` over the little-endian 8-byte words
    ``w_j`` of ``data[offsets[r]:offsets[r+1]]`` (the last one zero-padded),
    ``K`` leaf ``index``'s constants, plus its length times another: the
    same for a row wherever it lies in its buffer. ``offsets`` of any
    integer type, into ``data``."""
    rows = len(offsets) - 1
    if rows == 0:
        return
    start = int(offsets[0])
    lengths = np.diff(offsets)
    width = int(lengths[0])
    length = _length_constant(index)
    with np.errstate(over="ignore"):
        if (lengths == width).all():  # one length (fixed-width values): a matrix of words
            words = data[start : start + rows * width].reshape(rows, width)
            if width % 8:
                padded = np.zeros((rows, (width + 7) // 8 * 8), dtype=np.uint8)
                padded[:, :width] = words
                words = padded
            words = np.ascontiguousarray(words).view("<u8")
            constants = _constants(index, words.shape[1])
            _weighted_words(words, constants, np.uint64(width) * length, out)
            return
        lengths = lengths.astype(np.int64)
        out[:] = _ragged_words(data[start : int(offsets[-1])], offsets - start, lengths, index)
        out += lengths.astype(np.uint64) * length


#: Rows of a block of :func:`_weighted_words`: its word columns (4 of
#: 16384 rows, 512 KiB at most for 32-byte values) stay in L2 between passes.
BLOCK_ROWS = 1 << 14


def _weighted_words(
    words: np.ndarray, constants: np.ndarray, plus: np.uint64, out: np.ndarray
) -> None:
    """``out[r] = Σ_j constants[j] · words[r, j] + plus``, column by column
    within blocks of :data:`BLOCK_ROWS` rows. Why not ``np.matmul``: on
    values just made (not in L2), it cost 6.9 ns per 32-byte row against
    6.3 for this (12 against 6.3 on values evicted from L2), by hand on
    trickle intervals of 50,000 rows."""
    rows, count = words.shape
    if count == 0:  # every value empty
        out[:] = plus
        return
    term = np.empty(min(rows, BLOCK_ROWS), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for start in range(0, rows, BLOCK_ROWS):
            block, sums = words[start : start + BLOCK_ROWS], out[start : start + BLOCK_ROWS]
            scratch = term[: len(sums)]
            np.multiply(block[:, 0], constants[0], out=sums)
            sums += plus
            for j in range(1, count):
                np.multiply(block[:, j], constants[j], out=scratch)
                sums += scratch


def _ragged_words(
    data: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, index: int
) -> np.ndarray:
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
    constants = _constants(index, int(counts.max()))
    with np.errstate(over="ignore"):
        weighted = (words & keep) * constants[j]
    prefix = np.zeros(len(weighted) + 1, dtype=np.uint64)
    np.cumsum(weighted, out=prefix[1:])
    with np.errstate(over="ignore"):
        return prefix[first + counts] - prefix[first]


def mix(z: np.ndarray, scratch: np.ndarray | None = None) -> np.ndarray:
    """The splitmix64 finalizer, element-wise (wrapping). With a ``scratch``
    array of ``z``'s shape, ``z`` (``uint64``) is overwritten with it."""
    if scratch is None:
        z = np.array(z, dtype=np.uint64)
        scratch = np.empty_like(z)
    with np.errstate(over="ignore"):
        for shift, factor in _MIX_STEPS:
            np.right_shift(z, np.uint64(shift), out=scratch)
            z ^= scratch
            if factor is not None:
                z *= np.uint64(factor)
    return z


def _numpy(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    return column.to_numpy(zero_copy_only=False)
