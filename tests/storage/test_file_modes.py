"""The files of the embedded stores are their owner's only: files 0600 and
directories 0700, like the shared-memory segments, whatever the umask."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from shardsink import Workload, open_shard
from shardsink.persist import ShardConfig
from shardsink.storage import VersionedData, open_blob, open_consensus


@pytest.fixture
def loose_umask():
    """The common umask 022, which lets group and others read new files."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def _modes(root: Path) -> dict[str, int]:
    return {
        str(p.relative_to(root.parent)): stat.S_IMODE(p.lstat().st_mode)
        for p in [root, *root.rglob("*")]
    }


def test_blob_files_are_0600_and_directories_0700(tmp_path, loose_umask):
    store = open_blob(f"file://{tmp_path}/blobs")
    try:
        store.set("s/part/x", b"v")
        store.set("top", b"v")
    finally:
        store.close()
    assert _modes(tmp_path / "blobs") == {
        "blobs": 0o700,
        "blobs/s": 0o700,
        "blobs/s/part": 0o700,
        "blobs/s/part/x": 0o600,
        "blobs/top": 0o600,
    }


def test_sqlite_database_and_its_wal_and_shm_are_0600(tmp_path, loose_umask):
    (tmp_path / "db").mkdir(mode=0o700)
    consensus = open_consensus(f"sqlite://{tmp_path}/db/consensus.db")
    try:
        consensus.compare_and_set("s", None, VersionedData(0, b"v"))
        modes = _modes(tmp_path / "db")
    finally:
        consensus.close()
    assert modes == {
        "db": 0o700,
        "db/consensus.db": 0o600,
        "db/consensus.db-wal": 0o600,
        "db/consensus.db-shm": 0o600,
    }


def test_a_shard_on_the_embedded_stores_leaves_nothing_readable_by_others(tmp_path, loose_umask):
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    config = ShardConfig(inline_max_bytes=0)  # the part goes to blob
    blob, consensus = f"file://{data}/blob", f"sqlite://{data}/c.db"
    with open_shard("s", blob=blob, consensus=consensus, config=config, create=True) as shard:
        shard.writer().compare_and_append_table(Workload("trickle", 10).updates(0), 0, 1000)
        modes = _modes(data)
    assert any("/part/" in path for path in modes)
    assert {path: oct(mode) for path, mode in modes.items() if mode & 0o077} == {}
