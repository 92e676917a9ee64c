"""SIGKILL at the worst moments: whatever dies, the data a builder holds stays
intact and ``sweep()`` leaves nothing of the dead in /dev/shm (criterion 3)."""

from __future__ import annotations

import os
import select
from pathlib import Path

from shardsink.shm import Arena, PartReceiver, list_segments, sweep
from tests.helpers.shm import Child, make_part, part_number, shm_ranges


def _of(pid: int) -> list[str]:
    return [str(name) for name in list_segments() if name.pid == pid]


def test_writer_killed_with_parts_outstanding(cluster, endpoint):
    with PartReceiver(endpoint, cluster) as receiver, Arena(cluster) as mine:
        survivor = mine.try_write(make_part(42, 10))  # a live creator's segment
        with Child("writer", endpoint, cluster, "5", "2000", "--then", "hold") as writer:
            held = [receiver.recv(20) for _ in range(5)]
            segments = writer.expect("done")["segments"]
            assert segments and sorted(segments) == _of(writer.pid)
            writer.kill()
            assert sorted(segments) == _of(writer.pid)  # nobody cleaned up yet

            removed = sweep()  # every cluster's dead, as `shardsink shm sweep` does
            assert set(segments) <= set(removed)
            assert _of(writer.pid) == []
            assert not any(f".{writer.pid}." in p.name for p in Path("/dev/shm").iterdir())
        # the builder still reads what it holds: unlinked, but mapped
        assert [part_number(part.batch) for part in held] == list(range(5))
        assert [str(name) for name in list_segments(cluster)] == [survivor.segment]


def test_reader_killed_while_holding_mappings(cluster, endpoint):
    """The builder dies holding mappings: the writer's wait times out naming
    it, and once the writer dies too, sweep() leaves nothing of either."""
    with Child("reader", endpoint, cluster, "3") as reader:
        reader.expect("ready")
        with Child(
            "writer", endpoint, cluster, "20", "500",
            "--segment", str(64 << 10), "--capacity", str(256 << 10),
            "--timeout", "1", "--then", "hold",
        ) as writer:  # fmt: skip
            holding = reader.expect("holding")
            assert holding["parts"] == [0, 1, 2]
            assert all(shm_ranges(reader.pid, segment) for segment in holding["mapped"])
            reader.kill()

            error = writer.expect("error")
            assert error["type"] == "TransportTimeout"
            assert f"builder at {endpoint} did not acknowledge" in error["message"]
            assert sorted(error["segments"]) == _of(writer.pid)
            writer.kill()

            assert sorted(sweep(cluster)) == sorted(error["segments"])
            assert _of(writer.pid) == [] and _of(reader.pid) == []
            assert list_segments(cluster) == []


def test_a_zombie_creator_counts_as_dead(cluster):
    with Child("leak", cluster) as child:
        segments = child.expect("leaked")["segments"]
        pidfd = os.pidfd_open(child.pid)  # readable once it exits, reaped or not
        try:
            assert select.select([pidfd], [], [], 10)[0], "the child did not exit in 10 s"
        finally:
            os.close(pidfd)
        assert Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
        assert sweep(cluster) == segments  # before it is reaped
    assert list_segments(cluster) == []
