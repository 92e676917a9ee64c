"""``bench cluster --matrix peers``: shardsink against Delta Lake and
Iceberg written the ways people write them (:mod:`shardsink.bench.peers`),
side by side in one run.

At each shape of :data:`SHAPES` (one group of eight workers writing 1,000
rows an interval, four groups writing 128), shardsink best-effort and
barrier and the four peers of :data:`PEERS` (every worker its own
committer, and one coalesced committer per interval, for each format) run
:data:`INTERVALS` intervals closed loop, :data:`REPEATS` times
interleaved. Every table is read back and compared with the workload's
expected collection.

The report leads with the answer: at each shape, each shardsink variant's
rows/s as a multiple of the strongest peer's (the peer with the highest
median), and of the coalesced Delta and Iceberg peers' (the peers that
coalesce as shardsink does: :data:`HEADLINE_PEERS`), the median of the
per-repeat ratios (a repeat's runs are the nearest in time) with their
range. Its table gives per shape and variant rows/s (median, range),
p50 and p99.9 of the repeats' merged HdrHistograms of per-interval
latency, data files and metadata bytes per interval, commits per interval,
commit retries and failures, and orphan files. ``peers.png`` draws rows/s,
p99.9, files and metadata bytes per interval with the repeats' range.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

import msgspec

from ..._histograms import Latencies, merged

SHAPES = ((1, 8, 1000), (4, 8, 128))
SHARDSINK = ("best-effort", "barrier")
PEERS = ("delta-per-worker", "delta-coalesced", "iceberg-per-worker", "iceberg-coalesced")
#: The peers that coalesce as shardsink does: the comparison that matters.
HEADLINE_PEERS = ("delta-coalesced", "iceberg-coalesced")
#: Intervals a run (a peer's stops at its time budget,
#: :data:`~shardsink.bench.peers.harness.RUN_BUDGET_S`: iceberg-per-worker's
#: 32 committers at 4x8 write a few).
INTERVALS = 20
REPEATS = 3


def peers_matrix(make: Callable[..., msgspec.Struct]) -> list:
    """Every variant at every shape, :data:`REPEATS` times; ``make`` builds
    a run spec from its fields."""
    return [
        make(section="peers", mode=mode, groups=g, workers=w, workload="trickle",
             rows_per_interval=r, intervals=INTERVALS, repeat=repeat)
        for repeat in range(REPEATS)
        for g, w, r in SHAPES
        for mode in (*SHARDSINK, *PEERS)
    ]  # fmt: skip


def name(row: dict) -> str:
    """A run's variant as the peers' table names it."""
    return row["mode"] if row["mode"] in PEERS else f"shardsink {row['mode']}"


def _shape(row: dict) -> str:
    return f"{row['groups']}x{row['workers']} R={row['rows_per_interval']}"


def _cells(rows: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """The peers section's runs by shape and variant, shardsink's first."""
    order = [f"shardsink {m}" for m in SHARDSINK] + list(PEERS)
    cells: dict[tuple[str, str], list[dict]] = {}
    picked = [r for r in rows if r.get("section") == "peers"]
    for r in sorted(picked, key=lambda r: (_shape(r), order.index(name(r)))):
        cells.setdefault((_shape(r), name(r)), []).append(r)
    return cells


def _rates(runs: list[dict]) -> list[float]:
    return [r["rows_per_s"] for r in runs if r.get("verified")]


def _latencies(runs: list[dict]) -> Latencies:
    return merged([Latencies.decoded(r["append_latency_hdr"]) for r in runs if r.get("verified")])


def _ratios(ours: list[dict], theirs: list[dict]) -> list[float]:
    """Rows/s of ``ours`` over ``theirs``, repeat by repeat (both verified)."""
    by_repeat = {r["repeat"]: r["rows_per_s"] for r in theirs if r.get("verified")}
    return [
        r["rows_per_s"] / by_repeat[r["repeat"]]
        for r in ours
        if r.get("verified") and by_repeat.get(r["repeat"])
    ]


def headline(rows: list[dict]) -> list[str]:
    """Per shape and shardsink variant: its rows/s against the strongest
    peer's and the coalesced peers', and its p99.9 against theirs."""
    cells = _cells(rows)
    lines = []
    for shape in dict.fromkeys(s for s, _ in cells):
        peers = {v: runs for (s, v), runs in cells.items() if s == shape and v in PEERS}
        ranked = sorted(
            (v for v in peers if _rates(peers[v])),
            key=lambda v: -statistics.median(_rates(peers[v])),
        )
        if not ranked:
            continue
        strongest = ranked[0]
        for variant in (f"shardsink {m}" for m in SHARDSINK):
            ours = cells.get((shape, variant), [])
            if not _rates(ours):
                continue
            against = [strongest, *(p for p in HEADLINE_PEERS if p != strongest and p in ranked)]
            said = [
                _versus(ours, peers[p], p, ", the strongest peer" if p == strongest else "")
                for p in against
            ]
            mine = _latencies(ours).distribution().p99_9
            theirs = ", ".join(
                f"{_latencies(peers[p]).distribution().p99_9:,.1f} ms {p}" for p in against
            )
            lines.append(
                f"- {shape}: {variant} {statistics.median(_rates(ours)):,.0f} rows/s: "
                + "; ".join(said)
                + f". p99.9 {mine:,.1f} ms against {theirs}."
            )
    return lines


def _versus(ours: list[dict], theirs: list[dict], label: str, note: str = "") -> str:
    """``N.NNx label (R rows/s<note>; per repeat a-b)``."""
    ratios = _ratios(ours, theirs)
    if not ratios:
        return f"no repeat of {label} to compare"
    return (
        f"{statistics.median(ratios):.2f}x {label} ({statistics.median(_rates(theirs)):,.0f} "
        f"rows/s{note}; per repeat {min(ratios):.2f}-{max(ratios):.2f}x)"
    )


#: The table's per-run figures: ``(header, value of a row, format)``; a
#: shardsink run's retries are its abandoned attempts, and it has no
#: commit failures or orphan files to count.
_FIGURES: tuple[tuple[str, Callable[[dict], float | None], str], ...] = (
    ("files/interval", lambda r: r["blob_puts"] / max(r["appends"], 1), "{:.2f}"),
    ("metadata bytes/interval", lambda r: r["diff_bytes_per_append"], "{:,.0f}"),
    ("commits/interval", lambda r: r["cas_per_append"], "{:.2f}"),
    ("retries", lambda r: r.get("commit_retries", r.get("abandoned_attempts")), "{:,.0f}"),
    ("failures", lambda r: r.get("commit_failures"), "{:,.0f}"),
    ("orphan files", lambda r: r.get("orphan_files"), "{:,.0f}"),
)


def report_lines(rows: list[dict]) -> list[str]:
    """The peers' table (see the module doc)."""
    cells = _cells(rows)
    if not cells:
        return []
    headers = ["shape", "variant", "verified", "rows/s (median, range)", "p50 ms", "p99.9 ms"]
    headers += [h for h, _, _ in _FIGURES]
    lines = [
        "",
        "Per shape and variant over its repeats: rows/s median and range; latency per interval "
        "(release to commit; shardsink: mint to append) from the repeats' merged histograms; "
        "files, metadata bytes and commits per interval, median; retries (shardsink: abandoned "
        "attempts), failures and orphan files, summed over the repeats.",
        "",
        "| " + " | ".join(headers) + " |",
        "|" + "---|" * len(headers),
    ]
    for (shape, variant), runs in cells.items():
        ok = [r for r in runs if r.get("verified")]
        rates = _rates(runs)
        d = _latencies(runs).distribution()
        cells_text = [
            shape,
            variant,
            f"{len(ok)}/{len(runs)}",
            f"{statistics.median(rates):,.0f} ({min(rates):,.0f}-{max(rates):,.0f})"
            if rates
            else "-",
            f"{d.p50:,.1f}",
            f"{d.p99_9:,.1f}",
        ]
        for header, value, fmt in _FIGURES:
            values = [value(r) for r in ok]
            if not values or values[0] is None:
                cells_text.append("-")
                continue
            summed = header in ("retries", "failures", "orphan files")
            cells_text.append(fmt.format(sum(values) if summed else statistics.median(values)))
        lines.append("| " + " | ".join(cells_text) + " |")
    return lines


def plot(plt, rows: list[dict], out: Path, caption: str = "") -> list[Path]:
    """``peers.png``: rows/s, p99.9 per repeat, data files and metadata bytes
    per interval, a bar per variant at each shape (median, bars: the
    repeats' lowest to highest)."""
    from ..._figures import add_caption, grouped_bars, legend_beside, save

    cells = _cells(rows)
    if not cells:
        return []
    shapes = list(dict.fromkeys(s for s, _ in cells))
    # rows/s, latency and metadata bytes span orders of magnitude across
    # the peers: log scales, so the small bars are seen too
    panels = (
        ("rows/s", "rows a second (closed loop, log scale)", lambda r: r["rows_per_s"],
         "{:,.0f}", True),
        ("p99.9 latency", "p99.9 per interval (ms, each repeat's; log scale)",
         lambda r: r["append_latency_ms"]["p99.9"], "{:,.0f}", True),
        ("data files per interval", "files per interval", _FIGURES[0][1], "{:.1f}", False),
        ("metadata bytes per interval", "bytes per interval (log scale)",
         lambda r: r["diff_bytes_per_append"], "{:,.0f}", True),
    )  # fmt: skip
    fig, axes = plt.subplots(2, 2, figsize=(14, 9))
    for ax, (title, unit, value, fmt, log) in zip(axes.flat, panels, strict=True):
        series: dict[str, dict[str, list[float]]] = {}
        for (shape, variant), runs in cells.items():
            series.setdefault(variant, {})[shape] = [value(r) for r in runs if r.get("verified")]
        grouped_bars(ax, shapes, series, fmt)
        values = [v for by_shape in series.values() for vs in by_shape.values() for v in vs]
        if log and any(v > 0 for v in values):
            ax.set_yscale("log")
            ax.set_ylim(min(v for v in values if v > 0) / 3, max(values) * 5)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(unit)
        ax.set_xlabel("shape: groups x workers, R = rows per interval")
    legend_beside(axes.flat[1])
    repeats = max(len(runs) for runs in cells.values())
    fig.suptitle(
        f"shardsink against its peers: median of {repeats} repeats, bars: lowest to highest"
    )
    fig.tight_layout()
    add_caption(fig, caption)
    return [save(fig, out / "peers.png")]
