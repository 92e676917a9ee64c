"""Content digests: what a batch holds, told without the rows.

A :class:`Digest` of a table of updates is its row count, the sum of its
diffs and ``hash = Σ diff · h(key, val) mod 2^64``, where ``h`` hashes one
row's key and value (``ts`` is left out). The hash part is linear in the
diffs, so it does not change when updates of one ``(key, val)`` are summed
(consolidation, compaction) or their times move (``since``), and the digest
of a union is the sum of the parts' digests in any order: the digests the
workers report for an interval add up to the one of the interval's batches,
and the batches of a shard add up to the one of its consolidated content.

``h`` is computed in compiled passes over the rows (:mod:`._hash_kernels`),
one per leaf but for leaves of one word per row, each folded into the pass
after it; the last pass also mixes and sums the rows. Every 8-byte word of
a row's leaves (a struct is walked into its fields; a fixed-width value is
its bits, a string or binary its little-endian words and its length) is
multiplied by an odd constant of its own leaf and place, the products are
summed, and the splitmix64 finalizer mixes the sum into
``h``. Odd constants make a change of any one word change the sum, and the
finalizer (a bijection) then ``h``; one finalizer per row, not per word,
keeps the digest a small share of a worker's CPU (``bench cluster``'s
``digest`` section measures it). A null counts as a constant. Types with
no such layout (lists, maps, unions) raise ``ValueError`` naming the
field; shardsink cannot consolidate them either.
"""

from __future__ import annotations

import functools
import os
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
    diffs = _numpy(table.column("diff")).astype(np.int64, copy=False)
    hashed, diff_total = _passes(table, ("key", "val"), _scratch(n), diffs)
    return Digest(n, int(diff_total), int(hashed), SCHEME)


def prepare() -> None:
    """Load the compiled loops (see :mod:`._hash_kernels`) now, in this
    process: a process that forks children calls it first, so that no child
    loads them again (0.3 s each)."""
    table = pa.table(
        {"key": pa.array([1, 2]), "val": pa.array(["v", "vw"]), "diff": pa.array([1, 1])}
    )
    digest(table)
    # values of one length: in words, each count below RECORD_WORDS is a
    # loop of its own (12-15 ms to load all of them), then the matrix loop,
    # aligned (a multiple of 8 bytes) and not
    for length in [8 * count for count in range(1, _kernels().RECORD_WORDS + 1)] + [13]:
        digest(table.set_column(1, "val", pa.array(["a" * length] * 2)))


@functools.cache
def _kernels():
    """:mod:`._hash_kernels`, imported on first use: numba takes 0.2 s to
    import, which a command that hashes nothing should not pay.
    ``RuntimeError`` saying where to cache them if numba has nowhere to."""
    try:
        from . import _hash_kernels
    except RuntimeError as exc:
        if "cannot cache" not in str(exc):
            raise
        raise RuntimeError(
            "shardsink's digests compile their loops with numba and cache them on disk, "
            f"and numba has nowhere to ({exc}): make {os.path.dirname(__file__)}/__pycache__ "
            "or the user's cache directory writable, or set NUMBA_CACHE_DIR to a directory "
            "that is"
        ) from exc
    return _hash_kernels


def written(table: pa.Table | pa.RecordBatch) -> Digest | None:
    """:func:`digest` of ``table`` as a writer records it; ``None`` when
    :data:`NO_DIGEST_ENV` turns digests off."""
    return None if os.environ.get(NO_DIGEST_ENV) == "1" else digest(table)


def row_hashes(
    table: pa.Table | pa.RecordBatch, columns: tuple[str, ...] = ("key", "val")
) -> np.ndarray:
    """``h(key, val)`` of every row of ``table`` (or the hash of other
    ``columns``), as ``uint64``."""
    sums = np.empty(table.num_rows, dtype=np.uint64)
    _passes(table, columns, sums, None)
    _kernels().mix(sums)
    return sums


def mix(z: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer of each of ``z``, as a new ``uint64`` array."""
    mixed = np.array(z, dtype=np.uint64)
    _kernels().mix(mixed)
    return mixed


_NO_FOLD = np.empty(0, dtype=np.uint64)
#: No word leaf folded into the next pass: ``(words, constant)`` of none.
_NOTHING_FOLDED = (_NO_FOLD, np.uint64(0))
_NO_DIFFS = np.empty(0, dtype=np.int64)


def _passes(
    table: pa.Table | pa.RecordBatch,
    columns: tuple[str, ...],
    sums: np.ndarray,
    diffs: np.ndarray | None,
) -> tuple[int, int]:
    """Hash the leaves of ``columns`` (see the module doc and
    :mod:`._hash_kernels`): a pass per leaf, a leaf of one word per row
    folded into the pass after it. With ``diffs``, the last pass finishes:
    ``(Σ diff · h, Σ diff)``. Without, ``sums`` holds every row's sum before
    the finalizer, and ``(0, 0)`` is returned."""
    kernels = _kernels()
    plain = [
        (path, _plain(leaf)) for name in columns for path, leaf in leaves(name, table.column(name))
    ]
    fold = _NOTHING_FOLDED
    read = False
    for index, (path, array) in enumerate(plain, 1):
        kind = _kind(path, array.type)
        if len(fold[0]) and (kind in ("bool", "word") or array.null_count):
            kernels.add_fold((*fold, sums, _NO_DIFFS, read, False))
            fold, read = _NOTHING_FOLDED, True
        if array.null_count:
            _add_with_nulls(path, array, kind, index, sums, read)
            read = True
        elif kind in ("bool", "word"):
            fold = (_words(array, kind), _constants(index, 1)[0])
        else:
            last = diffs is not None and index == len(plain)
            rows = (*fold, sums, diffs if last else _NO_DIFFS, read, last)
            hashed, diff_total = _share(path, array, kind, index, rows)
            if last:
                return hashed, diff_total
            fold, read = _NOTHING_FOLDED, True
    last = diffs is not None
    return kernels.add_fold((*fold, sums, diffs if last else _NO_DIFFS, read, last))


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


def _plain(array: pa.Array | pa.ChunkedArray) -> pa.Array:
    """``array`` as one chunk, not dictionary-encoded."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks() if array.num_chunks != 1 else array.chunk(0)
    return array.dictionary_decode() if pa.types.is_dictionary(array.type) else array


def _words(array: pa.Array, kind: str) -> np.ndarray:
    """The unsigned words of a ``bool`` or ``word`` leaf (a null's word is
    left as it is)."""
    if kind == "bool":
        return _numpy(pc.fill_null(pc.cast(array, pa.uint8()), 0))
    width = array.type.bit_width // 8
    data = np.frombuffer(array.buffers()[1], dtype=f"<u{width}")
    return data[array.offset : array.offset + len(array)]


def _add_with_nulls(
    path: str, array: pa.Array, kind: str, index: int, sums: np.ndarray, read: bool
) -> None:
    """Write into ``sums`` (``read``: add to it) the ``index``-th leaf's
    share of each row's sum, a null's share a constant of its own."""
    share = np.empty(len(array), dtype=np.uint64)
    _share(path, array, kind, index, (*_NOTHING_FOLDED, share, _NO_DIFFS, False, False))
    null = (int(_NULL) * int(_constants(index, 1)[0])) & _MASK
    np.putmask(share, ~_numpy(array.is_valid()), np.uint64(null))
    if read:
        with np.errstate(over="ignore"):
            sums += share
    else:
        sums[:] = share


def _share(path: str, array: pa.Array, kind: str, index: int, rows: tuple) -> tuple[int, int]:
    """The pass of the ``index``-th leaf (``array``, of ``kind``) with
    ``rows`` as :func:`._hash_kernels.add_records` takes them."""
    kernels = _kernels()
    if kind == "view":
        array = array.cast(pa.large_binary())
        kind = "var"
    if kind in ("bool", "word"):
        return kernels.add_fold((_words(array, kind), _constants(index, 1)[0], *rows[2:]))
    if kind == "fixed":
        width = _width(array.type) // 8
        data = np.frombuffer(array.buffers()[1], dtype=np.uint8)
        offsets = np.arange(array.offset, array.offset + len(array) + 1, dtype=np.int64) * width
        return _bytes(data, offsets, index, rows)
    large = pa.types.is_large_string(array.type) or pa.types.is_large_binary(array.type)
    offsets = np.frombuffer(array.buffers()[1], dtype=np.int64 if large else np.int32)
    offsets = offsets[array.offset : array.offset + len(array) + 1]
    data = np.frombuffer(array.buffers()[2] or b"", dtype=np.uint8)
    return _bytes(data, offsets, index, rows)


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


def _bytes(data: np.ndarray, offsets: np.ndarray, index: int, rows: tuple) -> tuple[int, int]:
    """The pass of leaf ``index``'s values ``data[offsets[r]:offsets[r+1]]``
    with ``rows`` (see :func:`._hash_kernels.add_records`): each value's
    share is ``Σ_j K_j · w_j`` over its little-endian 8-byte words ``w_j``
    (the last one zero-padded), ``K`` leaf ``index``'s constants, plus the
    value's length times another: the same for a value wherever it lies in
    its buffer."""
    kernels = _kernels()
    length_constant = _length_constant(index)
    shortest, longest = (int(n) for n in kernels.length_range(offsets))
    if shortest == longest:  # values of one length (uuids, hashes, padded codes)
        start, rows_count = int(offsets[0]), len(offsets) - 1
        whole, tail = divmod(longest, 8)
        plus = np.uint64((longest * int(length_constant)) & _MASK)
        constants = _constants(index, max(whole + (tail > 0), 1))
        if tail == 0 and 0 < whole < kernels.RECORD_WORDS:
            values = data[start : start + longest * rows_count]
            return kernels.add_records(values.view(_record(whole)), constants, plus, rows)
        stride = max(longest, 1)  # a row's stride; empty values have no bytes to stride over
        words = np.ndarray((rows_count, whole), "<u8", data, start, (stride, 8))
        tails = np.ndarray((rows_count, tail), np.uint8, data, start + whole * 8, (stride, 1))
        return kernels.add_matrix(words, tails, constants, plus, rows)
    words = data[: len(data) // 8 * 8].view("<u8")  # a value's word is cut from two of these
    constants = _constants(index, max((longest + 7) // 8, 1))
    return kernels.add_ragged(data, words, offsets, constants, length_constant, rows)


@functools.cache
def _record(count: int) -> np.dtype:
    """A value of ``count`` words, as :func:`._hash_kernels.add_records` takes it."""
    return np.dtype([("w", "<u8", (count,))])


def _numpy(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    return column.to_numpy(zero_copy_only=False)
