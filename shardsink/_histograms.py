"""Latency distributions: HdrHistogram (PyPI ``hdrhistogram``), as the
benchmarks people trust report them (OpenMessaging Benchmark, YCSB, wrk2):
every value recorded, percentiles read off the whole distribution, merged
as histograms across processes and repeats, never as averages of
percentiles.

A :class:`Latencies` records milliseconds with three significant digits
from 1 us to one hour; :meth:`Latencies.distribution` gives the figures a
report shows (count, p50, p90, p99, p99.9, p99.99, max) and
:meth:`Latencies.encoded` the histogram itself, in HdrHistogram's
compressed base64 form (what its log format holds per line), so a user
merges and plots runs with HdrHistogram's own tools.
"""

from __future__ import annotations

import msgspec
from hdrh.histogram import HdrHistogram

#: Microseconds: the unit values are recorded in.
_LOWEST, _HIGHEST, _DIGITS = 1, 3_600 * 1_000_000, 3


class Distribution(msgspec.Struct, frozen=True, kw_only=True):
    """A distribution of milliseconds: how many values, and its
    percentiles and largest (0.0 each for none)."""

    count: int = 0
    p50: float = 0.0
    p90: float = 0.0
    p99: float = 0.0
    p99_9: float = msgspec.field(default=0.0, name="p99.9")
    p99_99: float = msgspec.field(default=0.0, name="p99.99")
    max: float = 0.0

    def describe(self) -> str:
        """``p50 / p99 / p99.9 / max`` for a person, in ms."""
        return (
            f"{self.p50:.1f} / {self.p99:.1f} / {self.p99_9:.1f} / max {self.max:.1f} ms "
            f"({self.count} values)"
        )


class Latencies:
    """A histogram of milliseconds (see the module doc); not thread-safe."""

    def __init__(self) -> None:
        self._histogram = HdrHistogram(_LOWEST, _HIGHEST, _DIGITS)

    def record(self, ms: float) -> None:
        """Record ``ms``, clamped to the histogram's range (1 us to 1 h)."""
        self._histogram.record_value(min(max(int(ms * 1000), _LOWEST), _HIGHEST))

    def add(self, other: Latencies) -> None:
        """Merge ``other``'s values into this one."""
        self._histogram.add(other._histogram)

    @property
    def count(self) -> int:
        return self._histogram.get_total_count()

    def distribution(self) -> Distribution:
        if not self.count:
            return Distribution()
        h = self._histogram

        def at(percentile: float) -> float:
            return h.get_value_at_percentile(percentile) / 1000

        return Distribution(
            count=self.count,
            p50=at(50),
            p90=at(90),
            p99=at(99),
            p99_9=at(99.9),
            p99_99=at(99.99),
            max=h.get_max_value() / 1000,
        )

    def encoded(self) -> str:
        """The histogram in HdrHistogram's compressed base64 form (microseconds)."""
        return self._histogram.encode().decode()

    @classmethod
    def decoded(cls, data: str) -> Latencies:
        """The histogram :meth:`encoded` gave; ``ValueError`` if ``data`` is not one."""
        out = cls()
        try:
            out._histogram = HdrHistogram.decode(data.encode())
        except Exception as exc:  # hdrh raises several kinds for a bad payload
            raise ValueError(f"not an encoded HdrHistogram: {exc}") from None
        return out


def merged(histograms: list[Latencies]) -> Latencies:
    """One histogram of every value of ``histograms``."""
    out = Latencies()
    for histogram in histograms:
        out.add(histogram)
    return out


class Window(msgspec.Struct, frozen=True, kw_only=True):
    """What happened in ``[t_s, t_s + window_s)`` of a run: ``appends``,
    their ``rate`` a second, the largest ``backlog`` at one of them and the
    p99 of their latencies (ms)."""

    t_s: float
    appends: int
    rate: float
    backlog: int
    p99_ms: float


#: Windows of 1 s, widened tenfold (10 s, 100 s, ...) whenever a run has
#: more than this many, so a long run keeps a bounded, plottable series.
MAX_WINDOWS = 600


class Series:
    """A run's figures per window of time (:class:`Window`), from 1 s up,
    widening as the run goes on (:data:`MAX_WINDOWS`); not thread-safe."""

    def __init__(self) -> None:
        self.window_s = 1.0
        self._windows: dict[int, tuple[int, int, Latencies]] = {}

    def add(self, at_s: float, latency_ms: float, backlog: int) -> None:
        """An append ``at_s`` seconds into the run."""
        index = int(at_s // self.window_s)
        if index >= MAX_WINDOWS:
            self._widen()
            index = int(at_s // self.window_s)
        appends, worst, latencies = self._windows.get(index) or (0, 0, Latencies())
        latencies.record(latency_ms)
        self._windows[index] = (appends + 1, max(worst, backlog), latencies)

    def _widen(self) -> None:
        wider: dict[int, tuple[int, int, Latencies]] = {}
        for index, (appends, worst, latencies) in self._windows.items():
            total, most, merged = wider.get(index // 10) or (0, 0, Latencies())
            merged.add(latencies)
            wider[index // 10] = (total + appends, max(most, worst), merged)
        self._windows = wider
        self.window_s *= 10

    def windows(self) -> list[Window]:
        """Every window with an append, in time order."""
        return [
            Window(
                t_s=index * self.window_s,
                appends=appends,
                rate=appends / self.window_s,
                backlog=worst,
                p99_ms=latencies.distribution().p99,
            )
            for index, (appends, worst, latencies) in sorted(self._windows.items())
        ]
