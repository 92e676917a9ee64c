"""The seeded fault-injecting wrappers, around the in-memory stores."""

from __future__ import annotations

import uuid

import pytest

from shardsink.faults import FaultyBlob, FaultyConsensus
from shardsink.storage import (
    Blob,
    Committed,
    Consensus,
    DeterminateError,
    IndeterminateError,
    StorageError,
    VersionedData,
)
from shardsink.storage.memory import MemoryBlob, MemoryConsensus


def fresh_consensus() -> MemoryConsensus:
    return MemoryConsensus(uuid.uuid4().hex)


def fresh_blob() -> MemoryBlob:
    return MemoryBlob(uuid.uuid4().hex)


def outcomes(store: FaultyConsensus, calls: int) -> list[str]:
    seen = []
    for _ in range(calls):
        try:
            store.head("s")
            seen.append("ok")
        except StorageError as exc:
            seen.append(type(exc).__name__)
    return seen


def test_wrappers_satisfy_the_protocols():
    assert isinstance(FaultyConsensus(fresh_consensus(), seed=1), Consensus)
    assert isinstance(FaultyBlob(fresh_blob(), seed=1), Blob)


def test_same_seed_gives_the_same_fault_sequence():
    def run(seed: int) -> list[str]:
        return outcomes(FaultyConsensus(fresh_consensus(), seed, 0.2, 0.2), 300)

    first = run(7)
    assert first == run(7)
    assert first != run(8)
    assert {"ok", "DeterminateError", "IndeterminateError"} == set(first)


def test_faults_are_counted_by_kind_at_about_their_rates():
    store = FaultyConsensus(fresh_consensus(), seed=3, fail_rate=0.1, indeterminate_rate=0.3)
    seen = outcomes(store, 2000)
    assert store.injected["determinate"] == seen.count("DeterminateError")
    assert store.injected["indeterminate"] == seen.count("IndeterminateError")
    assert 150 < store.injected["determinate"] < 250
    assert 500 < store.injected["indeterminate"] < 700


def test_determinate_fault_never_reaches_the_inner_store():
    inner = fresh_consensus()
    store = FaultyConsensus(inner, seed=0, fail_rate=1.0)
    with pytest.raises(DeterminateError, match=r"compare_and_set .* not performed"):
        store.compare_and_set("s", None, VersionedData(0, b"x"))
    assert inner.head("s") is None
    blob_inner = fresh_blob()
    blob = FaultyBlob(blob_inner, seed=0, fail_rate=1.0)
    with pytest.raises(DeterminateError):
        blob.set("k", b"x")
    assert blob_inner.get("k") is None
    blob_inner.set("k", b"x")
    with pytest.raises(DeterminateError, match=r"stat .* not performed"):
        blob.stat("k")
    with pytest.raises(DeterminateError, match=r"open_input .* not performed"):
        blob.open_input("k")
    assert blob.injected == {"determinate": 3}


def test_indeterminate_fault_performs_the_call_then_raises():
    inner = fresh_consensus()
    store = FaultyConsensus(inner, seed=0, indeterminate_rate=1.0)
    with pytest.raises(IndeterminateError, match="timeout after compare_and_set"):
        store.compare_and_set("s", None, VersionedData(0, b"x"))
    assert inner.head("s") == VersionedData(0, b"x")
    blob_inner = fresh_blob()
    blob = FaultyBlob(blob_inner, seed=0, indeterminate_rate=1.0)
    with pytest.raises(IndeterminateError, match="timeout after set"):
        blob.set("k", b"x")
    assert blob_inner.get("k") == b"x"
    assert store.injected == {"indeterminate": 1}
    with pytest.raises(IndeterminateError, match="timeout after stat"):
        blob.stat("k")
    opened = []

    def open_input(key):
        opened.append(MemoryBlob.open_input(blob_inner, key))
        return opened[-1]

    blob_inner.open_input = open_input
    with pytest.raises(IndeterminateError, match="timeout after open_input"):
        blob.open_input("k")
    assert len(opened) == 1 and opened[0].closed  # the lost result is not left open
    assert blob.injected == {"indeterminate": 3}


def test_without_faults_every_call_passes_through():
    store = FaultyConsensus(fresh_consensus(), seed=0)
    assert store.compare_and_set("s", None, VersionedData(0, b"a")) == Committed(0)
    assert store.scan("s", 0, 5) == [VersionedData(0, b"a")]
    assert store.list_shards() == ["s"]
    assert store.truncate("s", 0) == 0
    blob = FaultyBlob(fresh_blob(), seed=0)
    blob.set("a/b", b"1")
    assert blob.get("a/b") == b"1"
    assert list(blob.list("a/")) == ["a/b"]
    assert [m.key for m in blob.list_meta("")] == ["a/b"]
    assert blob.stat("a/b").size == 1 and blob.stat("a/c") is None
    with blob.open_input("a/b") as file:
        assert file.read() == b"1"
    assert blob.open_input("a/c") is None
    blob.delete("a/b")
    assert blob.get("a/b") is None
    assert not store.injected and not blob.injected
    store.close()
    blob.close()


@pytest.mark.parametrize("rates", [(-0.1, 0.0), (0.0, -0.1), (0.6, 0.5)])
def test_invalid_rates_are_value_errors(rates):
    with pytest.raises(ValueError, match="fault rates"):
        FaultyConsensus(fresh_consensus(), 0, *rates)


def test_temporary_files_pass_through_the_blob_wrapper(tmp_path):
    """A killed writer's temporary file is found and removed through the
    wrapper as through the store (the leaked-blob sweep of a process with
    faults armed); a store that leaves none shows none."""
    from shardsink.storage.contracts import temp_files
    from shardsink.storage.file import FileBlob

    inner = FileBlob(str(tmp_path))
    inner.set("s/part/a", b"x")
    (tmp_path / "s" / "part" / "a~12345-deadbeef").write_bytes(b"half")
    store = FaultyBlob(inner, seed=1)
    found = temp_files(store, "s/")
    assert [t.name for t in found] == ["s/part/a~12345-deadbeef"]
    store.delete_temp(found[0].name)
    assert temp_files(inner, "s/") == [] and inner.get("s/part/a") == b"x"
    assert temp_files(FaultyBlob(fresh_blob(), seed=1)) == []
    with pytest.raises(ValueError, match="leaves none"):
        FaultyBlob(fresh_blob(), seed=1).delete_temp("k~1-ab")
