"""One interval, many shards, all or nothing: the rule, and transactions
on local stores and through a consensus server."""

from __future__ import annotations

import pyarrow as pa
import pytest

import shardsink
from shardsink import faults
from shardsink.persist.commands import (
    AlreadyAppended,
    CompareAndAppend,
    PartsMissing,
    Rejected,
    WriterGone,
    WrongUpper,
)
from shardsink.persist.config import ShardConfig
from shardsink.persist.transactions import decide
from shardsink.process import ConsensusProcess
from shardsink.server.config import ServeConfig
from shardsink.storage.errors import IndeterminateError
from tests.helpers.server import serving

SCHEMA = pa.schema([("key", pa.int64()), ("val", pa.string())])
ITEMS = [("a", CompareAndAppend("w", "t", (), 0, 1)), ("b", CompareAndAppend("v", "u", (), 0, 1))]


def test_the_rule_commits_all_or_answers_for_every_shard():
    assert decide(ITEMS, [None, None], [0, 0]) is None
    moved = [WrongUpper(0, 0), WrongUpper(0, 5)]
    assert decide(ITEMS, [None, WrongUpper(0, 5)], [0, 5]) == moved
    done = [AlreadyAppended(1), AlreadyAppended(1)]
    assert decide(ITEMS, done, [1, 1]) == done
    refused = decide(ITEMS, [None, WriterGone("v")], [0, 0])
    assert isinstance(refused[0], Rejected) and "b: WriterGone" in refused[0].reason
    assert refused[1] == WriterGone("v")
    half = decide(ITEMS, [AlreadyAppended(1), None], [1, 0])
    assert all(isinstance(r, Rejected) and "applied to a only" in r.reason for r in half)
    missing = PartsMissing(("k",), "gone")
    assert decide(ITEMS, [missing, WrongUpper(0, 3)], [0, 3]) == [
        WrongUpper(0, 0),
        WrongUpper(0, 3),
    ]


def rows(lower: int, keys: range) -> pa.Table:
    return pa.table({
        "key": pa.array(list(keys), pa.int64()),
        "val": [f"v{k}" for k in keys],
        "ts": pa.array([lower] * len(keys), pa.uint64()),
        "diff": pa.array([1] * len(keys), pa.int64()),
    })  # fmt: skip


def check_transactions(shards) -> None:
    """Two intervals commit to both shards; a third expecting a stale upper
    on one commits to neither and names both uppers; the snapshots agree."""
    for i in range(2):
        txn = shards.transaction()
        txn.append("orders", rows(i * 10, range(i * 3, i * 3 + 3)), i * 10, i * 10 + 10)
        txn.append("lines", rows(i * 10, range(i * 5, i * 5 + 5)), i * 10, i * 10 + 10)
        assert txn.commit() == {"orders": i * 10 + 10, "lines": i * 10 + 10}
    alone = shards.writer("lines")
    alone.compare_and_append_table(rows(20, range(99, 100)), 20, 30)  # lines moves on alone
    txn = shards.transaction()
    txn.append("orders", rows(20, range(50, 52)), 20, 30)
    txn.append("lines", rows(20, range(60, 61)), 20, 30)
    with pytest.raises(shardsink.TransactionMismatch) as caught:
        txn.commit()
    assert caught.value.actual == {"orders": 20, "lines": 30}
    assert shards.uppers() == {"orders": 20, "lines": 30}
    snapshots = shards.snapshots()
    assert sorted(snapshots["orders"]["key"].to_pylist()) == list(range(6))
    assert sorted(snapshots["lines"]["key"].to_pylist()) == list(range(10))


def test_a_transaction_on_local_stores_is_all_or_nothing(tmp_path):
    stores = {"blob": f"file://{tmp_path}/blob", "consensus": f"sqlite://{tmp_path}/c.db"}
    schemas = {"orders": SCHEMA, "lines": SCHEMA}
    with shardsink.open_shards(schemas, **stores, create=True) as shards:
        check_transactions(shards)


def test_a_transaction_through_a_consensus_server_is_all_or_nothing(tmp_path):
    blob = shardsink.open_blob(f"file://{tmp_path}/blob")
    with serving(tmp_path, blob) as server:
        schemas = {"orders": SCHEMA, "lines": SCHEMA}
        with shardsink.open_shards(
            schemas, blob=blob.uri, consensus=server.address, create=True
        ) as shards:
            check_transactions(shards)


def test_a_retry_after_an_unknown_outcome_commits_exactly_once(tmp_path):
    """The store commits, then its answer is lost: commit raises; the same
    transaction committed again is answered as already appended, once."""
    stores = {"blob": f"file://{tmp_path}/blob", "consensus": f"sqlite://{tmp_path}/c.db"}
    config = ShardConfig(max_attempts=1)
    with shardsink.open_shards({"a": SCHEMA, "b": SCHEMA}, **stores, create=True,
                               config=config) as shards:  # fmt: skip
        txn = shards.transaction()
        txn.append("a", rows(0, range(3)), 0, 10)
        txn.append("b", rows(0, range(4)), 0, 10)
        faults.arm(["consensus.call:indeterminate:1.0:1"])
        try:
            shards._transactions._store = faults.wrap_store(
                "consensus.call", shards._transactions._store
            )
            with pytest.raises(IndeterminateError):
                txn.commit()
        finally:
            faults.arm([])
        assert txn.commit() == {"a": 10, "b": 10}
        assert shards.snapshots(9)["a"].num_rows == 3 and shards.snapshots(9)["b"].num_rows == 4


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_a_consensus_killed_between_its_store_and_its_reply(tmp_path, request, store):
    """SIGKILLed after the transaction is stored, before it answers: the
    client's commit fails, the restarted server holds the transaction in
    both shards, and the retry (same tokens) is answered as appended."""
    consensus = (
        f"sqlite://{tmp_path}/c.db"
        if store == "sqlite"
        else request.getfixturevalue("postgres_server").new_database()
    )
    blob = f"file://{tmp_path}/blob"
    env = faults.environ(["transaction.after_store:kill:1.0:1"], fault_dir=tmp_path / "f")
    server = ConsensusProcess(consensus, blob, ServeConfig(bind=f"ipc://{tmp_path}/s/c"), env=env)
    config = ShardConfig(server_timeout_s=1.0, server_retry_for_s=0)
    with server:  # started
        schemas = {"a": SCHEMA, "b": SCHEMA}
        with shardsink.open_shards(
            schemas, blob=blob, consensus=server.address, create=True, config=config
        ) as shards:
            txn = shards.transaction()
            txn.append("a", rows(0, range(3)), 0, 10)
            txn.append("b", rows(0, range(4)), 0, 10)
            with pytest.raises(IndeterminateError):
                txn.commit()
            # its exit, through a pidfd (killed by the fault)
            assert server.child.wait(30) is not None, "the server outlived its fault"
            server.start()
            assert txn.commit() == {"a": 10, "b": 10}
            assert [shards.shard(n).snapshot(9).num_rows for n in ("a", "b")] == [3, 4]
    assert len(faults.fired(tmp_path / "f")) == 1


def test_batches_written_elsewhere_are_appended_as_their_writer(tmp_path):
    """A cluster's workers write its writer's batches; a transaction takes
    them as they are, appends them as that writer, and counts them in each
    shard's handle. A batch of another interval, or a writer of another
    shard, is refused before anything is sent. The shards' common upper is
    theirs until one moves on alone."""
    stores = {"blob": f"file://{tmp_path}/blob", "consensus": f"sqlite://{tmp_path}/c.db"}
    with shardsink.open_shards({"a": SCHEMA, "b": SCHEMA}, **stores, create=True) as shards:
        writers = {name: shards.shard(name).writer("cluster-x") for name in ("a", "b")}
        batches = {name: writers[name].batch(rows(0, range(n)), 0, 10)
                   for name, n in (("a", 2), ("b", 3))}  # fmt: skip
        txn = shards.transaction()
        with pytest.raises(ValueError, match="is not a writer of this set's shard 'b'"):
            txn.add("b", [batches["b"]], 0, 10, writer=writers["a"])
        with pytest.raises(ValueError, match=r"covers \[0, 10\), not \[10, 20\)"):
            txn.add("a", [batches["a"]], 10, 20, writer=writers["a"])
        for name, writer in writers.items():
            txn.add(name, [batches[name]], 0, 10, writer=writer)
        assert txn.commit() == {"a": 10, "b": 10}
        for name, n in (("a", 2), ("b", 3)):
            shard = shards.shard(name)
            assert (shard.stats().appends, shard.stats().rows) == (1, n)
            tokens = {w.token for w in shard.state(refresh=True).writers.values() if w.token}
            assert len(tokens) == 1  # the transaction's, on the cluster's writer
            assert writers[name].writer_id in shard.state().writers
            assert shard.snapshot(9).num_rows == n
        assert shards.common_upper() == 10
        writers["b"].compare_and_append([], 10, 20)  # b alone moves on
        with pytest.raises(ValueError, match=r"different uppers \(\{'a': 10, 'b': 20\}\)"):
            shards.common_upper()
