"""The worker-to-builder link: parts across processes, zero-copy, in order,
bounded by the arena; and every protocol failure a clear error."""

from __future__ import annotations

import logging
import os

import msgspec
import pyarrow as pa
import pytest
import zmq

from shardsink.shm import (
    PartReceiver,
    PartRef,
    PartSender,
    SchemaMismatch,
    TransportError,
    TransportTimeout,
    UnknownSegment,
    list_segments,
)
from shardsink.shm.arena import write_stream
from shardsink.shm.messages import Error, MessagePart, Part, decode_to_worker, encode
from tests.helpers.shm import Child, make_part, part_number, shm_ranges


def test_parts_arrive_intact_and_in_order(cluster, endpoint):
    """Inline, arena and oversize parts from a worker process, in order, intact,
    with their metadata; once acknowledged and closed nothing is left."""
    count = 12
    with PartReceiver(endpoint, cluster) as receiver:
        with Child(
            "writer", endpoint, cluster, str(count), "10,2000,30000", "--inline", "32768"
        ) as w:
            for i in range(count):
                part = receiver.recv(20)
                assert part is not None
                assert (part.seq, part.meta, part_number(part.batch)) == (i, {"part": i}, i)
                assert (part.ref is None) == (i % 3 == 0)  # 10 rows travel inline
                receiver.ack(part)
            w.expect("acked")
            assert w.wait() == 0
        assert list_segments(cluster) == []
        assert receiver.recv(0.5) is None  # handles the writer's Retire
        assert receiver.reader.mapped == []


def test_zero_copy_across_processes(cluster, endpoint):
    """The builder's batch buffers lie inside its mapping of the writer's
    segment: /dev/shm/<segment> in both processes' maps (criterion 1)."""
    with (
        PartReceiver(endpoint, cluster) as receiver,
        Child("writer", endpoint, cluster, "1", "20000", "--segment", str(2 << 20)) as writer,
    ):
        part = receiver.recv(20)
        assert part is not None and part.ref is not None
        mapping = receiver.reader.mapping(part.ref.segment)
        lo, hi = mapping.address, mapping.address + mapping.size
        assert any(a <= lo and hi <= b for a, b in shm_ranges("self", part.ref.segment))
        assert shm_ranges(writer.pid, part.ref.segment)  # the same segment, in the writer
        buffers = [b for col in part.batch.columns for b in col.buffers() if b is not None]
        assert sum(b.size for b in buffers) >= 20000 * 60
        for buf in buffers:
            assert lo <= buf.address and buf.address + buf.size <= hi
        assert part_number(part.batch) == 0
        receiver.ack(part)
        writer.expect("acked")
        assert writer.wait() == 0  # its close unlinks the segment; a kill now would leave it
    assert list_segments(cluster) == []


def test_a_full_arena_blocks_the_writer_until_acknowledged(cluster, endpoint):
    """With no acknowledgements the writer stops at the arena's bound, resumes
    as parts are acknowledged, and every part arrives intact and in order
    (criterion 4)."""
    count, per_arena = 30, 8  # ~30 KB parts, two per 64 KiB segment, four segments
    args = ("--segment", str(64 << 10), "--capacity", str(256 << 10))
    with (
        PartReceiver(endpoint, cluster) as receiver,
        Child("writer", endpoint, cluster, str(count), "500", *args) as writer,
    ):
        held, numbers = [], []  # a part is checked before it is acknowledged, not after
        part = receiver.recv(20)  # the child starts up
        while part is not None:
            held.append(part)
            numbers.append(part_number(part.batch))
            part = receiver.recv(1.0)
        assert len(held) == per_arena
        sent = writer.events(0.5)
        assert [e["seq"] for e in sent if e["event"] == "sent"] == list(range(per_arena))
        assert sent[-1]["outstanding"] == per_arena
        assert writer.events(0.5) == []  # still blocked

        receiver.ack(held[0])  # frees one slot: exactly one more part comes
        part = receiver.recv(5)
        assert part is not None and part.seq == per_arena
        assert receiver.recv(0.5) is None
        held.append(part)
        numbers.append(part_number(part.batch))

        receiver.ack(*held[1:])
        while len(held) < count:
            part = receiver.recv(10)
            assert part is not None
            held.append(part)
            numbers.append(part_number(part.batch))
            receiver.ack(part)
        assert [p.seq for p in held] == list(range(count))
        assert numbers == list(range(count))
        writer.expect("acked")
        assert writer.wait() == 0


def test_the_stalled_builder_is_named_on_timeout(cluster, endpoint):
    with (
        PartReceiver(endpoint, cluster) as receiver,
        PartSender(
            endpoint,
            cluster,
            segment_size=64 << 10,
            capacity=128 << 10,
            message_part_max_bytes=-1,
            timeout=0.3,
        ) as sender,
    ):
        with pytest.raises(TransportTimeout, match=f"builder at {endpoint} did not acknowledge"):
            for i in range(10):
                sender.send(make_part(i, 500))
        assert sender.arena.outstanding == 4
        parts = [receiver.recv(2) for _ in range(4)]
        receiver.ack(*parts)
        sender.wait_acked(5)  # recovers once the builder acknowledges
        sender.send(make_part(99, 500))


def _raw(endpoint: str):
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 5000)
    sock.connect(endpoint)
    return ctx, sock


def _inline(seq: int, batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    write_stream(sink, batch)
    return encode(MessagePart(seq, sink.getvalue().to_pybytes()))


def test_malformed_messages_are_rejected_not_fatal(cluster, endpoint, caplog):
    caplog.set_level(logging.WARNING, logger="shardsink.shm.link")
    with PartReceiver(endpoint, cluster) as receiver:
        ctx, sock = _raw(endpoint)
        try:
            bad = [
                [b"\x93garbage"],
                [msgspec.msgpack.encode({"t": "part", "seq": "0"})],
                [msgspec.msgpack.encode({"t": "inline", "seq": 0, "data": b"", "x": 1})],
                [msgspec.msgpack.encode({"t": "pickle", "seq": 0})],
                [b"a", b"b"],
            ]
            for frames in bad:
                sock.send_multipart(frames)
                assert receiver.recv(0.3) is None
                reply = decode_to_worker(sock.recv())
                assert isinstance(reply, Error) and reply.seq is None
            assert len(caplog.records) == len(bad)
            sock.send(_inline(0, make_part(7, 5)))
            part = receiver.recv(5)
            assert part is not None and part.ref is None and part_number(part.batch) == 7
        finally:
            sock.close()
            ctx.term()


def test_an_unreadable_part_raises_and_the_worker_is_told(cluster, endpoint):
    with PartReceiver(endpoint, cluster) as receiver:
        ctx, sock = _raw(endpoint)
        try:
            missing = f"shardsink.{cluster}.{os.getpid()}.1.99999"
            sock.send(encode(Part(0, PartRef(missing, 0, 128, 0))))
            with pytest.raises(UnknownSegment, match=missing):
                receiver.recv(5)
            reply = decode_to_worker(sock.recv())
            assert reply.seq == 0 and missing in reply.reason
        finally:
            sock.close()
            ctx.term()


def test_a_gap_in_the_sequence_is_an_error(cluster, endpoint):
    with PartReceiver(endpoint, cluster) as receiver:
        ctx, sock = _raw(endpoint)
        try:
            sock.send(_inline(0, make_part(0, 5)))
            assert receiver.recv(5).seq == 0
            sock.send(_inline(2, make_part(2, 5)))
            with pytest.raises(TransportError, match=r"message 2 from \w+ \w+ arrived when 1"):
                receiver.recv(5)
        finally:
            sock.close()
            ctx.term()


def test_the_sender_raises_the_builders_rejection(cluster, endpoint):
    other = pa.schema([("key", pa.int32())])
    with (
        PartReceiver(endpoint, cluster, schema=other) as receiver,
        PartSender(endpoint, cluster, message_part_max_bytes=-1, timeout=5) as sender,
    ):
        sender.send(make_part(0, 100))
        with pytest.raises(SchemaMismatch):
            receiver.recv(5)
        with pytest.raises(TransportError, match=f"builder at {endpoint} rejected message 0"):
            sender.wait_acked()
        with pytest.raises(TransportError):  # and keeps failing
            sender.send(make_part(1, 100))


def test_retired_segments_are_unmapped_by_the_builder(cluster, endpoint):
    with PartReceiver(endpoint, cluster) as receiver:
        sender = PartSender(
            endpoint, cluster, segment_size=64 << 10, capacity=128 << 10, message_part_max_bytes=-1
        )
        with sender:
            for rows in (500, 500, 3000):  # the big part displaces the idle small segment
                sender.send(make_part(0, rows))
                part = receiver.recv(5)
                receiver.ack(part)
                sender.wait_acked()
            assert receiver.recv(0.3) is None
            assert receiver.reader.mapped == sender.arena.segments
        sender.close()  # idempotent
        assert receiver.recv(0.3) is None
        assert receiver.reader.mapped == []
        with pytest.raises(ValueError, match="closed"):
            sender.send(make_part(0, 1))
    receiver.close()
    with pytest.raises(ValueError, match="closed"):
        receiver.recv(0)


def test_channel_ends_apply_the_address_policy(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    with pytest.raises(ValueError, match="mode 0700"):
        PartReceiver(f"ipc://{shared}/s", "c")
    with pytest.raises(ValueError, match="mode 0700"):
        PartSender(f"ipc://{shared}/s", "c")
    for tcp in ("tcp://0.0.0.0:5555", "tcp://127.0.0.1:*"):
        with pytest.raises(ValueError, match="ipc:// endpoints only"):
            PartReceiver(tcp, "c")
        with pytest.raises(ValueError, match="ipc:// endpoints only"):
            PartSender(tcp, "c")
