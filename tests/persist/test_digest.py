"""Content digests and consolidation of any schema."""

from __future__ import annotations

import decimal
import math

import msgspec
import numpy as np
import pyarrow as pa
import pytest

from shardsink.persist import digest as D, parts as P, values as V
from shardsink.persist.digest import (
    PLAIN_SCHEME,
    SCHEME,
    Digest,
    comparable,
    digest,
    total,
    total_known,
)

STRING = pa.string()
STRUCT = pa.struct([("price", pa.float64()), ("name", pa.string()), ("n", pa.int32())])


def updates(keys, vals, diffs, val_type=STRUCT, key_type=STRING) -> pa.Table:
    return pa.table(
        {
            "key": pa.array(keys, key_type),
            "val": pa.array(vals, val_type),
            "ts": pa.array([0] * len(keys), pa.uint64()),
            "diff": pa.array(diffs, pa.int64()),
        }
    )


def test_digest_is_order_and_slice_independent():
    n = 10_000
    table = updates(
        [f"k{i % 977}" for i in range(n)],
        [{"price": i / 3, "name": "x" * (i % 40), "n": i % 5} for i in range(n)],
        [1 if i % 3 else -1 for i in range(n)],
    )
    whole = digest(table)
    assert whole.rows == n and whole.diffs == sum(1 if i % 3 else -1 for i in range(n))
    shuffled = table.take(np.random.default_rng(0).permutation(n))
    assert digest(shuffled) == whole
    assert total(digest(table.slice(s, 1000)) for s in range(0, n, 1000)) == whole
    assert digest(pa.concat_tables([table.slice(0, 10), table.slice(10)])) == whole


def test_consolidation_keeps_the_digest_and_sorts_structs():
    table = updates(
        ["b", "a", "a", "a", "b"],
        [{"price": 1.0, "name": "q", "n": 1}, {"price": 2.0, "name": "r", "n": 2},
         {"price": 1.0, "name": "z", "n": 3}, {"price": 2.0, "name": "r", "n": 2},
         {"price": 1.0, "name": "q", "n": 1}],
        [1, 1, 1, 1, -1],
    )  # fmt: skip
    out = P.consolidate(table)
    assert out.column("key").to_pylist() == ["a", "a"]
    assert out.column("diff").to_pylist() == [1, 2]
    assert P.in_update_order(out) and not P.in_update_order(table)
    assert digest(out).same_content(digest(table)) and digest(out).rows == 2


def test_one_changed_value_changes_the_digest():
    table = updates(["a", "b"], [{"price": 1.0, "name": "q", "n": 1}] * 2, [1, 1])
    changed = updates(["a", "b"], [{"price": 1.0, "name": "q", "n": 1},
                                   {"price": 1.0, "name": "r", "n": 1}], [1, 1])  # fmt: skip
    assert digest(table) != digest(changed)
    assert digest(table).hash != (digest(table.slice(0, 1)) + digest(table.slice(0, 1))).hash


@pytest.mark.parametrize(
    "kind",
    [pa.int64(), pa.float32(), pa.bool_(), pa.large_string(), pa.binary(), pa.binary(3),
     pa.decimal128(24, 2), pa.timestamp("ms"), pa.date32()],
)  # fmt: skip
def test_every_sortable_type_digests_and_consolidates(kind):
    values = {
        pa.bool_(): [True, False, True],
        pa.binary(3): [b"abc", b"abd", b"abc"],
        pa.date32(): pa.array([3, 1, 3], pa.int32()).cast(pa.date32()),
    }.get(kind)
    if values is None:
        values = (
            pa.array([3, 1, 3]).cast(kind)
            if not pa.types.is_binary(kind) and not (pa.types.is_large_string(kind))
            else pa.array(["c", "a", "c"]).cast(kind)
        )
    table = updates([1, 2, 1], values, [1, 1, 1], val_type=kind, key_type=pa.int64())
    out = P.consolidate(table)
    assert out.num_rows == 2 and digest(out).same_content(digest(table))


def test_lists_maps_and_nested_structs_digest_and_consolidate_by_value():
    """Types Arrow neither sorts nor groups are compared by value: equal
    lists consolidate, a reordered list is another value."""
    kind = pa.struct([("tags", pa.list_(pa.string())), ("m", pa.map_(pa.string(), pa.int8()))])
    one = {"tags": ["a", "b"], "m": [("k", 1)]}
    other = {"tags": ["b", "a"], "m": [("k", 1)]}
    table = updates([1, 1, 1], [one, other, one], [1, 1, -1], val_type=kind, key_type=pa.int64())
    out = P.consolidate(table)
    assert out["val"].to_pylist() == [other] and out["diff"].to_pylist() == [1]
    assert digest(out).same_content(digest(table))
    assert digest(out).scheme == SCHEME


def test_a_null_struct_and_a_struct_of_nulls_stay_two_rows_with_two_hashes():
    """The bug of scheme 1: a struct's own null was its fields' nulls."""
    kind = pa.struct([("a", pa.int64()), ("b", pa.string())])
    table = updates(
        [1, 1], [{"a": None, "b": None}, None], [1, 1], val_type=kind, key_type=pa.int64()
    )
    out = P.consolidate(table)
    assert out.num_rows == 2 and out["diff"].to_pylist() == [1, 1]
    assert digest(table.slice(0, 1)) != digest(table.slice(1, 1))


def test_nulls_hash_apart_from_values():
    a = updates(["a"], [{"price": None, "name": "q", "n": 1}], [1])
    b = updates(["a"], [{"price": 0.0, "name": "q", "n": 1}], [1])
    assert digest(a) != digest(b) and digest(a) == digest(a)
    assert Digest() + digest(a) == digest(a)


def test_schemes_are_told_apart_by_the_schema_and_never_mixed():
    """Plain key and val hash as scheme 1 did (the digests stored before are
    checked); any other schema is scheme 2. Digests stored before schemes
    were recorded (three fields) decode as scheme 0: not summed with others,
    not checked."""
    nested = updates(["a", "b"], [{"price": 1.0, "name": "q", "n": 1}] * 2, [1, -1])
    plain = updates([1, 2], ["x", "y"], [1, 1], val_type=STRING, key_type=pa.int64())
    now = digest(nested)
    assert (
        now.scheme == SCHEME
        and comparable(now, nested.schema)
        and comparable(Digest(), nested.schema)
    )
    assert digest(plain).scheme == PLAIN_SCHEME and not comparable(digest(plain), nested.schema)
    stored = msgspec.json.decode(b"[2,0,12345]", type=Digest)
    assert stored.scheme == 0 and not comparable(stored, nested.schema)
    assert total_known([now, stored]) is None
    assert total_known([now, Digest(), now]) == now + now
    with pytest.raises(ValueError, match="hash schemes 2 and 0"):
        total([now, stored])


#: Digests of scheme 1 as the numba loops computed them (at 1873c55), for
#: tables :func:`golden_tables` makes: the numpy hash must give the same.
SCHEME_1 = {
    "trickle": (37, 37, 0x909F4EC2A43E6408, 0xBC3DE77497E404E8),
    "ragged": (37, 19, 0x5B471095E3AAA2F0, 0x95AD58399FA4597D),
    "nulls": (37, 37, 0xC2B6883DA4ED2186, 0xDEA466ABE033DC38),
    "temporal": (37, 74, 0xD878051BB906B70E, 0xD72BF51D3213F0AE),
    "decimal": (37, 37, 0x56806CAABB9E93A2, 0xDE8D5B796BEF3AC4),
    "fixed": (37, 37, 0x2135EC503F48F934, 0x426ECA180F8FADB0),
    "odd_length": (37, 37, 0x75C16163CE859D2F, 0x6215DF10DDBF57F),
}


def golden_tables(n: int = 37) -> dict[str, pa.Table]:
    ones = [1] * n
    return {
        "trickle": pa.table({"key": pa.array(range(n), pa.int64()),
                             "val": [format(k, "032x") for k in range(n)], "diff": ones}),
        "ragged": pa.table({"key": pa.array(range(n), pa.int32()),
                            "val": pa.array([("v" * (k * 7 % 90)).encode() for k in range(n)]),
                            "diff": [(-1) ** k * (k + 1) for k in range(n)]}),
        "nulls": pa.table({"key": pa.array([None if k % 5 == 0 else k for k in range(n)],
                                           pa.uint64()),
                           "val": pa.array([None if k % 3 == 0 else "x" * k for k in range(n)],
                                           pa.large_string()), "diff": ones}),
        "temporal": pa.table({"key": pa.array(range(n), pa.timestamp("ms")),
                              "val": pa.array([k % 2 == 0 for k in range(n)]), "diff": [2] * n}),
        "decimal": pa.table({"key": pa.array(range(n), pa.int16()),
                             "val": pa.array([decimal.Decimal(k) / 4 for k in range(n)],
                                             pa.decimal128(12, 2)), "diff": ones}),
        "fixed": pa.table({"key": pa.array(range(n), pa.date32()),
                           "val": pa.array([bytes([k]) * 13 for k in range(n)], pa.binary(13)),
                           "diff": ones}),
        "odd_length": pa.table({"key": pa.array(range(n), pa.int64()),
                                "val": [f"{k:036d}" for k in range(n)], "diff": ones}),
    }  # fmt: skip


@pytest.mark.parametrize("name", sorted(SCHEME_1))
def test_plain_tables_hash_as_scheme_1_did(name):
    """Bit for bit, in numpy (many rows) and in Python (a few rows)."""
    table = golden_tables()[name]
    rows, diffs, whole, first_nine = SCHEME_1[name]
    assert digest(table) == Digest(rows, diffs, whole, PLAIN_SCHEME)
    assert digest(table.slice(0, 9)).hash == first_nine


def test_every_word_of_a_long_value_counts_in_its_place():
    """A string over several words: changing one byte of any word, or
    swapping two words, changes the digest (ragged and fixed-length)."""
    base = "0123456789abcdef" * 3  # 48 bytes: six words
    swapped = base[8:16] + base[:8] + base[16:]
    changed = base[:40] + "X" + base[41:]
    for other in (swapped, changed):
        for extra in ("", "tail of another length"):  # fixed-length, then ragged
            a = updates(["k", "j"], [base, extra or base], [1, 1], val_type=STRING)
            b = updates(["k", "j"], [other, extra or base], [1, 1], val_type=STRING)
            assert digest(a) != digest(b)


SMALL_CASES = [
    (pa.int64(), [-(2**63), -1, 0, 2**63 - 1], pa.string(), ["", "a", "é€", "x" * 41]),
    (pa.int8(), [-128, -1, 0, 127], pa.binary(), [b"", b"\x00", b"\xff" * 8, b"ab" * 9]),
    (pa.uint64(), [0, 1, 2**63, 2**64 - 1], pa.large_string(), ["q"] * 4),
    (
        pa.string(),
        ["", "k", "kk", "é"],
        pa.struct([("n", pa.int16()), ("s", pa.string())]),
        [{"n": -5, "s": ""}, {"n": 0, "s": "s"}, {"n": 7, "s": "ss" * 30}, {"n": 1, "s": ""}],
    ),
    # words only: every leaf folded into the next pass, the last into the finishing one
    (pa.int32(), [-7, 0, 1, 2**31 - 1], pa.float64(), [0.5, -0.0, float("inf"), 1e300]),
    (
        pa.uint16(),
        [0, 1, 2, 65535],
        pa.struct([("a", pa.int64()), ("b", pa.float32()), ("c", pa.bool_()), ("s", pa.string())]),
        [
            {"a": 1, "b": None, "c": True, "s": "x"},
            {"a": -2, "b": 2.5, "c": None, "s": None},
            {"a": None, "b": -1.0, "c": False, "s": "yy" * 9},
            {"a": 2**62, "b": 0.0, "c": True, "s": ""},
        ],
    ),
]


MASK = (1 << 64) - 1


def reference_digest(table: pa.Table) -> tuple[int, int]:
    """``(Σ diffs, Σ diff · h(key, val) mod 2^64)`` as the module doc defines
    them, one value at a time in Python: a plain or float column by its
    values, any other by its canonical encoding's bytes (its order and
    equality are tested against their own model in test_values)."""
    shares = []
    for index, name in enumerate(("key", "val"), 1):
        column = table.column(name)
        if V.plain(column.type) or pa.types.is_floating(column.type):
            shares.append([reference_share(v, column.type, index) for v in column.to_pylist()])
        else:
            encoded = V.encode(column).to_pylist()
            shares.append([reference_share(v, pa.binary(), index) for v in encoded])
    total = 0
    for row, diff in enumerate(table.column("diff").to_pylist()):
        z = sum(share[row] for share in shares) & MASK
        for shift, factor in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB), (31, 1)):
            z = ((z ^ (z >> shift)) * factor) & MASK
        total += z * diff
    return sum(table.column("diff").to_pylist()), total & MASK


def reference_share(value, kind: pa.DataType, index: int) -> int:
    constant = int(D._constants(index, 1)[0])
    if value is None:
        return 0x9E3779B97F4A7C15 * constant
    if pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        return (int(value) & ((1 << kind.bit_width) - 1)) * constant
    if pa.types.is_floating(kind):
        value = 0.0 if value == 0 else (math.nan if math.isnan(value) else value)
        return int.from_bytes(np.array(value, "<f8").tobytes(), "little") * constant
    data = value.encode() if isinstance(value, str) else value
    words = [int.from_bytes(data[i : i + 8], "little") for i in range(0, len(data), 8)]
    constants = D._constants(index, max(len(words), 1))
    return sum(int(k) * w for k, w in zip(constants[: len(words)], words, strict=True)) + len(
        data
    ) * int(D._length_constant(index))


def unaligned_strings(values: list[str]) -> pa.Array:
    """``values`` as a string array whose data buffer starts at an odd address."""
    data = [v.encode() for v in values]
    offsets = np.cumsum([0] + [len(d) for d in data], dtype=np.int32)
    buffer = pa.py_buffer(b"-" + b"".join(data)).slice(1)
    return pa.Array.from_buffers(pa.string(), len(values), [None, pa.py_buffer(offsets), buffer])


@pytest.mark.parametrize(("key_type", "keys", "val_type", "vals"), SMALL_CASES)
def test_the_hash_is_the_one_the_module_doc_defines(key_type, keys, val_type, vals):
    """numpy's passes (and the small tables' Python) give the hash of the
    module doc, value by value in Python: whatever the lengths (values of one
    length, ragged ones, values in the buffer's last 7 bytes), slices and
    nulls."""
    table = updates(keys, vals, [1, -1, 3, -7], val_type=val_type, key_type=key_type)
    for part in (table, table.slice(1), table.slice(3, 1), table.slice(0, 2)):
        assert (digest(part).diffs, digest(part).hash) == reference_digest(part)
        assert digest(part).rows == part.num_rows
        # row by row, as replay hashes its rows: the same h, summed by hand
        hashes = D.row_hashes(part).tolist()
        diffs = part.column("diff").to_pylist()
        assert sum(h * d for h, d in zip(hashes, diffs, strict=True)) & MASK == digest(part).hash


@pytest.mark.parametrize("length", [1, 5, 8, 13, 16, 32, 36, 56, 64, 72, 100])
def test_values_of_one_length_hash_as_ragged_ones_would(length):
    """A column of one length (whole words, and words with a tail), a slice
    of it and one at an odd address hash as the reference does; a null
    counts as its constant."""
    words = [(f"{i * 7919:016x}{i:08x}" * 5)[:length] for i in range(300)]
    assert {len(w) for w in words} == {length}
    ragged = [w[: 1 + i % length] for i, w in enumerate(words)]
    for vals in (words, ragged, [None if i % 7 == 0 else w for i, w in enumerate(words)]):
        table = updates(list(range(300)), vals, [1 + i % 3 for i in range(300)], STRING, pa.int64())
        for part in (table, table.slice(5, 200)):
            assert (digest(part).diffs, digest(part).hash) == reference_digest(part)
        odd = table.set_column(1, "val", unaligned_strings([v or "" for v in vals]))
        assert (digest(odd).diffs, digest(odd).hash) == reference_digest(odd)
