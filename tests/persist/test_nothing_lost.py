"""Issue "Nothing lost", findings 1, 3, 4 and 11 on a shard in this process:
each test fails on the code before the fix (named in its docstring) and
shows the rule that closes the window."""

from __future__ import annotations

import os
import time

import pytest

from shardsink import open_shard
from shardsink.cli import main
from shardsink.persist import ShardConfig
from shardsink.persist.commands import ExpireWriters
from shardsink.persist.errors import PartsNotFound, StateMissing, WriterExpired
from shardsink.persist.state import part_writer
from shardsink.persist.state_versions import CREATE_RACE_S
from shardsink.workloads import SCHEMA, Workload
from tests.helpers.persist import interval_rows

LEASE_MS = 60_000
CONFIG = ShardConfig(inline_max_bytes=0, writer_lease_ms=LEASE_MS, leaked_blob_grace_ms=LEASE_MS)
WORKLOAD = Workload("churn", rows_per_interval=50)


def _stores(tmp_path) -> dict:
    return {"blob": f"file://{tmp_path}/blob", "consensus": f"sqlite://{tmp_path}/c.db"}


def _age(tmp_path, key: str, seconds: float) -> None:
    """Make a file blob look ``seconds`` old to the sweep."""
    path = tmp_path / "blob" / key
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_a_part_waiting_for_its_append_survives_any_sweep_and_commits(tmp_path):
    """Finding 1: a sweep with a grace shorter than the batch's age (0 was
    accepted) deleted an uploaded part, and the append then committed it, so
    every later read failed with PartMissing. Now a grace below the writer
    lease is refused, and a live writer's parts are never swept, however old."""
    with open_shard("s", **_stores(tmp_path), config=CONFIG, create=True) as shard:
        writer = shard.writer()
        batch = writer.batch(WORKLOAD.updates(0), 0, 1000)
        (key,) = batch.blob_keys()
        assert part_writer("s", key) == writer.writer_id
        _age(tmp_path, key, 10 * LEASE_MS / 1000)
        with pytest.raises(ValueError, match="shorter than the writer lease"):
            shard.sweep_leaked_blobs(0)
        assert shard.sweep_leaked_blobs(LEASE_MS) == []
        assert writer.compare_and_append([batch], 0, 1000) == 1000
        assert shard.snapshot().num_rows == WORKLOAD.updates(0).num_rows


def test_an_append_naming_a_part_that_is_not_in_blob_is_refused(tmp_path):
    """Finding 1, at commit: nothing checked that the parts exist, so an
    append of a deleted part committed a shard that could not be read. Now
    the machine looks (one stat per part) and refuses it, naming the key."""
    with open_shard("s", **_stores(tmp_path), config=CONFIG, create=True) as shard:
        writer = shard.writer()
        batch = writer.batch(WORKLOAD.updates(0), 0, 1000)
        (key,) = batch.blob_keys()
        shard.blob.delete(key)
        with pytest.raises(PartsNotFound, match=key):
            writer.compare_and_append([batch], 0, 1000)
        assert shard.upper == 0
        assert shard.verify().ok


def test_a_gone_writers_leaked_part_is_swept_and_it_cannot_commit(tmp_path):
    """The sweep still takes what is leaked: a part of a writer that left
    state (here it expired) is deleted once older than the grace, and the
    expired writer stays gone (it used to come back on its next heartbeat,
    and could then append a part the sweep had taken)."""
    now = [1_000_000]
    with open_shard(
        "s", **_stores(tmp_path), config=CONFIG, clock=lambda: now[0], create=True
    ) as shard:
        writer, live = shard.writer(), shard.writer()
        leaked = writer.batch(WORKLOAD.updates(0), 0, 1000)
        kept = live.batch(WORKLOAD.updates(0), 0, 1000)
        now[0] += LEASE_MS + 1
        live.heartbeat()
        shard.machine.run(ExpireWriters(LEASE_MS))
        for batch in (leaked, kept):
            _age(tmp_path, batch.blob_keys()[0], 2 * LEASE_MS / 1000)
        assert shard.sweep_leaked_blobs(LEASE_MS) == leaked.blob_keys()
        with pytest.raises(WriterExpired, match=writer.writer_id):
            writer.heartbeat()
        with pytest.raises(WriterExpired):
            writer.compare_and_append([leaked], 0, 1000)
        again = shard.writer(writer.name)
        assert again.writer_id != writer.writer_id  # ids are never reused
        assert live.compare_and_append([kept], 0, 1000) == 1000
        assert shard.snapshot().num_rows == WORKLOAD.updates(0).num_rows


def test_discarding_a_tried_append_that_committed_keeps_what_it_references(tmp_path):
    """Finding 3: after an append whose earlier try may have committed, its
    blobs were deleted without looking at the state. Discarding with
    ``tried`` deletes only what the state does not reference."""
    with open_shard("s", **_stores(tmp_path), config=CONFIG, create=True) as shard:
        writer = shard.writer()
        committed = writer.batch(WORKLOAD.updates(0), 0, 1000)
        writer.compare_and_append([committed], 0, 1000)
        never = writer.batch(WORKLOAD.updates(1), 1000, 2000)
        writer.discard([committed, never], tried=True)
        assert shard.blob.stat(committed.blob_keys()[0]) is not None
        assert shard.blob.stat(never.blob_keys()[0]) is None
        assert shard.snapshot().num_rows == WORKLOAD.updates(0).num_rows


@pytest.mark.parametrize("how", ["emptied", "deleted"])
def test_a_consensus_store_that_lost_the_shard_over_its_blobs_is_refused(tmp_path, how, capsys):
    """Finding 4: an SQLite file truncated to 0 bytes (or deleted) in a data
    dir holding parts made ``up`` start a new shard at upper 0 over them
    (and a later sweep would delete them as leaked). Now opening refuses,
    naming both stores, and changes nothing; so do ``read`` and ``up``."""
    data = tmp_path / "d"
    data.mkdir(mode=0o700)
    stores = {"blob": f"file://{data}/blob", "consensus": f"sqlite://{data}/consensus.db"}
    with open_shard("default", **stores, schema=SCHEMA, config=CONFIG) as shard:
        shard.writer().compare_and_append_table(WORKLOAD.updates(0), 0, 1000)
    blobs = sorted(p for p in (data / "blob").rglob("*") if p.is_file())
    for suffix in ("-wal", "-shm"):
        (data / f"consensus.db{suffix}").unlink(missing_ok=True)
    if how == "emptied":
        os.truncate(data / "consensus.db", 0)
    else:
        (data / "consensus.db").unlink()
        (data / "consensus.db").touch()  # `read` wants a store there at all
    missing = r"consensus sqlite://.* has no state of shard 'default'"
    with pytest.raises(StateMissing, match=missing):
        open_shard("default", **stores, schema=SCHEMA)
    assert main(["read", "--data-dir", str(data)]) != 0
    assert "has no state of shard 'default'" in capsys.readouterr().err
    code = main(["up", "--data-dir", str(data), "--intervals", "1", "--groups", "1"])
    assert code != 0
    assert "has no state of shard 'default'" in capsys.readouterr().err
    assert sorted(p for p in (data / "blob").rglob("*") if p.is_file()) == blobs


def test_a_fresh_first_rollup_alone_is_a_racing_creators_an_old_one_is_evidence(tmp_path):
    """A creator stores its version-0 rollup just before version 0: an opener
    racing it sees that rollup alone and creates (or loads) the shard as
    before; the same rollup a while old means the store lost the shard (all
    of whose parts may have been inline in the lost state)."""
    stores = _stores(tmp_path)
    with open_shard("s", **stores, create=True) as shard:
        rollup = shard.state().rollups[0].key
    with open_shard("t", **stores, create=True) as other:
        for name in ("u", "v"):
            other.blob.set(rollup.replace("s/", f"{name}/", 1), b"a racing creator's")
    _age(tmp_path, rollup.replace("s/", "v/", 1), CREATE_RACE_S + 1)
    with open_shard("u", **stores, create=True) as shard:
        assert shard.upper == 0
    with pytest.raises(StateMissing, match="has no state of shard 'v'"):
        open_shard("v", **stores, create=True)


def test_verify_names_the_part_that_differs_from_its_description(tmp_path, capsys):
    """Finding 11: ``shard verify`` checks every live part against its
    description (existence, length, rows, bounds) and every rollup; exit 0
    with one line when all hold, 1 naming each part that does not."""
    data = tmp_path / "d"
    data.mkdir(mode=0o700)
    stores = {"blob": f"file://{data}/blob", "consensus": f"sqlite://{data}/consensus.db"}
    with open_shard("default", **stores, schema=SCHEMA, config=CONFIG) as shard:
        writer = shard.writer()
        for i in range(3):
            writer.compare_and_append_table(interval_rows(i, range(i * 10, i * 10 + 10)), i, i + 1)
        keys = [b.blob_keys()[0] for b in shard.state().ordered_batches()]
    assert main(["shard", "verify", "--data-dir", str(data)]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "3 blob parts" in out and "all verified" in out
    (data / "blob" / keys[1]).unlink()
    with (data / "blob" / keys[2]).open("r+b") as f:
        f.seek(4)
        f.write(b"\xff" * 8)  # the first column chunk: a value, not the footer
    assert main(["shard", "verify", "--data-dir", str(data)]) == 1
    out = capsys.readouterr().out
    assert f"{keys[1]} of batch" in out and "missing from blob" in out
    assert f"{keys[2]} of batch" in out
    assert keys[0] not in out
