"""Equality and order of Arrow values, for every type.

Consolidation sums the diffs of updates whose ``(key, val, ts)`` are equal,
every part holds its rows in update order (by key, then val, then ts), and a
digest hashes what a value is. All three rest on what this module defines,
on Arrow *values* of any type:

- **equal**: two values are one value when they hold the same data. Nulls
  equal each other; a null struct (or list, or anything) is not a struct
  whose fields are all null; ``-0.0`` equals ``0.0`` and every NaN equals
  every other NaN (as Arrow's sort and Polars' grouping treat them); a
  dictionary-encoded value is its decoded value; a map is the list of its
  entries in order; a union value is its type code and its child's value.
- **ordered**: numbers by value (NaN after infinity), strings and binary by
  their bytes, temporal types by their instants, structs by their fields in
  order, lists element by element (a prefix first), union values by type
  code then value; a null after every value of its type, at every level. For
  the types Arrow sorts, this is Arrow's own order (``null_placement =
  "at_end"``), so a Parquet part's ``sorting_columns`` stay true.

How: :func:`order_columns` gives the columns that rule compares for a
table, each of which Arrow groups, sorts and compares natively with exactly
these rules: a column of a :func:`plain` type (integers, booleans, strings,
binary, temporal types, decimals, whose Arrow equality and order are these)
as it is, and any other (floats, structs, lists, maps, unions, ...) as its
**canonical encoding** (:func:`encode`): one byte string per value, equal
exactly when the values are equal and ordered as they are ("memcomparable",
as arrow-rs's row format and the keys of ordered key-value stores). Arrow's
grouping, sorting and comparisons of binary columns then do the rest.

The encoding, value by value (every value's encoding is self-delimiting, so
a struct's is its fields' one after another):

- a null, of any type at any level: ``0x03`` (fixed-width types pad it with
  zeros to their width);
- an integer, a temporal value: ``0x01`` and its 64-bit big-endian value,
  the sign bit flipped for signed types; a boolean ``0x01`` and one byte;
- a float (any width, as a 64-bit float): ``0x01`` and its bits, ``-0.0``
  and NaN made canonical, flipped so that unsigned comparison orders them
  (negatives inverted, positives with the sign bit set);
- a decimal: ``0x01`` and its two's complement big-endian, sign bit
  flipped; a fixed-size binary ``0x01`` and its bytes;
- a string or binary: ``0x01`` when empty, else ``0x02`` and its bytes in
  blocks of :data:`BLOCK`, each block zero-padded and followed by ``0xFF``
  when another follows, else by the count of its bytes used;
- a struct: ``0x01`` and its fields' encodings in order;
- a list (large, fixed-size, a map's entries): ``0x02`` and the element's
  encoding for each element, then ``0x01``;
- a union value: ``0x01``, its type code, its child's encoding.

Everything is computed in vectorized passes (numpy over the arrays'
buffers), a few passes per nesting level: no Python per row.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: Bytes of a string's block in :func:`encode`: 16 costs a short value
#: (a name, a code) less padding than arrow-rs's 32, a long one 6 % more.
BLOCK = 16
_VALID, _MORE, _NULL = 1, 2, 3
_EMPTY, _NONEMPTY = 1, 2
_ELEMENT, _END = 2, 1
_SIGN = np.uint64(1 << 63)


def plain(kind: pa.DataType) -> bool:
    """Whether Arrow's own equality, order and grouping of ``kind`` are this
    module's (see the module doc): integers, booleans, strings and binary
    (not views), fixed-size binary, dates, times, timestamps, durations,
    decimals. Any other type is compared by its :func:`encode`."""
    t = pa.types
    return (
        t.is_integer(kind)
        or t.is_boolean(kind)
        or t.is_string(kind)
        or t.is_large_string(kind)
        or t.is_binary(kind)
        or t.is_large_binary(kind)
        or t.is_fixed_size_binary(kind)
        or t.is_date(kind)
        or t.is_time(kind)
        or t.is_timestamp(kind)
        or t.is_duration(kind)
        or t.is_decimal(kind)
    )


def comparable(column: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """``column`` as Arrow compares it under this module's rules: itself
    for a :func:`plain` type, else its :func:`encode`."""
    return column if plain(column.type) else encode(column)


def order_columns(table: pa.Table) -> list[pa.Array | pa.ChunkedArray]:
    """The columns update order compares, in order: ``key``, ``val`` (each
    :func:`comparable`) and ``ts``."""
    return [comparable(table[name]) for name in ("key", "val")] + [table["ts"]]


def check(schema: pa.Schema) -> None:
    """``ValueError`` naming the first field of ``key`` or ``val`` (a nested
    one by its path, ``val.tags.item``) whose type this module cannot compare
    (none of Arrow's types today: an extension type is compared by its
    storage)."""
    for name in ("key", "val"):
        _check_type(name, schema.field(name).type)


def _check_type(path: str, kind: pa.DataType) -> None:
    kind = _storage_type(kind)
    if plain(kind) or pa.types.is_floating(kind) or pa.types.is_null(kind):
        return
    if pa.types.is_string_view(kind) or pa.types.is_binary_view(kind):
        return
    if pa.types.is_interval(kind):
        return
    if pa.types.is_struct(kind):
        for i in range(kind.num_fields):
            _check_type(f"{path}.{kind.field(i).name}", kind.field(i).type)
        return
    if pa.types.is_dictionary(kind):
        _check_type(path, kind.value_type)
        return
    if pa.types.is_union(kind):
        for i in range(kind.num_fields):
            _check_type(f"{path}.{kind.field(i).name}", kind.field(i).type)
        return
    if _listlike(kind):
        _check_type(f"{path}.{kind.value_field.name}", kind.value_type)
        return
    if pa.types.is_run_end_encoded(kind):
        _check_type(path, kind.value_type)
        return
    raise ValueError(
        f"field {path} of type {kind} has no equality shardsink can compute: shardsink "
        "consolidates updates by (key, val, ts)"
    )


def _storage_type(kind: pa.DataType) -> pa.DataType:
    return kind.storage_type if isinstance(kind, pa.ExtensionType) else kind


def _listlike(kind: pa.DataType) -> bool:
    t = pa.types
    return (
        t.is_list(kind)
        or t.is_large_list(kind)
        or t.is_fixed_size_list(kind)
        or t.is_map(kind)
        or t.is_list_view(kind)
        or t.is_large_list_view(kind)
    )


def encode(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The canonical encoding (see the module doc) of every value of
    ``column``, as one ``large_binary`` array. ``ValueError`` naming a type
    it cannot encode (see :func:`check`)."""
    array = _one_chunk(column)
    rows = _encode(array)
    offsets, data = rows.ragged()
    return pa.Array.from_buffers(
        pa.large_binary(), len(array), [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )


def _one_chunk(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(column, pa.ChunkedArray):
        if column.num_chunks == 1:
            return column.chunk(0)
        return column.combine_chunks() if column.num_chunks else pa.array([], column.type)
    return column


class _Rows:
    """One byte string per row: ``fixed`` (an ``(n, width)`` ``uint8``
    matrix, every row one width: cheap to join) or ragged (``starts``,
    ``lengths`` into ``data``)."""

    __slots__ = ("data", "fixed", "lengths", "starts")

    def __init__(self, fixed=None, starts=None, lengths=None, data=None) -> None:
        self.fixed, self.starts, self.lengths, self.data = fixed, starts, lengths, data

    def __len__(self) -> int:
        return len(self.fixed) if self.fixed is not None else len(self.lengths)

    def ragged(self) -> tuple[np.ndarray, np.ndarray]:
        """``(offsets, data)`` with row ``r`` at ``data[offsets[r]:offsets[r + 1]]``."""
        if self.fixed is not None:
            n, width = self.fixed.shape
            return np.arange(n + 1, dtype=np.int64) * width, self.fixed.reshape(-1)
        offsets = _offsets(self.lengths)
        if len(self.starts) and np.array_equal(self.starts, offsets[:-1]):
            return offsets, self.data[: offsets[-1]]
        return offsets, self.data[_ranges(self.starts, self.lengths)]

    def parts(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(starts, lengths, data)``."""
        if self.fixed is not None:
            n, width = self.fixed.shape
            return (
                np.arange(n, dtype=np.int64) * width,
                np.full(n, width, dtype=np.int64),
                self.fixed.reshape(-1),
            )
        return self.starts, self.lengths, self.data


def _offsets(lengths: np.ndarray) -> np.ndarray:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The indices ``starts[r] .. starts[r] + lengths[r] - 1`` of every row,
    one after another."""
    total = int(lengths.sum())
    if total == 0:
        return np.empty(0, dtype=np.int64)
    shift = starts - (_offsets(lengths)[:-1])
    return np.repeat(shift, lengths) + np.arange(total, dtype=np.int64)


def _join(pieces: list[_Rows]) -> _Rows:
    """Each row's bytes of every piece, one after another."""
    if all(p.fixed is not None for p in pieces):
        return _Rows(fixed=np.hstack([p.fixed for p in pieces]))
    parts = [p.parts() for p in pieces]
    lengths = sum(length for _, length, _ in parts)
    offsets = _offsets(lengths)
    out = np.empty(int(offsets[-1]), dtype=np.uint8)
    at = offsets[:-1].copy()
    for starts, length, data in parts:
        source = _ranges(starts, length)
        out[np.repeat(at - _offsets(length)[:-1], length) + np.arange(len(source))] = data[source]
        at += length
    return _Rows(starts=offsets[:-1], lengths=lengths, data=out)


def _constant(n: int, byte: int) -> _Rows:
    return _Rows(fixed=np.full((n, 1), byte, dtype=np.uint8))


def _with_nulls(rows: _Rows, valid: np.ndarray | None) -> _Rows:
    """``rows`` with every row not ``valid`` made a null's: ``0x03``, padded
    with zeros to a fixed width."""
    if valid is None:
        return rows
    if rows.fixed is not None:
        fixed = rows.fixed.copy()
        fixed[~valid] = 0
        fixed[~valid, 0] = _NULL
        return _Rows(fixed=fixed)
    null = _constant(len(valid), _NULL).parts()
    starts, lengths, data = rows.parts()
    shift = len(data)
    return _Rows(
        starts=np.where(valid, starts, null[0] + shift),
        lengths=np.where(valid, lengths, 1),
        data=np.concatenate([data, null[2]]),
    )


def _validity(array: pa.Array) -> np.ndarray | None:
    """Which values of ``array`` are not null; ``None`` when all are."""
    if array.null_count == 0:
        return None
    return array.is_valid().to_numpy(zero_copy_only=False)


def _encode(array: pa.Array) -> _Rows:
    kind = array.type
    if isinstance(kind, pa.ExtensionType):
        return _encode(array.storage)
    if pa.types.is_dictionary(kind):
        return _encode(array.dictionary_decode())
    if pa.types.is_run_end_encoded(kind):
        return _encode(pc.run_end_decode(array))
    if pa.types.is_string_view(kind) or pa.types.is_binary_view(kind):
        return _encode(array.cast(pa.large_binary()))
    if pa.types.is_list_view(kind) or pa.types.is_large_list_view(kind):
        return _encode(array.cast(pa.large_list(kind.value_field)))
    if pa.types.is_null(kind):
        return _constant(len(array), _NULL)
    for test, encoder in _ENCODERS:
        if test(kind):
            return encoder(array)
    _check_type("value", kind)  # raises, naming the type
    raise AssertionError(kind)


def _words(array: pa.Array, dtype: str) -> np.ndarray:
    """The values of a fixed-width ``array`` as ``dtype``, nulls as zero."""
    if array.null_count:
        fill = False if pa.types.is_boolean(array.type) else pa.scalar(0, array.type)
        array = pc.fill_null(array, fill)
    return np.asarray(array.to_numpy(zero_copy_only=False)).astype(dtype, copy=False)


def _big_endian(values: np.ndarray, valid: np.ndarray | None) -> _Rows:
    """``0x01`` and each ``uint64`` value big-endian (a null as :func:`_with_nulls`)."""
    n = len(values)
    fixed = np.empty((n, 9), dtype=np.uint8)
    fixed[:, 0] = _VALID
    fixed[:, 1:] = values.astype(">u8").view(np.uint8).reshape(n, 8)
    return _with_nulls(_Rows(fixed=fixed), valid)


def _integers(array: pa.Array) -> _Rows:
    kind = array.type
    if pa.types.is_temporal(kind):
        array = array.view(pa.int64() if kind.bit_width == 64 else pa.int32())
        kind = array.type
    if pa.types.is_signed_integer(kind):
        values = _words(array, "int64").view(np.uint64) ^ _SIGN
    else:
        values = _words(array, "uint64")
    return _big_endian(values, _validity(array))


def float_bits(array: pa.Array) -> np.ndarray:
    """The bits of each value of a floating-point ``array`` as a 64-bit
    float, canonical: ``-0.0`` as ``0.0``, every NaN as numpy's ``nan``,
    a null as ``0.0``."""
    values = _words(array, "float64")
    values = np.where(values == 0, 0.0, values)
    values = np.where(np.isnan(values), np.nan, values)
    return values.view(np.uint64)


def _floats(array: pa.Array) -> _Rows:
    bits = float_bits(array)
    negative = (bits & _SIGN) != 0
    ordered = np.where(negative, ~bits, bits | _SIGN)
    return _big_endian(ordered, _validity(array))


def _booleans(array: pa.Array) -> _Rows:
    n = len(array)
    fixed = np.empty((n, 2), dtype=np.uint8)
    fixed[:, 0] = _VALID
    fixed[:, 1] = _words(array, "uint8")
    return _with_nulls(_Rows(fixed=fixed), _validity(array))


def _fixed_bytes(array: pa.Array, width: int | None = None) -> np.ndarray:
    """The ``(n, width)`` bytes of a fixed-width ``array``'s values."""
    width = width or array.type.byte_width
    data = np.frombuffer(array.buffers()[1], dtype=np.uint8)
    start = array.offset * width
    return data[start : start + len(array) * width].reshape(len(array), width)


def _decimals(array: pa.Array) -> _Rows:
    values = _fixed_bytes(array)[:, ::-1]  # little-endian two's complement, reversed
    n, width = values.shape
    fixed = np.empty((n, width + 1), dtype=np.uint8)
    fixed[:, 0] = _VALID
    fixed[:, 1:] = values
    fixed[:, 1] ^= 0x80
    return _with_nulls(_Rows(fixed=fixed), _validity(array))


def _fixed_binary(array: pa.Array) -> _Rows:
    values = _fixed_bytes(array)
    fixed = np.empty((len(array), values.shape[1] + 1), dtype=np.uint8)
    fixed[:, 0] = _VALID
    fixed[:, 1:] = values
    return _with_nulls(_Rows(fixed=fixed), _validity(array))


def _intervals(array: pa.Array) -> _Rows:
    """A month-day-nano interval as its three integers; the others as integers."""
    if not pa.types.is_interval(array.type) or array.type.bit_width != 128:
        return _integers(array.view(pa.int32() if array.type.bit_width == 32 else pa.int64()))
    raw = _fixed_bytes(array, 16)
    months = raw[:, 0:4].copy().view("<i4").reshape(-1).astype(np.int64)
    days = raw[:, 4:8].copy().view("<i4").reshape(-1).astype(np.int64)
    nanos = raw[:, 8:16].copy().view("<i8").reshape(-1)
    valid = _validity(array)
    pieces = [_big_endian(v.view(np.uint64) ^ _SIGN, None) for v in (months, days, nanos)]
    return _with_nulls(_join([_constant(len(array), _VALID), *pieces]), valid)


def var_parts(array: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """``(offsets, data)`` of a string or binary ``array`` (``int64``
    offsets into ``data``, ``len(array) + 1`` of them; a null's value is
    whatever its offsets span, usually nothing)."""
    large = pa.types.is_large_string(array.type) or pa.types.is_large_binary(array.type)
    offsets = np.frombuffer(array.buffers()[1], dtype=np.int64 if large else np.int32)
    offsets = offsets[array.offset : array.offset + len(array) + 1].astype(np.int64, copy=False)
    data = np.frombuffer(array.buffers()[2] or b"", dtype=np.uint8)
    return offsets, data


def _strings(array: pa.Array) -> _Rows:
    offsets, data = var_parts(array)
    valid = _validity(array)
    lengths = offsets[1:] - offsets[:-1]
    if valid is not None:
        lengths = np.where(valid, lengths, 0)
    blocks = (lengths + BLOCK - 1) // BLOCK
    out_lengths = 1 + blocks * (BLOCK + 1)
    out_offsets = _offsets(out_lengths)
    out = np.zeros(int(out_offsets[-1]), dtype=np.uint8)
    heads = np.where(lengths > 0, _NONEMPTY, _EMPTY).astype(np.uint8)
    if valid is not None:
        heads[~valid] = _NULL
    out[out_offsets[:-1]] = heads
    # byte p of a value goes to 1 + (p // BLOCK) * (BLOCK + 1) + p % BLOCK
    source = _ranges(offsets[:-1], lengths)
    within = np.arange(len(source), dtype=np.int64) - np.repeat(_offsets(lengths)[:-1], lengths)
    start = np.repeat(out_offsets[:-1], lengths)
    out[start + 1 + within // BLOCK * (BLOCK + 1) + within % BLOCK] = data[source]
    # each block's last byte: 0xFF when another follows, else the bytes it uses
    block_index = np.arange(int(blocks.sum()), dtype=np.int64) - np.repeat(
        _offsets(blocks)[:-1], blocks
    )
    owner_blocks = np.repeat(blocks, blocks)
    owner_lengths = np.repeat(lengths, blocks)
    marks = np.where(
        block_index < owner_blocks - 1, 0xFF, owner_lengths - (owner_blocks - 1) * BLOCK
    ).astype(np.uint8)
    out[np.repeat(out_offsets[:-1], blocks) + 1 + block_index * (BLOCK + 1) + BLOCK] = marks
    return _Rows(starts=out_offsets[:-1], lengths=out_lengths, data=out)


def _structs(array: pa.Array) -> _Rows:
    n = len(array)
    fields = [_encode(array.field(i)) for i in range(array.type.num_fields)]
    return _with_nulls(_join([_constant(n, _VALID), *fields]), _validity(array))


def _lists(array: pa.Array) -> _Rows:
    n = len(array)
    if pa.types.is_fixed_size_list(array.type):
        size = array.type.list_size
        offsets = np.arange(array.offset, array.offset + n + 1, dtype=np.int64) * size
    else:
        offsets = np.asarray(array.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
    first, last = int(offsets[0]), int(offsets[-1])
    values = array.values.slice(first, last - first)
    elements = _join([_constant(len(values), _ELEMENT), _encode(values)])
    e_starts, e_lengths, e_data = elements.parts()
    # the elements of one list are one run of the elements' bytes
    e_offsets = _offsets(e_lengths)
    if len(e_starts) and not np.array_equal(e_starts, e_offsets[:-1]):
        e_data = e_data[_ranges(e_starts, e_lengths)]
    local = offsets - first
    body = _Rows(
        starts=e_offsets[local[:-1]],
        lengths=e_offsets[local[1:]] - e_offsets[local[:-1]],
        data=e_data,
    )
    return _with_nulls(_join([body, _constant(n, _END)]), _validity(array))


def _unions(array: pa.Array) -> _Rows:
    n = len(array)
    kind = array.type
    codes = np.frombuffer(array.buffers()[1], dtype=np.int8)[array.offset : array.offset + n]
    dense = kind.mode == "dense"
    if dense:
        positions = np.frombuffer(array.buffers()[2], dtype=np.int32)[
            array.offset : array.offset + n
        ].astype(np.int64)
    else:
        positions = np.arange(array.offset, array.offset + n, dtype=np.int64)
    starts = np.zeros(n, dtype=np.int64)
    lengths = np.zeros(n, dtype=np.int64)
    chunks, base = [], 0
    for index, code in enumerate(kind.type_codes):
        rows = np.flatnonzero(codes == code)
        if not len(rows):
            continue
        child = array.field(index).take(pa.array(positions[rows]))
        c_starts, c_lengths, c_data = _encode(child).parts()
        starts[rows], lengths[rows] = c_starts + base, c_lengths
        chunks.append(c_data)
        base += len(c_data)
    values = _Rows(
        starts=starts,
        lengths=lengths,
        data=np.concatenate(chunks) if chunks else np.empty(0, np.uint8),
    )
    tags = _Rows(fixed=np.stack([np.full(n, _VALID, np.uint8), codes.view(np.uint8)], axis=1))
    return _join([tags, values])


def _integral(kind: pa.DataType) -> bool:
    """Integers and the temporal types stored as one (not intervals)."""
    return pa.types.is_integer(kind) or (
        pa.types.is_temporal(kind) and not pa.types.is_interval(kind)
    )


def _var(kind: pa.DataType) -> bool:
    t = pa.types
    return (
        t.is_string(kind) or t.is_large_string(kind) or t.is_binary(kind) or t.is_large_binary(kind)
    )


_ENCODERS = (
    (_integral, _integers),
    (pa.types.is_interval, _intervals),
    (pa.types.is_floating, _floats),
    (pa.types.is_boolean, _booleans),
    (pa.types.is_decimal, _decimals),
    (pa.types.is_fixed_size_binary, _fixed_binary),
    (_var, _strings),
    (pa.types.is_struct, _structs),
    (_listlike, _lists),
    (pa.types.is_union, _unions),
)


def encoded(schema: pa.Schema) -> bool:
    """Whether ``key`` or ``val`` of ``schema`` (its first two fields) is of
    a type that is not :func:`plain` (compared by its encoding). Not
    cached: hashing a schema for a cache costs more (4.7 us against 1)."""
    return not (plain(schema.field(0).type) and plain(schema.field(1).type))
