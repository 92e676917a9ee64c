"""``bench cluster --matrix rate``: throughput against latency, open loop.

Each variant (``off``, ``best-effort``, ``barrier``) at each shape of
:data:`SHAPES` runs at every target rate of :data:`RATES` (intervals a
second, ``up --rate``: each interval due on schedule whatever happened
before, its latency counted from when it was due), from well below what
the cluster holds to past it, :data:`REPEATS` times interleaved; each run
lasts about :data:`RUN_S` seconds of schedule. What a rate costs is its
latency *distribution*: the repeats' HdrHistograms are merged (never their
percentiles averaged) into p50 ... p99.99 and max, and the **knee** of a
variant is the highest target rate whose merged p99 stays within the SLO
(``--slo-p99-ms``, 100 ms) with no repeat falling behind its schedule.

The report gives, per shape and variant, achieved against target rate,
the merged distribution and how many repeats fell behind, and leads with
the knees; ``rate-<shape>.png`` draws each variant's p99 against its
achieved rate (error bars: the repeats' range), the SLO a line across; the
merged histograms are written to ``histograms.hlog`` in HdrHistogram's log
format, one tagged line each (``rate/<shape>/<variant>/<target>``), so
HdrHistogram's own tools plot and merge them.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

import msgspec

from ..._histograms import Latencies, merged

#: ``(groups, workers, rows per interval)``: one group of eight workers
#: writing 1,000 rows an interval, four groups writing 128.
SHAPES = ((1, 8, 1000), (4, 8, 128))
VARIANTS = ("off", "best-effort", "barrier")
#: Target rates, intervals a second: a 4x8 trickle appends about 40-120 a
#: second here at full pace (docs/benchmarks.md), so the top ones are past it.
RATES = (5.0, 10.0, 20.0, 40.0, 80.0, 160.0)
RUN_S = 6.0
MIN_INTERVALS = 30
REPEATS = 2
SLO_P99_MS = 100.0


def rate_matrix(make: Callable[..., msgspec.Struct]) -> list:
    """Every variant at every shape and rate, :data:`REPEATS` times;
    ``make`` builds a run spec from its fields."""
    return [
        make(section="rate", mode=mode, groups=g, workers=w, workload="trickle",
             rows_per_interval=r, intervals=max(MIN_INTERVALS, int(rate * RUN_S)),
             rate=rate, repeat=repeat)
        for repeat in range(REPEATS)
        for g, w, r in SHAPES
        for mode in VARIANTS
        for rate in RATES
    ]  # fmt: skip


class Point(msgspec.Struct, frozen=True, kw_only=True):
    """A variant at a target rate, over its repeats: the achieved rates,
    the merged latency histogram and how many repeats fell behind."""

    shape: str
    variant: str
    target: float
    achieved: list[float]
    p99s: list[float]
    latencies: Latencies
    behind: int


def points(rows: list[dict]) -> list[Point]:
    """The verified rate runs, by shape, variant and target rate."""
    cells: dict[tuple[str, str, float], list[dict]] = {}
    for row in rows:
        if row.get("section") == "rate" and row.get("verified") and row.get("target_rate"):
            shape = f"{row['groups']}x{row['workers']} R={row['rows_per_interval']}"
            cells.setdefault((shape, row["mode"], row["target_rate"]), []).append(row)
    return [
        Point(
            shape=shape,
            variant=variant,
            target=target,
            achieved=[r["achieved_rate"] for r in picked],
            p99s=[r["append_latency_ms"]["p99"] for r in picked],
            latencies=merged([Latencies.decoded(r["append_latency_hdr"]) for r in picked]),
            behind=sum(bool(r["fell_behind"]) for r in picked),
        )
        for (shape, variant, target), picked in sorted(cells.items())
    ]


def knee(pts: list[Point], slo_p99_ms: float) -> float | None:
    """The highest target rate of one variant's ``pts`` whose merged p99 is
    within ``slo_p99_ms`` and whose repeats all kept the schedule, every
    lower rate holding too; ``None`` if even the lowest does not."""
    best = None
    for point in sorted(pts, key=lambda p: p.target):
        if point.behind or point.latencies.distribution().p99 > slo_p99_ms:
            break
        best = point.target
    return best


def report_lines(rows: list[dict], slo_p99_ms: float = SLO_P99_MS) -> list[str]:
    """The knees first, then per shape and variant a line per target rate."""
    pts = points(rows)
    if not pts:
        return []
    groups: dict[tuple[str, str], list[Point]] = {}
    for point in pts:
        groups.setdefault((point.shape, point.variant), []).append(point)
    lines = ["", f"Knees (highest rate with a merged p99 within {slo_p99_ms:g} ms, none behind):"]
    for (shape, variant), picked in groups.items():
        found = knee(picked, slo_p99_ms)
        where = f"{found:g} intervals/s" if found is not None else "none: the lowest rate misses"
        lines.append(f"- {shape} {variant}: {where}")
    lines += [
        "",
        "| shape | variant | target /s | achieved /s (median, range) | count | p50 | p90 | "
        "p99 | p99.9 | p99.99 | max ms | behind |",
        "|" + "---|" * 12,
    ]
    for point in pts:
        d = point.latencies.distribution()
        got = point.achieved
        lines.append(
            f"| {point.shape} | {point.variant} | {point.target:g} | "
            f"{statistics.median(got):.1f} ({min(got):.1f}-{max(got):.1f}) | {d.count} | "
            f"{d.p50:.1f} | {d.p90:.1f} | {d.p99:.1f} | {d.p99_9:.1f} | {d.p99_99:.1f} | "
            f"{d.max:.1f} | {point.behind}/{len(got)} |"
        )
    return lines


def write_histograms(rows: list[dict], out: Path) -> Path | None:
    """``out/histograms.hlog``: each point's merged histogram, a tagged line
    of HdrHistogram's log format (values in microseconds)."""
    from hdrh.log import HistogramLogWriter

    pts = points(rows)
    if not pts:
        return None
    path = out / "histograms.hlog"
    with path.open("w") as f:
        writer = HistogramLogWriter(f)
        writer.output_comment("shardsink bench cluster --matrix rate: append latency, us")
        writer.output_legend()
        for point in pts:
            tag = f"rate/{point.shape.replace(' ', '/')}/{point.variant}/{point.target:g}"
            f.write(f"Tag={tag},0.000,0.000,{point.latencies.distribution().max:.3f},"
                    f"{point.latencies.encoded()}\n")  # fmt: skip
    return path


def plot(plt, rows: list[dict], out: Path, caption: str = "", slo: float = SLO_P99_MS) -> list:
    """``rate-<shape>.png``: per variant, p99 (log scale) against achieved
    rate, a point per target rate with the repeats' range; the SLO a line."""
    from ..._figures import add_caption

    pts = points(rows)
    written = []
    for shape in dict.fromkeys(p.shape for p in pts):
        fig, ax = plt.subplots(figsize=(8, 5))
        for k, variant in enumerate(dict.fromkeys(p.variant for p in pts)):
            mine = [p for p in pts if p.shape == shape and p.variant == variant]
            if not mine:
                continue
            xs = [statistics.median(p.achieved) for p in mine]
            ys = [p.latencies.distribution().p99 for p in mine]
            low = [y - min(p.p99s) for y, p in zip(ys, mine, strict=True)]
            high = [max(p.p99s) - y for y, p in zip(ys, mine, strict=True)]
            ax.errorbar(xs, ys, yerr=[[max(v, 0) for v in low], [max(v, 0) for v in high]],
                        marker="o", capsize=3, color=f"C{k}", label=variant)  # fmt: skip
        ax.axhline(slo, color="grey", linestyle="--", label=f"SLO p99 {slo:g} ms")
        ax.set_yscale("log")
        ax.set_xlabel("achieved rate (intervals/s, median of repeats)")
        ax.set_ylabel("append latency p99 (ms, repeats merged; bars: their range)")
        ax.set_title(f"throughput against latency, open loop: {shape}")
        ax.legend()
        add_caption(fig, caption)
        path = out / f"rate-{shape.split()[0]}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        written.append(path)
    return written
