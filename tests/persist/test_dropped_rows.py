"""A compaction that drops rows never commits, and one that slipped
through anyway is found: digests from the writers to the merged parts."""

from __future__ import annotations

import msgspec
import pytest

from shardsink import open_shard
from shardsink.persist import ShardConfig, compaction as C, parts as P
from shardsink.persist.commands import ApplyCompaction, Done, Rejected
from shardsink.persist.errors import CorruptState
from shardsink.persist.maintenance import register_writer
from shardsink.persist.state import BlobPart, part_prefix
from tests.helpers.persist import interval_rows, memory_stores

ALL_BLOB = ShardConfig(inline_max_bytes=0)


def shard_of_three():
    blob, consensus = memory_stores()
    shard = open_shard("s", blob=blob, consensus=consensus, config=ALL_BLOB, create=True)
    writer = shard.writer()
    for i in range(3):
        writer.compare_and_append_table(interval_rows(i, range(4 * i, 4 * i + 4)), i, i + 1)
    return shard


def half_of(shard) -> tuple[BlobPart, str]:
    """A part holding half the shard's 12 rows, under a new writer's prefix."""
    table = shard.snapshot(2).slice(0, 6)
    writer = register_writer(shard.machine, "liar")
    part, data = P.blob_part(table, f"{part_prefix('s', writer)}half.parquet")
    shard.blob.set(part.key, data)
    return part, writer


def test_an_output_without_its_inputs_digest_is_refused_and_one_with_it_is_found():
    """The state machine refuses a merged batch that dropped the digest its
    inputs were written with; a merged batch that kept it, over half the
    rows, commits, and verify names it."""
    with shard_of_three() as shard:
        state = shard.state(refresh=True)
        batches = state.ordered_batches()
        part, writer = half_of(shard)
        out = msgspec.structs.replace(
            batches[0], id="half", upper=3, parts=(part,), rows=6, digest=None
        )
        inputs = tuple(b.id for b in batches)
        refused = shard.machine.run(ApplyCompaction(inputs, out, writer))
        assert isinstance(refused, Rejected) and "digest" in refused.reason
        assert shard.verify().verified
        written = C.total_known(b.digest for b in batches)
        lying = msgspec.structs.replace(out, digest=written)
        assert isinstance(shard.machine.run(ApplyCompaction(inputs, lying, writer)), Done)
        report = shard.verify()
        assert not report.ok and not report.verified
        assert any("interval [0, 3)" in p and "-6 diffs" in p for p in report.problems)


def test_a_merge_that_loses_rows_raises_and_commits_nothing(monkeypatch):
    """The compactor checks what it merged against its inputs' digests
    before it commits (a compaction retires its inputs)."""
    with shard_of_three() as shard:
        before = shard.state(refresh=True)
        blobs = set(shard.blob.list("s/"))
        consolidate = P.consolidate
        monkeypatch.setattr(P, "consolidate", lambda t: consolidate(t).slice(1))
        with pytest.raises(CorruptState, match=r"holds .* its inputs were written with"):
            shard.compact()
        after = shard.state(refresh=True)
        assert after.batches.keys() == before.batches.keys()
        assert set(shard.blob.list("s/")) == blobs  # its output deleted


def test_a_batch_without_a_digest_is_unverified_never_verified(monkeypatch):
    monkeypatch.setenv("SHARDSINK_NO_DIGEST", "1")
    with shard_of_three() as shard:
        report = shard.verify()
        assert report.ok and not report.verified and report.unverified == 3
        assert "3 batches have no digest" in report.summary()
