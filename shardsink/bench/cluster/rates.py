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
            cells.setdefault((_shape(row), row["mode"], row["target_rate"]), []).append(row)
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


def _by_variant(pts: list[Point]) -> dict[tuple[str, str], list[Point]]:
    groups: dict[tuple[str, str], list[Point]] = {}
    for point in pts:
        groups.setdefault((point.shape, point.variant), []).append(point)
    return groups


def headline(rows: list[dict], slo_p99_ms: float = SLO_P99_MS) -> list[str]:
    """The knees: per shape and variant, the highest rate within the SLO."""
    pts = points(rows)
    if not pts:
        return []
    lines = [f"Knees (highest rate with a merged p99 within {slo_p99_ms:g} ms, none behind):"]
    for (shape, variant), picked in _by_variant(pts).items():
        found = knee(picked, slo_p99_ms)
        where = f"{found:g} intervals/s" if found is not None else "none: the lowest rate misses"
        lines.append(f"- {shape} {variant}: {where}")
    return lines


def report_lines(rows: list[dict]) -> list[str]:
    """Per shape and variant a line per target rate: achieved rate, the
    merged distribution, the repeats behind (the knees lead the report:
    :func:`headline`)."""
    pts = points(rows)
    if not pts:
        return []
    lines = [
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
            f.write(
                f"Tag={tag},0.000,0.000,{point.latencies.distribution().max:.3f},"
                f"{point.latencies.encoded()}\n"
            )
    return path


def plot(plt, rows: list[dict], out: Path, caption: str = "", slo: float = SLO_P99_MS) -> list:
    """``rate-<shape>.png``: per variant, p99 (log scale) against achieved
    rate, a point per target rate with the repeats' range; the SLO a line."""
    from ..._figures import add_caption, legend_beside, save

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
            ax.errorbar(
                xs,
                ys,
                yerr=[[max(v, 0) for v in low], [max(v, 0) for v in high]],
                marker="o",
                capsize=3,
                color=f"C{k}",
                label=variant,
            )
        ax.axhline(slo, color="grey", linestyle="--", label=f"SLO p99 {slo:g} ms")
        ax.set_yscale("log")
        ax.set_xlabel("achieved rate (intervals/s, median of repeats)")
        ax.set_ylabel("append latency p99 (ms, repeats merged; bars: their range)")
        ax.set_title(f"throughput against latency, open loop: {shape}")
        legend_beside(ax)
        add_caption(fig, caption)
        written.append(save(fig, out / f"rate-{shape.split()[0]}.png", dpi=110))
    return written


def series_plot(plt, rows: list[dict], out: Path, caption: str = "") -> list[Path]:
    """``series-<shape>.png``: every open-loop run's series over time, a
    column per variant: appends a second, the backlog and the p99 latency
    (from each interval's due time, log scale) per window; a colour per
    target rate (its target a dotted line in the rate panel), a line style
    per repeat."""
    from matplotlib.lines import Line2D

    from ..._figures import add_caption, save

    runs = [r for r in rows if r.get("section") == "rate" and r.get("verified") and r.get("series")]
    styles = ("-", "--", ":", "-.")
    written = []
    for shape in dict.fromkeys(_shape(r) for r in runs):
        mine = [r for r in runs if _shape(r) == shape]
        variants = [v for v in VARIANTS if any(r["mode"] == v for r in mine)]
        targets = sorted({r["target_rate"] for r in mine})
        colors = {
            t: plt.cm.viridis(k / max(len(targets) - 1, 1) * 0.9) for k, t in enumerate(targets)
        }
        fig, axes = plt.subplots(
            3, len(variants), figsize=(5 * len(variants), 10), sharex=True, squeeze=False
        )
        for col, variant in enumerate(variants):
            for r in (r for r in mine if r["mode"] == variant):
                color, style = colors[r["target_rate"]], styles[r["repeat"] % len(styles)]
                t = [w["t_s"] for w in r["series"]]
                for row, key in enumerate(("rate", "backlog", "p99_ms")):
                    axes[row][col].plot(
                        t, [w[key] for w in r["series"]], style + "o", color=color, markersize=2
                    )
                axes[0][col].axhline(r["target_rate"], color=color, linestyle=":", linewidth=0.6)
            axes[0][col].set_title(variant)
            axes[0][col].set_ylim(bottom=0)
            axes[1][col].set_ylim(bottom=0)
            axes[2][col].set_yscale("log")
            axes[2][col].set_xlabel("time into the run (s)")
        window = mine[0].get("series_window_s", 1.0)
        # short lines: the three panels' labels stack beside each other
        axes[0][0].set_ylabel(f"appends/s\n(per {window:g} s window)")
        axes[1][0].set_ylabel("backlog: intervals due,\nnot appended (most)")
        axes[2][0].set_ylabel("p99 latency (ms from\nthe due time, log scale)")
        handles = [Line2D([], [], color=colors[t], label=f"target {t:g}/s") for t in targets]
        repeats = sorted({r["repeat"] for r in mine})
        handles += [
            Line2D([], [], color="black", linestyle=styles[k % len(styles)], label=f"repeat {k}")
            for k in repeats
        ]
        fig.legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small")
        fig.suptitle(f"open-loop runs over time: {shape}, per {window:g} s window")
        fig.tight_layout()
        add_caption(fig, caption)
        written.append(save(fig, out / f"series-{shape.split()[0]}.png"))
    return written


def _shape(row: dict) -> str:
    return f"{row['groups']}x{row['workers']} R={row['rows_per_interval']}"
