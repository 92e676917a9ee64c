"""A coordinator's counters stay bounded over a long run: totals are running
sums, and only the last RECORDS_KEPT interval records are kept."""

from __future__ import annotations

from shardsink.coordinator.records import RECORDS_KEPT, Counters, IntervalRecord


def record(interval: int) -> IntervalRecord:
    return IntervalRecord(
        interval=interval,
        attempt=0,
        rows=10,
        own_batches=1,
        shared_batches={0: 1, 1: 2},
        data_parts=2,
        inline_parts=3,
        inline_bytes=100,
        blob_puts=2,
        blob_put_bytes=4000,
        diff_bytes=300,
        cas_calls=1,
        latency_ms=float(interval),
        segment_parts=0,
        shared_max_bytes=1 << 20,
    )


def test_totals_count_every_append_and_records_keep_the_last_window():
    counters = Counters()
    n = RECORDS_KEPT + 100
    for interval in range(n):
        counters.add(record(interval))
    assert len(counters.records) == RECORDS_KEPT
    assert counters.records[0].interval == 100 and counters.records[-1].interval == n - 1
    totals = counters.totals
    assert totals.appends == n and totals.rows == 10 * n and totals.cas_calls == n
    assert (totals.blob_puts, totals.blob_put_bytes) == (2 * n, 4000 * n)
    assert (totals.data_parts, totals.inline_parts, totals.inline_bytes) == (2 * n, 3 * n, 100 * n)
    assert (totals.diff_bytes, totals.own_batches, totals.shared_batches) == (300 * n, n, 3 * n)
