"""``shardsink bench transport`` end to end at a small scale: the JSON shape and
the table. Speed is the benchmark's to report, not this test's."""

from __future__ import annotations

import json

import pytest

from shardsink.bench import transport
from shardsink.shm import list_segments


@pytest.mark.slow
def test_bench_transport_writes_json_and_a_table(tmp_path, capsys):
    result = transport.run(
        tmp_path, inline_sweep=True, sizes=(4 << 10, 256 << 10), sweep_sizes=(1 << 10,), reps=1
    )
    transport.print_table(result)
    assert json.loads((tmp_path / "transport.json").read_text()) == result
    assert [row["size"] for row in result["parts"]] == [4 << 10, 256 << 10]
    for row in result["parts"]:
        for key in ("shm_gbps", "zmq_gbps", "queue_gbps", "memcpy_gbps", "memcpy_cached_gbps"):
            assert row[key] > 0
    assert [row["size"] for row in result["inline_sweep"]] == [1 << 10]
    out = capsys.readouterr().out
    assert "256 KiB" in out and "inline vs shm" in out
    assert not [name for name in list_segments() if name.cluster.startswith("bench")]
