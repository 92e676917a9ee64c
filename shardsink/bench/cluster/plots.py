"""The PNG plots of a ``bench cluster`` run: parts, blob PUTs, diff bytes and
p50 append latency per append by mode and shape; hydration wall time by
``--shared-max-bytes``; the scale curves (:func:`shardsink.bench.scale.plot`).
Each bar is the median of its repeats with their spread, its value on it,
and each plot names its command, commit and machine (:mod:`shardsink._figures`).

Only verified runs are plotted; a plot with nothing to show is not written.
matplotlib is imported when plotting (the ``bench`` extra), with the Agg
backend, so no display is needed.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..._figures import add_caption, caption, grouped_bars, legend_beside, save
from ...config import AUTO
from .. import scale
from . import hosts, peer_matrix, rates, saturation
from .matrices import HYDRATE_THRESHOLDS, VARIANTS, bytes_label, shape_of

#: The per-append bar plots: ``(file stem, title, y-axis label, value format,
#: value of a row)``.
METRICS = [
    (
        "parts_per_append",
        "data + inline parts per append",
        "parts per append",
        "{:.2f}",
        lambda r: r["data_parts_per_append"] + r["inline_parts_per_append"],
    ),
    (
        "blob_puts_per_append",
        "blob PUTs per append",
        "blob PUTs per append",
        "{:.2f}",
        lambda r: r["blob_puts"] / max(r["appends"], 1),
    ),
    (
        "diff_bytes_per_append",
        "consensus diff bytes per append",
        "bytes per append",
        "{:,.0f}",
        lambda r: r["diff_bytes_per_append"],
    ),
    (
        "latency",
        "append latency p50",
        "p50 append latency (ms)",
        "{:.1f}",
        lambda r: r["append_latency_ms_p50"],
    ),
]
#: The x axis of the per-append plots.
SHAPE_AXIS = "shape: groups x workers, R = rows per interval"


def plot(rows: list[dict], out: Path, command: str | None = None) -> list[Path]:
    """PNG plots of the verified runs, each captioned with ``command``
    (default: this process's), the commit and the machine
    (:mod:`shardsink._figures`); returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r.get("verified")]
    runs = sorted({r["intervals"] for r in ok if r.get("intervals")})
    lengths = "/".join(map(str, runs))
    text = caption(command, note=f"runs of {lengths} intervals" if runs else "")
    written = _metric_plots(plt, ok, out, text)
    written += _hydrate_plot(plt, ok, out, text)
    written += hosts.plot(plt, ok, out, text)
    rated = [r for r in ok if r.get("section") == "rate"]
    if rated:
        written += rates.plot(plt, rated, out, text, rated[0].get("slo_p99_ms", rates.SLO_P99_MS))
        written += rates.series_plot(plt, rated, out, text)
    written += peer_matrix.plot(plt, ok, out, text)
    written += saturation.plot(plt, ok, out, text)
    return written + scale.plot(rows, out, os.cpu_count() or 1)


def _metric_plots(plt, ok: list[dict], out: Path, text: str) -> list[Path]:
    """One bar chart per :data:`METRICS` of the small-writes and trickle runs
    (``auto`` left out): a bar per variant at each shape, over its repeats."""
    written: list[Path] = []
    shapes = [
        r
        for r in ok
        if r["section"] in ("small-writes", "trickle") and r["shared_max_bytes"] != AUTO
    ]
    labels = sorted({shape_of(r) for r in shapes})
    if not labels:
        return written
    repeats = max(sum(1 for _ in group) for group in _by_variant_and_shape(shapes).values())
    for name, title, unit, fmt, value in METRICS:
        series: dict[str, dict[str, list[float]]] = {}
        for (mode, label), runs in _by_variant_and_shape(shapes).items():
            series.setdefault(mode, {})[label] = [value(r) for r in runs]
        fig, ax = plt.subplots(figsize=(9, 5))
        grouped_bars(ax, labels, series, fmt)
        ax.set_title(f"{title} ({_over(repeats)})")
        ax.set_ylabel(unit)
        ax.set_xlabel(SHAPE_AXIS)
        legend_beside(ax)
        fig.tight_layout()
        add_caption(fig, text)
        written.append(save(fig, out / f"{name}.png"))
    return written


def _by_variant_and_shape(rows: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """``rows`` by variant, in :data:`VARIANTS`' order whatever order they ran in, and shape."""
    order = [scale.variant({"mode": m, "coalesce": c}) for m, c in VARIANTS]
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in sorted(rows, key=lambda r: (_rank(order, scale.variant(r)), shape_of(r))):
        groups.setdefault((scale.variant(r), shape_of(r)), []).append(r)
    return groups


def _rank(order: list, item) -> int:
    return order.index(item) if item in order else len(order)


def _over(repeats: int) -> str:
    """How a bar's figure was taken over ``repeats`` runs."""
    if repeats == 1:
        return "one run each"
    return f"median of up to {repeats} runs, bars: lowest to highest"


def _hydrate_key(row: dict) -> str:
    """A hydrate run's bar: its mode for ``off`` and the pyarrow baseline,
    else its threshold."""
    return (
        row["mode"] if row["mode"] in ("off", "pyarrow") else bytes_label(row["shared_max_bytes"])
    )


def _hydrate_plot(plt, ok: list[dict], out: Path, text: str) -> list[Path]:
    """Hydration wall time of ``off`` and of each ``--shared-max-bytes``
    threshold, over the repeats."""
    hydrate = [r for r in ok if r["section"] == "hydrate"]
    if not hydrate:
        return []
    order = [
        ("off", "off"),
        *((m, bytes_label(b)) for m, b in HYDRATE_THRESHOLDS if m != "off"),
        ("pyarrow", "pyarrow"),
    ]
    groups: dict[str, list[float]] = {}

    def rank(r: dict) -> int:
        return _rank(order, (r["mode"], _hydrate_key(r)))

    for r in sorted(hydrate, key=rank):
        key = _hydrate_key(r)
        groups.setdefault(key, []).append(r["wall_s"])
    keys = list(groups)
    fig, ax = plt.subplots(figsize=(8, 5))
    grouped_bars(ax, keys, {"wall time": groups}, "{:.2f} s")
    repeats = max(len(v) for v in groups.values())
    first = hydrate[0]
    ax.set_title(
        f"hydration of {first['snapshot_rows']:,} rows at {first['groups']}x{first['workers']}: "
        f"wall time ({_over(repeats)})",
        fontsize=10,
    )
    ax.set_ylabel("wall time (s)")
    ax.set_xlabel("--shared-max-bytes (best-effort), mode off, or plain pyarrow")
    fig.tight_layout()
    add_caption(fig, text)
    return [save(fig, out / "hydrate_wall.png")]
