"""Consensus stores diffs, not states: an append's diff stays small however
many batches the shard holds."""

from __future__ import annotations

import pytest

from shardsink import open_shard
from shardsink.persist import ShardConfig
from shardsink.persist.state import encode_state
from tests.helpers.persist import interval_rows, memory_stores


@pytest.mark.parametrize("inline_max_bytes", [4096, 0], ids=["inline", "blob"])
def test_small_append_writes_a_diff_much_smaller_than_the_state(inline_max_bytes):
    blob, consensus = memory_stores()
    config = ShardConfig(inline_max_bytes=inline_max_bytes)
    with open_shard("s", blob=blob, consensus=consensus, config=config, create=True) as shard:
        w = shard.writer()
        for i in range(300):
            w.compare_and_append_table(interval_rows(i, [i]), i, i + 1)
        before = shard.stats()
        w.compare_and_append_table(interval_rows(300, [300]), 300, 301)
        after = shard.stats()
        state_bytes = len(encode_state(shard.state()))
        diff_bytes = after.diff_bytes - before.diff_bytes
        print(f"inline_max_bytes={inline_max_bytes}: diff {diff_bytes} B, state {state_bytes} B")
        assert after.versions - before.versions == 1
        assert diff_bytes == after.last_diff_bytes
        assert len(shard.state().batches) == 301
        assert diff_bytes * 50 < state_bytes, (diff_bytes, state_bytes)
