"""The builder trusts the socket, not the message: a part whose metadata
claims another worker than the one its ZeroMQ routing id names is refused."""

from __future__ import annotations

import logging
import uuid

from shardsink import protocol
from shardsink.builder.group import GroupBuilder
from shardsink.shm import Received
from shardsink.storage.memory import MemoryBlob
from tests.helpers.cluster import WRITER, BuilderHarness, rows_batch


def _part(sender: bytes, claimed: int, keys: list[int]) -> Received:
    meta = protocol.Contribute(
        0, 0, 0, 1000, barrier=0, worker=claimed, rows=len(keys), last=1, writer=WRITER
    )
    return Received(sender, 0, rows_batch(keys, 0), protocol.contribute_meta(meta), None)


def test_a_part_claiming_another_worker_fails_the_sender_naming_both(caplog):
    acked: list[Received] = []
    group = GroupBuilder(
        0,
        2,
        MemoryBlob(uuid.uuid4().hex),
        "s",
        inline_max_bytes=4096,
        target_bytes=1 << 30,
        ack=lambda *parts: acked.extend(parts),
    )
    forged = _part(protocol.worker_identity(1), 0, [7])
    assert group.take(forged) == ((0, 0), 1)  # the sender's finish, not worker 0's
    answer = group.finish((0, 0), 1)
    assert answer.shared is None
    assert answer.error == "a part from sender 'w1' says it is worker 0's; refused"
    stranger = _part(b"\x00\x12\x34\x56\x78", 0, [8])
    with caplog.at_level(logging.WARNING):
        assert group.take(stranger) is None
    assert "says it is worker 0's; refused" in caplog.text
    assert acked == [forged, stranger]
    # worker 0 itself was never touched: its own part is the whole batch
    own = _part(protocol.worker_identity(0), 0, [0])
    assert group.take(own) == ((0, 0), 0)
    shared = group.finish((0, 0), 0).shared
    assert shared is not None and shared.contributors == {0: 1} and shared.batch.rows == 1


def test_a_worker_process_cannot_contribute_in_another_workers_name():
    with BuilderHarness(2, mode="best-effort") as h:
        a, b = h.workers
        meta = protocol.Contribute(
            0, 0, 0, 1000, barrier=0, worker=a.index, rows=1, last=1, writer=WRITER
        )
        b.sender.send(rows_batch([1], 0), protocol.contribute_meta(meta))
        refused = b.answer()
        assert refused.shared is None
        assert refused.error == "a part from sender 'w1' says it is worker 0's; refused"
        a.send((0, 0), rows_batch([0, 2], 0), last=True)
        shared = a.answer().shared
        assert shared is not None and shared.contributors == {0: 2}
