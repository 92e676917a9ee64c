"""Appends, compaction and GC through seeded storage faults (determinate and
indeterminate, on blob and consensus): nothing lost, nothing doubled, every
referenced blob present."""

from __future__ import annotations

import contextlib

import pytest

from shardsink import open_shard
from shardsink.faults import FaultyBlob, FaultyConsensus
from shardsink.persist import ShardConfig
from shardsink.storage import StorageError, open_blob, open_consensus
from tests.helpers.persist import interval_rows, memory_stores, rows_of

N = 60


def retry(fn, *args):
    """Call ``fn(*args)`` until it does not raise a storage error."""
    for _ in range(200):
        try:
            return fn(*args)
        except StorageError:
            continue
    raise AssertionError(f"{fn} kept failing")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_faults_lose_and_double_nothing(seed):
    blob_uri, consensus_uri = memory_stores()
    blob = FaultyBlob(open_blob(blob_uri), seed, fail_rate=0.1, indeterminate_rate=0.1)
    consensus = FaultyConsensus(
        open_consensus(consensus_uri), seed, fail_rate=0.1, indeterminate_rate=0.1
    )
    config = ShardConfig(rollup_threshold=4, inline_max_bytes=200, blob_target_bytes=2000)
    shard = retry(
        lambda: open_shard("s", blob=blob, consensus=consensus, config=config, create=True)
    )
    with shard:
        w = retry(shard.writer)
        for i in range(N):
            batch = retry(w.batch, interval_rows(i, range(i, i + 1 + i % 7)), i, i + 1)
            # a failed call is retried with the same arguments: the same token
            assert retry(w.compare_and_append, [batch], i, i + 1) == i + 1
            if i % 5 == 4:
                for maintenance in (shard.compact, shard.collect_garbage):
                    # a run cut short by a fault leaves its work to the next one
                    with contextlib.suppress(StorageError):
                        maintenance()
    assert sum(consensus.injected.values()) > 10 and sum(blob.injected.values()) > 5
    with open_shard(
        "s", blob=blob_uri, consensus=consensus_uri, config=config, create=True
    ) as clean:
        state = clean.state()
        assert state.upper == N
        for key in {k for b in state.batches.values() for k in b.blob_keys()}:
            assert clean.blob.get(key) is not None
        expected = sorted(
            (k, format(k, "032x"), N - 1, sum(1 for i in range(N) if i <= k < i + 1 + i % 7))
            for k in range(N + 6)
        )
        assert rows_of(clean.snapshot()) == [r for r in expected if r[3]]
