"""``shardsink bench startup`` in miniature: every figure is there, every
cluster verified, and forked workers share their libraries' pages."""

from __future__ import annotations

import json

from shardsink.bench import startup


def test_bench_startup_reports_fork_and_spawn_side_by_side(tmp_path):
    result = startup.run(tmp_path, shapes=((1, 2),), repeats=1, restart_count=1)
    assert result["verified"] is True
    assert [sorted(o) for o in result["order"]] == [["fork", "spawn"]]  # the order it ran
    written = json.loads((tmp_path / "startup.json").read_text())
    assert written["median"] == result["median"]
    for start in ("fork", "spawn"):
        assert len(result["samples"]["cold_start_s"][start]["1x2"]) == 1
        assert len(result["samples"]["restart_s"][start]) == 1  # the one kill, one restart
        assert result["median"]["workers_pss_bytes"][start] > 0
    # a count, not a time: forked workers share pages that spawned ones each own
    assert result["fork_over_spawn"]["workers_pss_bytes"] < 0.8
