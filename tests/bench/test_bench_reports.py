"""What ``bench cluster``'s peers and saturation matrices run, in which
order, and what their reports and plots say: the answer first."""

from __future__ import annotations

import pytest

from shardsink._histograms import Latencies
from shardsink.bench.cluster import (
    RunSpec,
    matrix,
    peer_matrix as PM,
    rates,
    run,
    saturation,
    write_report,
)


@pytest.fixture
def plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _hdr(ms: list[float]) -> tuple[str, dict]:
    hist = Latencies()
    for value in ms:
        hist.record(value)
    d = hist.distribution()
    return hist.encoded(), {"count": d.count, "p50": d.p50, "p99": d.p99, "p99.9": d.p99_9,
                            "max": d.max}  # fmt: skip


def _peer_row(mode: str, repeat: int, rows_per_s: float, ms: float, **extra) -> dict:
    hdr, dist = _hdr([ms] * 20)
    return {
        "section": "peers", "mode": mode, "groups": 4, "workers": 8, "rows_per_interval": 128,
        "repeat": repeat, "verified": True, "rows_per_s": rows_per_s, "appends": 20,
        "blob_puts": 20, "diff_bytes_per_append": 1000.0, "cas_per_append": 1.0,
        "append_latency_hdr": hdr, "append_latency_ms": dist, "workload": "trickle",
        "data_parts_per_append": 0.0, "inline_parts_per_append": 4.0, **extra,
    }  # fmt: skip


def test_the_peers_matrix_puts_shardsink_beside_every_peer_interleaved() -> None:
    specs = matrix("peers")
    assert {(s.groups, s.workers, s.rows_per_interval) for s in specs} == set(PM.SHAPES)
    modes = {"best-effort", "barrier", *PM.PEERS}
    assert {s.mode for s in specs} == modes and len(specs) == 2 * len(modes) * PM.REPEATS
    assert [s.repeat for s in specs] == sorted(s.repeat for s in specs)


def test_the_peers_report_leads_with_the_ratio_to_the_strongest_peer(tmp_path, plt) -> None:
    peer = {"commit_retries": 3, "commit_failures": 0, "orphan_files": 1}
    rows = []
    for repeat, scale in enumerate((1.0, 1.2)):
        rows += [
            _peer_row("barrier", repeat, 30_000 * scale, 40.0, abandoned_attempts=0),
            _peer_row("delta-coalesced", repeat, 10_000 * scale, 50.0, **peer),
            _peer_row("iceberg-coalesced", repeat, 5_000 * scale, 80.0, **peer),
            _peer_row("delta-per-worker", repeat, 12_000, 200.0, **peer),
        ]
    rows.append(_peer_row("iceberg-per-worker", 0, 1.0, 9000.0, **peer, verified=False))
    (line,) = PM.headline(rows)
    assert line.startswith("- 4x8 R=128: shardsink barrier 33,000 rows/s: ")
    # delta-per-worker's median (12,000) beats delta-coalesced's (11,000): it is the strongest;
    # per repeat 30,000/12,000 and 36,000/12,000
    strongest = "2.75x delta-per-worker (12,000 rows/s, the strongest peer; per repeat 2.50-3.00x)"
    assert strongest in line
    assert "3.00x delta-coalesced (11,000 rows/s; per repeat 3.00-3.00x)" in line
    assert (
        "6.00x iceberg-coalesced" in line
        and "p99.9 40.0 ms against 200.1 ms delta-per-worker, 50.0 ms" in line
    )
    table = "\n".join(PM.report_lines(rows))
    assert "| 4x8 R=128 | shardsink barrier | 2/2 | 33,000 (30,000-36,000) |" in table
    assert "| 4x8 R=128 | delta-coalesced | 2/2 | 11,000 (10,000-12,000) | 50.0 | 50.0 " in table
    assert "| 1.00 | 1,000 | 1.00 | 6 | 0 | 2 |" in table  # retries, failures, orphans summed
    assert "| iceberg-per-worker | 0/1 | - |" in table  # a run that did not verify shows
    (png,) = PM.plot(plt, rows, tmp_path, "caption")
    assert png.name == "peers.png" and png.stat().st_size > 10_000
    text = write_report(rows, tmp_path, "shardsink bench cluster --matrix peers", 1.0).read_text()
    assert text.index("## Answer") < text.index("## Checks") < text.index("## peers")


def test_the_saturation_matrix_runs_its_open_loop_after_its_closed_loop() -> None:
    specs = matrix("saturation")
    assert len(specs) == 2 * saturation.REPEATS
    for repeat in range(saturation.REPEATS):
        closed, opened = [s for s in specs if s.repeat == repeat]
        assert (closed.saturate, opened.saturate) == (0.0, saturation.FACTOR)
        assert closed.order + 1 == opened.order and closed.rate is opened.rate is None
    base = {"section": "saturation", "mode": closed.mode, "groups": closed.groups,
            "workers": closed.workers, "rows_per_interval": closed.rows_per_interval}  # fmt: skip
    done = [{**base, "repeat": repeat, "saturate": 0.0, "verified": True,
             "achieved_rate": 40.0 + repeat} for repeat in range(saturation.REPEATS)]  # fmt: skip
    assert saturation.resolved(opened, done).rate == saturation.FACTOR * done[-1]["achieved_rate"]
    assert saturation.resolved(closed, done) is closed
    done[-1]["verified"] = False
    with pytest.raises(ValueError, match="the closed-loop run this open-loop run follows"):
        saturation.resolved(opened, done)


def test_a_tiny_saturation_run_opens_its_loop_at_twice_the_closed_rate(tmp_path, plt) -> None:
    shape = {"section": "saturation", "mode": "barrier", "groups": 1, "workers": 2,
             "workload": "trickle", "rows_per_interval": 16, "intervals": 12}  # fmt: skip
    specs = [RunSpec(**shape), RunSpec(**shape, saturate=2.0)]
    rows = run(specs, tmp_path, "shardsink bench cluster --matrix tiny")
    closed, opened = rows
    assert closed["verified"] and opened["verified"], [r.get("error") for r in rows]
    assert opened["target_rate"] == pytest.approx(2.0 * closed["achieved_rate"])
    assert closed["target_rate"] is None and opened["append_latency_ms"]["count"] == 12
    (line,) = saturation.headline(rows)
    assert "closed loop (pace max)" in line and "open loop at 2x that" in line
    assert (tmp_path / "saturation.png").stat().st_size > 10_000
    report = (tmp_path / "report.md").read_text()
    assert "Past saturation:" in report and "| 0 | open, 2x |" in report


def _rate_row(mode: str, target: float, repeat: int, backlog: list[int]) -> dict:
    hdr, dist = _hdr([10.0] * len(backlog))
    windows = [{"t_s": float(k), "appends": 5, "rate": 5.0, "backlog": b, "p99_ms": 10.0 + b}
               for k, b in enumerate(backlog)]  # fmt: skip
    return {
        "section": "rate", "mode": mode, "groups": 1, "workers": 8, "rows_per_interval": 1000,
        "verified": True, "target_rate": target, "achieved_rate": 5.0, "repeat": repeat,
        "fell_behind": bool(backlog[-1]), "append_latency_hdr": hdr, "append_latency_ms": dist,
        "series_window_s": 1.0, "series": windows,
    }  # fmt: skip


def test_the_rate_matrix_draws_every_open_loop_run_over_time(tmp_path, plt) -> None:
    rows = [
        _rate_row(mode, target, repeat, [0, 0, 0] if target < 10 else [0, 4, 9])
        for mode in ("off", "barrier")
        for target in (5.0, 20.0)
        for repeat in (0, 1)
    ]
    rows.append({**rows[0], "verified": False})  # not drawn
    (png,) = rates.series_plot(plt, rows, tmp_path, "caption")
    assert png.name == "series-1x8.png" and png.stat().st_size > 20_000
