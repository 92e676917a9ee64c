"""The heads a batch of SQLite compare-and-sets reads: their cost does not
grow with the shards' histories."""

from __future__ import annotations

from shardsink.storage.sqlite import SqliteConsensus, _head_seqnos

SHARDS = 32


def _steps_to_read_heads(store: SqliteConsensus, shards: list[str]) -> int:
    """SQLite virtual-machine steps :func:`_head_seqnos` takes for ``shards``
    (their heads checked on the way)."""
    conn = store._connection()
    steps = [0]

    def count() -> int:
        steps[0] += 1
        return 0

    conn.set_progress_handler(count, 1)
    try:
        heads = _head_seqnos(conn, [*shards, "no-such-shard"])
    finally:
        conn.set_progress_handler(None, 1)
    assert heads == {shard: int(shard.split("-")[1]) - 1 for shard in shards}
    return steps[0]


def test_reading_heads_costs_the_same_for_3_versions_as_for_300(tmp_path) -> None:
    store = SqliteConsensus(tmp_path / "c.db")
    try:
        conn = store._connection()
        steps = {}
        for versions in (3, 300):
            shards = [f"s{i}-{versions}" for i in range(SHARDS)]
            with conn:
                conn.executemany(
                    "INSERT INTO consensus (shard, seqno, data) VALUES (?, ?, ?)",
                    [(shard, seqno, b"x") for shard in shards for seqno in range(versions)],
                )
            steps[versions] = _steps_to_read_heads(store, shards)
        # a max(seqno) ... GROUP BY shard took 60 times as many at 300
        assert steps[300] < 1.5 * steps[3], steps
    finally:
        store.close()
