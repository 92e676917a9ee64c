"""The PNG plots of a ``bench cluster`` run: parts, blob PUTs, diff bytes and
p50 append latency per append by mode and shape; hydration wall time by
threshold; the scale curves (:func:`shardsink.bench.scale.plot`).

Only verified runs are plotted; a plot with nothing to show is not written.
matplotlib is imported when plotting (the ``bench`` extra), with the Agg
backend, so no display is needed.
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path

from ...config import AUTO
from .. import scale
from .matrices import bytes_label, shape_of

#: The per-append bar plots: ``(file stem, title, value of a row)``.
METRICS = [
    (
        "parts_per_append",
        "data + inline parts per append",
        lambda r: r["data_parts_per_append"] + r["inline_parts_per_append"],
    ),
    (
        "blob_puts_per_append",
        "blob PUTs per append",
        lambda r: r["blob_puts"] / max(r["appends"], 1),
    ),
    (
        "diff_bytes_per_append",
        "consensus diff bytes per append",
        lambda r: r["diff_bytes_per_append"],
    ),
    ("latency", "append latency p50 (ms)", lambda r: r["append_latency_ms_p50"]),
]


def plot(rows: list[dict], out: Path) -> list[Path]:
    """PNG plots of the verified runs; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r.get("verified")]
    written = _metric_plots(plt, ok, out)
    written += _hydrate_plot(plt, ok, out)
    return written + scale.plot(rows, out, os.cpu_count() or 1)


def _metric_plots(plt, ok: list[dict], out: Path) -> list[Path]:
    """One bar chart per :data:`METRICS` of the small-writes and trickle runs
    (``auto`` left out): a bar per variant at each shape."""
    written: list[Path] = []
    shapes = [
        r
        for r in ok
        if r["section"] in ("small-writes", "trickle") and r["shared_max_bytes"] != AUTO
    ]
    labels = sorted({shape_of(r) for r in shapes})
    if not labels:
        return written
    for name, title, value in METRICS:
        fig, ax = plt.subplots(figsize=(8, 4))
        modes = list(dict.fromkeys(scale.variant(r) for r in shapes))
        width = 0.8 / len(modes)
        for k, mode in enumerate(modes):
            ys = []
            for label in labels:
                match = [r for r in shapes if scale.variant(r) == mode and shape_of(r) == label]
                ys.append(value(match[0]) if match else 0)
            ax.bar([i + k * width for i in range(len(labels))], ys, width, label=mode)
        ax.set_xticks([i + width for i in range(len(labels))], labels)
        ax.set_title(title)
        ax.legend()
        fig.tight_layout()
        path = out / f"{name}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def _hydrate_plot(plt, ok: list[dict], out: Path) -> list[Path]:
    """The median hydration wall time of ``off`` and of each threshold."""
    hydrate = [r for r in ok if r["section"] == "hydrate"]
    if not hydrate:
        return []
    groups: dict[str, list[float]] = {}
    for r in hydrate:
        key = "off" if r["mode"] == "off" else f"B={bytes_label(r['shared_max_bytes'])}"
        groups.setdefault(key, []).append(r["wall_s"])
    fig, ax = plt.subplots(figsize=(6, 4))
    keys = list(groups)
    ax.bar(keys, [statistics.median(groups[k]) for k in keys])
    ax.set_title("hydration wall time by threshold (median s)")
    fig.tight_layout()
    path = out / "hydrate_wall.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [path]
