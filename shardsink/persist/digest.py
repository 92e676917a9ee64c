"""Content digests: what a batch holds, told without the rows.

A :class:`Digest` of a table of updates is its row count, the sum of its
diffs and ``hash = Σ diff · h(key, val) mod 2^64``, where ``h`` hashes one
row's key and value (``ts`` is left out). The hash part is linear in the
diffs, so it does not change when updates of one ``(key, val)`` are summed
(consolidation, compaction) or their times move (``since``), and the digest
of a union is the sum of the parts' digests in any order: the digests the
workers report for an interval add up to the one of the interval's batches,
and the batches of a shard add up to the one of its consolidated content.

``h`` hashes values as :mod:`.values` defines them: two values it calls
equal (a ``-0.0`` and a ``0.0``, two NaNs) hash alike, and two it tells
apart (a null struct and a struct of nulls, ``[1, 2]`` and ``[2, 1]``)
almost surely do not. Column ``c`` (``key`` is 1, ``val`` 2) adds its
share to the row's sum, and the splitmix64 finalizer mixes the sum into
``h``:

- a value of one word (an integer, a temporal value, a boolean as 0 or 1,
  a float's canonical bits): ``K_c · w``;
- a string or binary value, a decimal, a fixed-size binary: ``Σ_j K_cj ·
  w_j + length · L_c`` over its little-endian 8-byte words (the last
  zero-padded);
- any other value (a struct, a list, a map, ...): the same over the bytes
  of its canonical encoding (:func:`.values.encode`);
- a null: ``NULL · K_c``.

The constants ``K`` are odd (a change of any one word changes the sum) and
the finalizer a bijection, so a changed value changes ``h``. One finalizer
per row, not per word, keeps the digest a small share of a worker's CPU
(``bench cluster``'s ``digest`` section measures it).

Every step is a numpy pass over whole arrays: no compiler, nothing to load
or warm. The numba loops this replaced were faster a row, and cost every
process that hashed 0.3 s or more to load them (a new machine 2.4 s to
compile them, during which a cluster's first interval timed out). Side by
side, by hand (``process_time``, best of 5, the numba module of 1873c55
beside this one in one process, an idle machine): a 4-row trickle table
41 us against numba's 20; 50,000 rows 13.0 ns a row against 2.8; 1M rows
16.3 against 2.1; 50,000 ragged strings of 0-60 bytes 77.9 against 14.3;
and a fresh interpreter's import and first digest 0.33-0.39 s against
0.59-0.82 s (docs/workloads.md, "What a digest costs").

Schemes: a digest records the hash it was made with. Scheme 1 is this hash
on tables whose ``key`` and ``val`` are plain and not floats (for those,
scheme 1 and this module agree bit for bit: the digests of shards written
before are still checked); scheme 2 is this hash on any other table
(:func:`scheme`). A digest of another scheme than its shard's is not
compared (:func:`comparable`).
"""

from __future__ import annotations

import functools
import os

import msgspec
import numpy as np
import pyarrow as pa

from . import values as V

#: Set to 1, no digest is computed (:func:`written` is ``None``): only
#: ``bench cluster``'s digest-cost section sets it, to measure their cost.
NO_DIGEST_ENV = "SHARDSINK_NO_DIGEST"
_MASK = (1 << 64) - 1
_STEP = 0xA0761D6478BD642F
_NULL = 0x9E3779B97F4A7C15
_LENGTH = 0xD6E8FEB86659FD93
_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_2 = np.uint64(0x94D049BB133111EB)
#: The hash of tables of plain, non-float keys and values (see the module doc).
PLAIN_SCHEME = 1
#: The hash of every other table.
SCHEME = 2


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


def scheme(schema: pa.Schema) -> int:
    """The scheme this module hashes tables of ``schema`` with (see the
    module doc)."""
    return SCHEME if V.encoded(schema) else PLAIN_SCHEME


def comparable(stored: Digest, schema: pa.Schema) -> bool:
    """Whether ``stored`` can be checked against a digest computed now of a
    table of ``schema``: empty, or of its :func:`scheme`."""
    return stored.empty() or stored.scheme == scheme(schema)


def digest(table: pa.Table | pa.RecordBatch) -> Digest:
    """The digest of ``table`` (columns ``key``, ``val``, ``diff``; ``ts`` and
    others ignored). ``ValueError`` naming a field whose type has no
    equality (:func:`.values.check`)."""
    n = table.num_rows
    if n == 0:
        return Digest()
    diffs = _plain(table.column("diff")).to_numpy(zero_copy_only=False).astype(np.int64)
    # array operations wrap mod 2^64 without a warning (numpy warns for scalars only)
    total_hash = int(np.sum(row_hashes(table) * diffs.view(np.uint64)))
    return Digest(n, int(diffs.sum()), total_hash & _MASK, scheme(table.schema))


def written(table: pa.Table | pa.RecordBatch) -> Digest | None:
    """:func:`digest` of ``table`` as a writer records it; ``None`` when
    :data:`NO_DIGEST_ENV` turns digests off."""
    return None if os.environ.get(NO_DIGEST_ENV) == "1" else digest(table)


def row_hashes(
    table: pa.Table | pa.RecordBatch, columns: tuple[str, ...] = ("key", "val")
) -> np.ndarray:
    """``h(key, val)`` of every row of ``table`` (or the hash of other
    ``columns``), as ``uint64``, :data:`BLOCK_ROWS` at a time."""
    n = table.num_rows
    if n <= BLOCK_ROWS:
        return _hashes(table, columns)
    return np.concatenate(
        [_hashes(table.slice(start, BLOCK_ROWS), columns) for start in range(0, n, BLOCK_ROWS)]
    )


#: Rows hashed at a time: each step is a pass over arrays of this many
#: words, which stay in the CPU's caches (a 1M-row trickle table: 28 ms
#: in blocks of 16Ki-64Ki rows against 47 whole; 4Ki: 48; by hand,
#: ``process_time``).
BLOCK_ROWS = 1 << 15


def mix(z: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer of each of ``z``, as a new ``uint64`` array."""
    z = np.array(z, dtype=np.uint64)
    z ^= z >> _30
    z *= _MIX_1
    z ^= z >> _27
    z *= _MIX_2
    z ^= z >> _31
    return z


_30, _27, _31 = np.uint64(30), np.uint64(27), np.uint64(31)


def _hashes(table: pa.Table | pa.RecordBatch, columns: tuple[str, ...]) -> np.ndarray:
    sums = None
    for index, name in enumerate(columns, 1):
        share = _share(_plain(table.column(name)), index)
        sums = share if sums is None else np.add(sums, share, out=share)
    return mix(sums)


def _share(array: pa.Array, index: int) -> np.ndarray:
    """Column ``index``'s share of each row's sum (see the module doc)."""
    kind = array.type
    if pa.types.is_string_view(kind) or pa.types.is_binary_view(kind):
        array, kind = array.cast(pa.large_binary()), pa.large_binary()
    if pa.types.is_floating(kind):
        share = V.float_bits(array) * _constants(index, 1)[0]
    elif not V.plain(kind) and not pa.types.is_large_binary(kind):
        offsets, data = V.var_parts(V.encode(array))  # a null is a value of its own in it
        return _bytes(data, offsets, index)
    elif pa.types.is_decimal(kind) or pa.types.is_fixed_size_binary(kind):
        width = kind.byte_width
        data = np.frombuffer(array.buffers()[1], dtype=np.uint8)
        share = _equal_lengths(data, array.offset * width, len(array), width, index)
    elif _word(kind):
        share = _words(array) * _constants(index, 1)[0]
    else:
        offsets, data = V.var_parts(array)
        share = _bytes(data, offsets, index)
    if array.null_count:
        null = np.uint64((_NULL * int(_constants(index, 1)[0])) & _MASK)
        share = np.where(array.is_valid().to_numpy(zero_copy_only=False), share, null)
    return share


def _word(kind: pa.DataType) -> bool:
    """Whether a value of ``kind`` is one word: at most 64 bits, not a decimal."""
    try:
        return kind.bit_width <= 64 and not pa.types.is_decimal(kind)
    except ValueError:
        return False


def _words(array: pa.Array) -> np.ndarray:
    """The unsigned words of a one-word ``array`` (a boolean's 0 or 1; a
    null's word is whatever its slot holds)."""
    start, end = array.offset, array.offset + len(array)
    bits = np.frombuffer(array.buffers()[1], dtype=np.uint8)
    if pa.types.is_boolean(array.type):
        return np.unpackbits(bits, bitorder="little")[start:end].astype(np.uint64)
    return bits.view(f"<u{array.type.bit_width // 8}")[start:end].astype(np.uint64)


@functools.lru_cache(maxsize=256)
def _constants(index: int, count: int) -> np.ndarray:
    """``count`` odd 64-bit constants of column ``index`` (one per word
    place): odd, so a change of any one word changes the row's sum. Cached:
    a digest of a few rows must not pay for making them again."""
    start = (index * _STEP) & _MASK
    places = (
        (np.arange(count, dtype=np.uint64) + np.uint64(start)) if count else np.empty(0, np.uint64)
    )
    constants = mix(places) | np.uint64(1)
    constants.flags.writeable = False
    return constants


@functools.lru_cache(maxsize=256)
def _length_constant(index: int) -> np.uint64:
    """What column ``index`` multiplies a value's length by."""
    return np.uint64((int(_constants(index, 1)[0]) * _LENGTH) & _MASK)


#: A word's bytes kept when ``r`` of them are the value's (``r`` in 0..8).
_TAIL_MASKS = np.array([(1 << (8 * r)) - 1 for r in range(9)], dtype=np.uint64)


def _bytes(data: np.ndarray, offsets: np.ndarray, index: int) -> np.ndarray:
    """Each value's share ``Σ_j K_j · w_j + length · L`` of the values
    ``data[offsets[r]:offsets[r + 1]]`` (see the module doc)."""
    n = len(offsets) - 1
    lengths = offsets[1:] - offsets[:-1]
    if n == 0:
        return np.zeros(0, dtype=np.uint64)
    shortest, longest = int(lengths.min()), int(lengths.max())
    if shortest == longest:  # values of one length (uuids, hashes, padded codes)
        return _equal_lengths(data, int(offsets[0]), n, longest, index)
    counts = (lengths + 7) // 8
    padded = np.concatenate([data[: int(offsets[-1])], np.zeros(8, dtype=np.uint8)])
    # every word of every value: a view with a word at each byte, read where the words start
    at_each_byte = np.ndarray((len(padded) - 7,), "<u8", padded, 0, (1,))
    firsts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=firsts[1:])
    place = np.arange(int(firsts[-1]), dtype=np.int64) - np.repeat(firsts[:-1], counts)
    words = at_each_byte[np.repeat(offsets[:-1], counts) + 8 * place]
    # the last word of a value keeps only its own bytes
    last = firsts[1:][counts > 0] - 1
    words[last] &= _TAIL_MASKS[(lengths - 8 * (counts - 1))[counts > 0]]
    sums = np.zeros(len(words) + 1, dtype=np.uint64)
    np.cumsum(words * _constants(index, longest // 8 + 1)[place], out=sums[1:])
    return (
        sums[firsts[1:]] - sums[firsts[:-1]] + lengths.astype(np.uint64) * _length_constant(index)
    )


def _equal_lengths(data: np.ndarray, start: int, n: int, length: int, index: int) -> np.ndarray:
    """:func:`_bytes` of ``n`` values of ``length`` bytes each, one after
    another from ``data[start]``: a view of their words, no copy, summed a
    word place at a time (numpy's sum across a row's few words cost 35 ns a
    32-byte value against 6, by hand, ``process_time``)."""
    whole, tail = divmod(length, 8)
    constants = _constants(index, whole + (tail > 0))
    plus = np.uint64((length * int(_length_constant(index))) & _MASK)
    sums = np.full(n, plus, dtype=np.uint64)
    if whole:
        words = np.ndarray((n, whole), "<u8", data, start, (max(length, 1), 8))
        for place in range(whole):
            sums += words[:, place] * constants[place]
    if tail:
        tails = np.zeros((n, 8), dtype=np.uint8)
        tails[:, :tail] = np.ndarray((n, tail), np.uint8, data, start + whole * 8, (length, 1))
        sums += tails.view("<u8").reshape(n) * constants[whole]
    return sums


def _plain(array: pa.Array | pa.ChunkedArray) -> pa.Array:
    """``array`` as one chunk, not dictionary-encoded."""
    if isinstance(array, pa.ChunkedArray):
        if array.num_chunks == 0:
            array = pa.array([], array.type)
        else:
            array = array.combine_chunks() if array.num_chunks != 1 else array.chunk(0)
    return array.dictionary_decode() if pa.types.is_dictionary(array.type) else array
