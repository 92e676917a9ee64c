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
