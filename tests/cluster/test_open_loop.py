"""Open-loop load (``rate``): intervals due on a schedule whatever happened
before, latency counted from when each was due, the backlog tracked, and a
run that cannot keep up says so; every latency in one HdrHistogram."""

from __future__ import annotations

from shardsink._histograms import Latencies
from tests.helpers.cluster import run_cluster


def test_a_rate_the_cluster_keeps_is_kept_and_never_exceeded(tmp_path):
    """Open loop never runs ahead of its schedule: 8 intervals at 4 a
    second take at least 2 s, whatever the machine."""
    run = run_cluster(tmp_path / "d", 8, groups=1, workers=2, rate=4.0, rows_per_interval=40)
    stats = run.stats
    assert stats.verified is True, stats.verify_detail
    assert stats.target_rate == 4.0 and stats.achieved_rate <= 4.0 * 1.02
    assert stats.wall_s >= 8 / 4.0 - 0.01
    assert stats.append_latency_ms.count == 8


def test_a_rate_past_saturation_builds_a_backlog_and_says_so(tmp_path):
    """At 1,000 intervals a second no cluster keeps up (an append is a few
    ms here at best): the backlog grows, the run says it fell behind, and
    the last intervals' latency counts the time they waited (from when
    they were due), so it exceeds the closed-loop time of an append."""
    intervals = 30
    run = run_cluster(tmp_path / "d", intervals, groups=1, workers=2, rate=1000.0)
    stats = run.stats
    assert stats.verified is True, stats.verify_detail
    assert stats.fell_behind and stats.achieved_rate < 1000
    assert stats.max_backlog >= 10
    due_last_s = intervals / 1000
    waited_ms = (stats.wall_s - due_last_s) * 1000
    assert stats.append_latency_ms.max >= 0.9 * waited_ms  # the last one waited all along
    assert [r.backlog for r in run.records][-1] == 0  # nothing due after the last interval
    assert max(r.backlog for r in run.records) == stats.max_backlog


def test_distributions_merge_as_histograms_not_as_percentiles():
    fast, slow = Latencies(), Latencies()
    for ms in range(1, 101):
        fast.record(ms / 10)
    for _ in range(100):
        slow.record(1000.0)
    both = Latencies()
    both.add(fast)
    both.add(slow)
    merged = both.distribution()
    assert merged.count == 200 and merged.max >= 999
    assert 9.9 <= merged.p50 <= 10.1  # the 100th value of 200, not an average of p50s (505)
    again = Latencies.decoded(both.encoded()).distribution()
    assert again == merged


def test_a_series_widens_its_windows_and_keeps_every_append():
    from shardsink._histograms import MAX_WINDOWS, Series

    series = Series()
    for i in range(2 * MAX_WINDOWS):  # one append a second, for twice the windows kept
        series.add(float(i), latency_ms=1.0 + i % 7, backlog=i % 3)
    windows = series.windows()
    assert series.window_s == 10.0 and len(windows) == 2 * MAX_WINDOWS // 10
    assert sum(w.appends for w in windows) == 2 * MAX_WINDOWS
    assert all(w.rate == 1.0 and w.backlog == 2 for w in windows)


def test_listen_times_every_interval_from_its_mint_to_a_reader_seeing_it(tmp_path):
    """End to end: every interval appended is seen by the listening reader,
    never before it was durably appended (so never under the append's own
    latency, which pace max counts from the same mint)."""
    run = run_cluster(tmp_path / "d", 12, groups=1, workers=2, listen=True)
    stats = run.stats
    assert stats.verified is True, stats.verify_detail
    visible = stats.visible_latency_ms
    assert visible.count == 12
    assert visible.p50 >= stats.append_latency_ms.p50 * 0.99
    assert visible.max >= stats.append_latency_ms.max * 0.99
