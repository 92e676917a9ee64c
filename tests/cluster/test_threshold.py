"""The sharing threshold: fixed, or ``auto`` tuned from builder lag against the
workers' own write time. The rule is pure, so it runs here against a model of
a group without any process."""

from __future__ import annotations

import pytest

from shardsink import protocol
from shardsink.coordinator.threshold import (
    LAG_FLOOR_S,
    MAX_BYTES,
    MIN_BYTES,
    START_BYTES,
    Auto,
    Fixed,
    Observation,
    observe,
    of,
)
from shardsink.persist.state import Batch, BlobPart

MIB = 1 << 20


def test_a_fixed_threshold_never_moves() -> None:
    fixed = of(2 * MIB)
    assert fixed == Fixed(2 * MIB)
    assert fixed.after(Observation(lag_s=5.0, shared_bytes=MIB)).bytes == 2 * MIB
    assert of("auto") == Auto(bytes=START_BYTES)


def test_a_lagging_builder_sends_the_writes_it_shared_down_their_own_path() -> None:
    slow = Observation(lag_s=0.2, shared_bytes=600 << 10)
    lowered = Auto().after(slow)
    assert (lowered.bytes, lowered.ceiling) == (300 << 10, 600 << 10)
    # those writes are now their own: 20 ms each is not cheap, so nothing moves
    own = Observation(own_s=0.02, own_max_s=0.02)
    assert lowered.after(own) == Auto(bytes=300 << 10, ceiling=600 << 10, own_s=0.02)


def test_a_lag_below_the_floor_or_within_twice_the_own_writes_is_kept() -> None:
    auto = Auto(own_s=0.1)
    assert auto.after(Observation(lag_s=LAG_FLOOR_S * 0.9, shared_bytes=MIB)).bytes == START_BYTES
    assert auto.after(Observation(lag_s=0.19, shared_bytes=MIB)).bytes == START_BYTES
    assert auto.after(Observation(lag_s=0.21, shared_bytes=MIB)).bytes == MIB // 2


def test_cheap_own_writes_raise_it_but_never_back_to_a_size_found_too_slow() -> None:
    cheap = Observation(own_s=0.002, own_max_s=0.003)
    assert Auto().after(cheap).bytes == 2 * MIB
    capped = Auto(bytes=MIB, ceiling=4 * MIB)
    assert capped.after(cheap).bytes == 2 * MIB
    assert capped.after(cheap).after(cheap).bytes == 2 * MIB
    assert Auto(bytes=MAX_BYTES).after(cheap).bytes == MAX_BYTES
    assert Auto(bytes=MIN_BYTES).after(Observation(lag_s=1.0, shared_bytes=1000)).bytes == (
        MIN_BYTES
    )


class Group:
    """A model group: ``workers`` workers each staging ``staged`` bytes per
    interval; a write costs ``fixed_s`` plus its bytes at ``bytes_per_s``,
    the builder writing all that was shared one after the other."""

    def __init__(self, workers: int, staged: int, fixed_s: float, bytes_per_s: float) -> None:
        self.workers, self.staged = workers, staged
        self.fixed_s, self.bytes_per_s = fixed_s, bytes_per_s

    def interval(self, threshold: int) -> Observation:
        write_s = self.fixed_s + self.staged / self.bytes_per_s
        if self.staged <= threshold:
            lag = self.fixed_s + self.workers * self.staged / self.bytes_per_s
            return Observation(lag_s=lag, shared_bytes=self.staged)
        return Observation(own_s=write_s, own_max_s=write_s)


@pytest.mark.parametrize(
    ("group", "shares"),
    [
        # 1x8 small writes (125 rows of ~60 bytes): the builder keeps up, all coalesce
        (Group(8, 7_500, 0.004, 300e6), True),
        # 1x32 of 600 KiB: the builder writes ~19 MiB alone, far slower than in parallel
        (Group(32, 600 << 10, 0.004, 300e6), False),
        # 1x8 of 1.5 MiB, cheap to write apart: it climbs once, finds the builder
        # too slow for eight of them, and settles below
        (Group(8, 3 << 19, 0.001, 300e6), False),
        # 1x4 of 1.5 MiB with a fast builder: it climbs, and sharing stays
        (Group(4, 3 << 19, 0.001, 20e9), True),
    ],
    ids=["small-writes", "builder-bound", "probe-and-back", "climbs"],
)
def test_auto_settles_within_a_few_intervals_and_stays(group: Group, shares: bool) -> None:
    threshold, seen = Auto(), []
    for _ in range(30):
        seen.append(threshold.bytes)
        threshold = threshold.after(group.interval(threshold.bytes))
    settled = (
        max(i for i in range(len(seen)) if seen[i] != seen[-1]) + 1 if len(set(seen)) > 1 else 0
    )
    assert settled <= 4, seen
    assert (group.staged <= seen[-1]) == shares, seen


def _report(worker: int, staged: int, **kw) -> protocol.Report:
    return protocol.Report(
        interval=3, attempt=0, group=0, worker=worker, rows=1, staged_bytes=staged, **kw
    )


def test_observe_takes_lags_from_handed_off_batches_and_times_from_own_writes() -> None:
    part = BlobPart("s/part/k.parquet", 100, 1, 3000, 3000)
    batch = Batch(id="b", lower=3000, upper=4000, parts=(part,), rows=1)
    shared = protocol.SharedBatch(0, 0, batch, {0: 1, 1: 1}, 1, 100, lag_s=0.04)
    reports = [
        _report(0, 500, shared=protocol.Contribution(0, 1)),
        _report(1, 700, shared=protocol.Contribution(0, 1), received=shared),
        _report(2, 9000, own=batch, write_s=0.01),
        _report(3, 8000, own=batch, write_s=0.03),
        _report(4, 7000, own=batch, write_s=0.02),
    ]
    assert observe(reports) == Observation(lag_s=0.04, shared_bytes=700, own_s=0.02, own_max_s=0.03)
    assert observe([]) == Observation()
