"""Segment names and the sweep: only dead creators' segments of the right form
go; live creators, other clusters and foreign names are never touched."""

from __future__ import annotations

import contextlib
import os

import posix_ipc
import pytest

from shardsink.cli import main
from shardsink.shm import Arena, SegmentName, creator_alive, list_segments, sweep, unlink_cluster
from shardsink.shm.sweep import process_start
from tests.helpers.shm import make_part, unique_cluster


@pytest.fixture
def fake():
    """Creates segments by name, as a process now gone would have; removes leftovers."""
    made = []

    def create(name: str) -> str:
        posix_ipc.SharedMemory(f"/{name}", posix_ipc.O_CREX, mode=0o600, size=4096).close_fd()
        made.append(name)
        return name

    yield create
    for name in made:
        with contextlib.suppress(posix_ipc.ExistentialError):
            posix_ipc.unlink_shared_memory(f"/{name}")


def test_names_round_trip():
    name = SegmentName.fresh("c-1_x")
    assert name.pid == os.getpid() and name.start == process_start(os.getpid())
    assert SegmentName.parse(str(name)) == name == SegmentName.parse(name.ipc_name)
    assert str(name).startswith("shardsink.c-1_x.")
    assert SegmentName.fresh("c-1_x").n > name.n
    assert creator_alive(name)
    for bad in ("shardsink.c.0.1.2", "shardsink.c.1.2", "shardsink.c.1.2.3.4", "other.c.1.2.3"):
        with pytest.raises(ValueError, match="not a shardsink segment name"):
            SegmentName.parse(bad)


def test_sweep_removes_only_dead_creators(cluster, fake):
    me, start = os.getpid(), process_start(os.getpid())
    recycled = fake(f"shardsink.{cluster}.{me}.{start + 1}.0")  # same pid, another process
    gone = fake(f"shardsink.{cluster}.4194999.{start}.0")  # above any pid_max
    other = unique_cluster()
    elsewhere = fake(f"shardsink.{other}.4194999.1.0")
    foreign = fake(f"shardsink-{cluster}-not-ours")
    with Arena(cluster) as arena:
        live = arena.try_write(make_part(0, 10)).segment

        assert sorted(sweep(cluster, dry_run=True)) == sorted([recycled, gone])
        assert len(list_segments(cluster)) == 3
        assert sorted(sweep(cluster)) == sorted([recycled, gone])
        assert [str(name) for name in list_segments(cluster)] == [live]
        assert sweep(cluster) == []

        assert sweep(other) == [elsewhere]
        assert os.path.exists(f"/dev/shm/{foreign}")

        assert unlink_cluster(cluster, dry_run=True) == [live]
        assert unlink_cluster(cluster) == [live]
        assert list_segments(cluster) == []


def test_cli_sweep(cluster, fake, capsys):
    dead = fake(f"shardsink.{cluster}.4194999.1.0")
    assert main(["shm", "sweep", "--cluster", cluster, "--dry-run"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"would remove {dead}",
        "would remove 1 segment(s)",
    ]
    assert list_segments(cluster)
    assert main(["shm", "sweep", "--cluster", cluster]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "removed 1 segment(s)"
    assert list_segments(cluster) == []
    assert main(["shm", "sweep", "--cluster", "bad.id"]) == 2
    assert "invalid cluster id 'bad.id'" in capsys.readouterr().err
