"""Hypothesis strategies for Arrow types of any nesting and their values,
and the plain-Python model of what makes two values one and how they order
(:mod:`shardsink.persist.values` states the rules; this model restates them
value by value)."""

from __future__ import annotations

import datetime
import decimal
import math

import pyarrow as pa
from hypothesis import strategies as st

LEAVES = [
    pa.int8(),
    pa.int64(),
    pa.uint32(),
    pa.float64(),
    pa.float32(),
    pa.bool_(),
    pa.string(),
    pa.binary(),
    pa.large_string(),
    pa.binary(3),
    pa.timestamp("ms"),
    pa.date32(),
    pa.decimal128(9, 2),
]


def _struct(children: list[pa.DataType]) -> pa.DataType:
    return pa.struct([(f"f{i}", kind) for i, kind in enumerate(children)])


types = st.recursive(
    st.sampled_from(LEAVES),
    lambda children: st.one_of(
        st.lists(children, min_size=1, max_size=3).map(_struct),
        children.map(pa.list_),
        children.map(pa.large_list),
        children.map(lambda kind: pa.list_(kind, 2)),
        children.map(lambda kind: pa.map_(pa.string(), kind)),
    ),
    max_leaves=4,
)

_FLOATS = [0.0, -0.0, 1.5, -1.5, math.inf, -math.inf, math.nan]


def values(kind: pa.DataType, nulls: bool = True) -> st.SearchStrategy:
    """Python values of ``kind`` (``None`` among them when ``nulls``), few
    distinct ones, so that equal values meet."""
    plain = _values(kind)
    return st.one_of(st.none(), plain) if nulls else plain


def _values(kind: pa.DataType) -> st.SearchStrategy:
    t = pa.types
    if t.is_integer(kind):
        info = (-(2 ** (kind.bit_width - 1)), 2 ** (kind.bit_width - 1) - 1)
        if t.is_unsigned_integer(kind):
            info = (0, 2**kind.bit_width - 1)
        return st.sampled_from(sorted({info[0], -1 if info[0] < 0 else 0, 0, 1, 7, info[1]}))
    if t.is_floating(kind):
        return st.sampled_from(_FLOATS)
    if t.is_boolean(kind):
        return st.booleans()
    if t.is_string(kind) or t.is_large_string(kind):
        return st.sampled_from(["", "a", "a\x00", "ab", "é", "x" * 17, "x" * 16])
    if t.is_fixed_size_binary(kind):
        return st.sampled_from([b"abc", b"ab\x00", b"\xff\x00\x01"])
    if t.is_binary(kind):
        return st.sampled_from([b"", b"\x00", b"\x00\x00", b"\xff", b"ab" * 9])
    if t.is_timestamp(kind):
        epoch = datetime.datetime(1970, 1, 1)
        return st.sampled_from([epoch + datetime.timedelta(milliseconds=v) for v in (-3, 0, 5)])
    if t.is_date(kind):
        epoch = datetime.date(1970, 1, 1)
        return st.sampled_from([epoch + datetime.timedelta(days=v) for v in (-3, 0, 5)])
    if t.is_decimal(kind):
        return st.sampled_from([decimal.Decimal(v) for v in ("-1.50", "0.00", "2.25", "9999.99")])
    if t.is_struct(kind):
        fields = {kind.field(i).name: values(kind.field(i).type) for i in range(kind.num_fields)}
        return st.fixed_dictionaries(fields)
    if t.is_map(kind):
        entry = st.tuples(st.sampled_from(["k", "j"]), values(kind.item_type))
        return st.lists(entry, max_size=2)
    if t.is_fixed_size_list(kind):
        size = kind.list_size
        return st.lists(values(kind.value_type), min_size=size, max_size=size)
    if t.is_list(kind) or t.is_large_list(kind):
        return st.lists(values(kind.value_type), max_size=3)
    raise AssertionError(kind)


def array(kind: pa.DataType, items: list) -> pa.Array:
    """``items`` (from :func:`values`) as an array of ``kind``."""
    return pa.array(items, kind)


def canon(value, kind: pa.DataType):
    """The model: a Python value that two values of ``kind`` share exactly
    when they are one value, and that sorts as they do (nulls last, NaN
    after every number, ``-0.0`` as ``0.0``, structs by their fields, lists
    element by element)."""
    if value is None:
        return (1,)
    t = pa.types
    if t.is_floating(kind):
        return (0, 1) if math.isnan(value) else (0, 0, value + 0.0)
    if t.is_struct(kind):
        return (0, tuple(canon(value[kind.field(i).name], kind.field(i).type)
                         for i in range(kind.num_fields)))  # fmt: skip
    if t.is_map(kind):
        entry = pa.struct([("key", kind.key_type), ("value", kind.item_type)])
        return (0, tuple(canon({"key": k, "value": v}, entry) for k, v in value))
    if t.is_list(kind) or t.is_large_list(kind) or t.is_fixed_size_list(kind):
        return (0, tuple(canon(v, kind.value_type) for v in value))
    return (0, value)
