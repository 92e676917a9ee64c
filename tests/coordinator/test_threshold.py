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
    Probe,
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


SLOW = Observation(lag_s=0.2, shared_bytes=600 << 10)


def test_a_lag_probes_writing_apart_and_keeps_it_if_that_is_twice_as_fast() -> None:
    probing = Auto().after(SLOW)
    assert probing.bytes == 300 << 10 and probing.probe == Probe(600 << 10, 0.2, START_BYTES)
    kept = probing.after(Observation(own_s=0.08))
    assert (kept.bytes, kept.ceiling, kept.probe) == (300 << 10, 600 << 10, None)
    assert kept.after(Observation(own_s=0.08)) == kept  # settled


def test_a_probe_that_gains_too_little_goes_back_and_is_not_repeated() -> None:
    back = Auto().after(SLOW).after(Observation(own_s=0.15))
    assert (back.bytes, back.fine, back.probe) == (START_BYTES, 600 << 10, None)
    assert back.after(Observation(lag_s=0.3, shared_bytes=600 << 10)) == back
    # unless the lag doubles
    assert back.after(Observation(lag_s=0.5, shared_bytes=600 << 10)).probe is not None


def test_a_probe_with_nothing_written_apart_keeps_the_drop() -> None:
    probing = Auto().after(SLOW)
    assert probing.after(Observation()) == Auto(bytes=300 << 10)


def test_a_lag_below_the_floor_moves_nothing() -> None:
    assert Auto().after(Observation(lag_s=LAG_FLOOR_S * 0.9, shared_bytes=MIB)) == Auto()


def test_cheap_own_writes_raise_it_but_never_back_to_a_size_found_too_slow() -> None:
    cheap = Observation(own_s=0.003)
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
    interval on ``cores`` cores; a write costs ``fixed_s`` plus its bytes at
    ``bytes_per_s`` of one core; the builder writes all that was shared alone,
    the workers' own writes share the cores."""

    def __init__(self, workers: int, staged: int, fixed_s: float, bytes_per_s: float,
                 cores: int) -> None:  # fmt: skip
        self.workers, self.staged, self.cores = workers, staged, cores
        self.fixed_s, self.bytes_per_s = fixed_s, bytes_per_s

    def interval(self, threshold: int) -> Observation:
        data_s = self.workers * self.staged / self.bytes_per_s
        if self.staged <= threshold:
            return Observation(lag_s=self.fixed_s + data_s, shared_bytes=self.staged)
        own_s = self.fixed_s + data_s / min(self.workers, self.cores)
        return Observation(own_s=own_s)


@pytest.mark.parametrize(
    ("group", "shares"),
    [
        # 1x8 small writes (125 rows of ~60 bytes): the builder keeps up, all coalesce
        (Group(8, 7_500, 0.004, 300e6, cores=2), True),
        # 1x32 of 600 KiB: the builder writes ~19 MiB alone, 32 cores would write it
        # in parallel: the writes go their own way
        (Group(32, 600 << 10, 0.004, 300e6, cores=32), False),
        # the same on 2 cores: writing apart is barely faster, so they keep sharing
        (Group(32, 600 << 10, 0.004, 300e6, cores=2), True),
        # 1x8 of 1.5 MiB on 8 cores, cheap to write apart: it climbs once, finds the
        # builder too slow for eight of them, and settles below
        (Group(8, 3 << 19, 0.001, 300e6, cores=8), False),
        # 1x4 of 1.5 MiB with a fast builder: it climbs, and sharing stays
        (Group(4, 3 << 19, 0.001, 20e9, cores=4), True),
    ],
    ids=["small-writes", "builder-bound", "two-cores", "probe-and-back", "climbs"],
)
def test_auto_settles_within_a_few_intervals_and_stays(group: Group, shares: bool) -> None:
    threshold, seen = Auto(), []
    for _ in range(30):
        seen.append(threshold.bytes)
        threshold = threshold.after(group.interval(threshold.bytes))
    changes = [i for i in range(1, len(seen)) if seen[i] != seen[i - 1]]
    assert max(changes, default=0) <= 4, seen
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
    assert observe(reports) == Observation(lag_s=0.04, shared_bytes=700, own_s=0.03)
    assert observe([]) == Observation()
