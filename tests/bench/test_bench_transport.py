"""``shardsink bench transport``: every reader reads every byte it is given,
and end to end at a small scale, the JSON shape and the table. Speed is the
benchmark's to report, not this test's."""

from __future__ import annotations

import json
import pickle

import pyarrow as pa
import pytest

from shardsink.bench import transport
from shardsink.cli.bench_tables import transport_tables
from shardsink.shm import decode_part, list_segments
from shardsink.shm.arena import write_stream


def test_reading_a_batch_reads_every_byte_wherever_it_lives() -> None:
    batch = transport.make_batch(600)
    sent = transport.read_batch(batch)
    assert sent.nbytes == sum(b.size for c in batch.columns for b in c.buffers() if b) > 600
    sink = pa.BufferOutputStream()
    write_stream(sink, batch)
    ipc = sink.getvalue()
    in_place = decode_part(ipc, "test")  # zero-copy: the buffers are views of ipc
    view = in_place.column(1).buffers()[2]
    assert ipc.address <= view.address < view.address + view.size <= ipc.address + ipc.size
    assert transport.read_batch(in_place) == sent
    assert transport.read_batch(pickle.loads(pickle.dumps(batch))) == sent
    assert transport.read_buffer(ipc).nbytes == ipc.size
    buffers = [b for c in batch.columns for b in c.buffers() if b is not None]
    assert sent.checksum == sum(transport.read_buffer(b).checksum for b in buffers) % 2**64


def test_a_change_of_any_byte_is_read() -> None:
    data = bytes(range(7, 28))  # three words and a tail of five bytes
    read = transport.read_buffer(data)
    assert read.nbytes == 21
    for at in range(len(data)):
        changed = bytearray(data)
        changed[at] ^= 0x80
        assert transport.read_buffer(changed).checksum != read.checksum, at


TRANSPORTS = ["shm", "zmq", "queue", "inline", "shm_only"]


@pytest.mark.slow
def test_bench_transport_writes_json_and_a_table(tmp_path, capsys):
    from rich.console import Console

    result = transport.run(
        tmp_path, inline_sweep=True, sizes=(4 << 10, 256 << 10), sweep_sizes=(1 << 10,), reps=2
    )
    # side by side: every pair once a round, each round in its own recorded order
    assert len(result["order"]) == 2
    assert [sorted(o) for o in result["order"]] == [sorted(TRANSPORTS)] * 2
    Console().print(*transport_tables(result))
    assert json.loads((tmp_path / "transport.json").read_text()) == result
    assert [row["size"] for row in result["parts"]] == [4 << 10, 256 << 10]
    for row in result["parts"]:
        for key in ("shm_gbps", "zmq_gbps", "queue_gbps", "memcpy_gbps", "memcpy_cached_gbps"):
            assert row[key] > 0
        for column, (low, high) in row["gbps_range"].items():
            assert low <= row[f"{column}_gbps"] <= high
        # every reader read every byte of every part: the same work in every column
        read = row["bytes_read"]
        assert read["shm"] == read["zmq"] == read["queue"] >= row["batch_bytes"]
        assert read["memcpy"] == read["memcpy_cached"] > read["shm"]  # + the IPC framing
    assert [row["size"] for row in result["inline_sweep"]] == [1 << 10]
    out = capsys.readouterr().out
    assert "256 KiB" in out and "inline vs shm" in out
    assert not [name for name in list_segments() if name.cluster.startswith("bench")]
