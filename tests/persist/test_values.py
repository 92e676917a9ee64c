"""What makes two values one and how they order, for every type: the
canonical encoding against a model of plain Python values."""

from __future__ import annotations

import math

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from shardsink.persist import values as V
from tests.helpers.values import canon, types, values


@st.composite
def columns(draw):
    kind = draw(types)
    items = draw(st.lists(values(kind), min_size=1, max_size=12))
    return kind, items


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(columns(), st.integers(0, 3))
def test_the_encoding_tells_values_apart_and_orders_them_as_the_model(column, offset):
    """Two encodings are equal exactly when the model's values are, and
    order as they do, whatever the type's nesting, and for a slice of the
    array (offsets into its buffers) as for the array itself."""
    kind, items = column
    padded = [items[0]] * offset + items
    encoded = V.encode(pa.array(padded, kind).slice(offset)).to_pylist()
    model = [canon(v, kind) for v in items]
    for i in range(len(items)):
        for j in range(len(items)):
            assert (encoded[i] == encoded[j]) == (model[i] == model[j]), (items[i], items[j])
            assert (encoded[i] < encoded[j]) == (model[i] < model[j]), (items[i], items[j])


def test_a_null_struct_and_a_struct_of_nulls_are_two_values():
    kind = pa.struct([("a", pa.int64()), ("b", pa.string())])
    encoded = V.encode(pa.array([{"a": None, "b": None}, None, {"a": None, "b": None}], kind))
    a, null, b = encoded.to_pylist()
    assert a == b and a != null and a < null


def test_floats_compare_as_arrow_sorts_them():
    encoded = V.encode(pa.array([-math.inf, -1.0, -0.0, 0.0, 1.0, math.inf, math.nan, None]))
    got = encoded.to_pylist()
    assert got[2] == got[3]
    assert got == sorted(got)
    assert len(set(got)) == 7


@pytest.mark.parametrize(
    ("kind", "items"),
    [
        (pa.dictionary(pa.int8(), pa.string()), ["b", None, "a", "b"]),
        (pa.string_view(), ["b", None, "a", "b"]),
        (pa.month_day_nano_interval(), [pa.MonthDayNano([1, 2, 3]), None,
                                        pa.MonthDayNano([1, 2, 3]), pa.MonthDayNano([0, 9, 9])]),
    ],
)  # fmt: skip
def test_other_types_compare_by_value(kind, items):
    got = V.encode(pa.array(items, kind)).to_pylist()
    assert got[0] == got[3] if items[0] == items[3] else got[0] != got[3]
    assert got[1] != got[0] and got[1] > got[2]


def test_a_union_is_its_type_code_and_its_childs_value():
    union = pa.UnionArray.from_sparse(
        pa.array([0, 1, 0, 1], pa.int8()),
        [pa.array([1, 2, 1, 4]), pa.array(["a", "b", "c", "b"])],
    )
    got = V.encode(union).to_pylist()
    assert got[0] == got[2] and got[1] == got[3] and got[0] < got[1]
    dense = pa.UnionArray.from_dense(
        pa.array([0, 1, 0], pa.int8()),
        pa.array([0, 0, 1], pa.int32()),
        [pa.array([5, 5]), pa.array(["b"])],
    )
    first, second, third = V.encode(dense).to_pylist()
    assert first == third != second


def test_plain_types_are_compared_by_arrow_and_the_rest_by_their_encoding():
    table = pa.table(
        {
            "key": pa.array([1, 2], pa.int64()),
            "val": pa.array([[1], [2]], pa.list_(pa.int8())),
            "ts": pa.array([0, 0], pa.uint64()),
        }
    )
    key, val, ts = V.order_columns(table)
    assert key.type == pa.int64() and key.equals(table["key"]) and ts.equals(table["ts"])
    assert val.type == pa.large_binary()
    assert V.encoded(table.schema) and not V.encoded(
        pa.schema([("k", pa.int8()), ("v", pa.utf8())])
    )
