"""``bench cluster --matrix saturation``: what an open loop past saturation
looks like, beside the closed loop of the same shape, in one run.

Each repeat runs :data:`SHAPE` in :data:`MODE` twice, one right after the
other: closed loop at ``--pace max`` (each interval minted when the one
before is appended, its latency from its mint), then open loop at
:data:`FACTOR` times the rate the closed-loop run just achieved (``up
--rate``: each interval due on schedule, its latency from when it was
due, the intended start). The closed loop never falls behind, because it
waits; the open loop cannot keep its schedule, so its backlog grows all
run long and so does its latency, which a closed-loop figure hides
(coordinated omission). :data:`REPEATS` repeats, interleaved.

The report leads with both runs' rates and latencies and the open loop's
backlog; ``saturation.png`` draws, over time, the p99 latency per window
of both, the open loop's backlog and both rates (its target a dashed
line), every repeat a line of its own.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

import msgspec

#: ``(groups, workers, rows per interval)``: the 4x8 trickle of the other matrices.
SHAPE = (4, 8, 128)
MODE = "best-effort"
FACTOR = 2.0
#: About 10 s of a closed loop at the 40-120 appends a second a 4x8
#: trickle reaches here (docs/benchmarks.md), so the series has points.
INTERVALS = 600
REPEATS = 3


def saturation_matrix(make: Callable[..., msgspec.Struct]) -> list:
    """Per repeat, the closed-loop run, then the open-loop run that follows
    it (``saturate``: its rate is :data:`FACTOR` times the closed loop's);
    ``make`` builds a run spec from its fields."""
    g, w, r = SHAPE
    shape = {
        "section": "saturation",
        "mode": MODE,
        "groups": g,
        "workers": w,
        "workload": "trickle",
        "rows_per_interval": r,
        "intervals": INTERVALS,
    }
    return [
        make(**shape, repeat=repeat, **extra)
        for repeat in range(REPEATS)
        for extra in ({}, {"saturate": FACTOR})
    ]


def resolved(spec, rows: list[dict]):
    """``spec`` with its open-loop rate if it follows a closed-loop run
    (``saturate``): that multiple of the achieved rate of the closed-loop
    run of its section, shape and repeat in ``rows``; ``ValueError`` if
    that run is not there or did not verify."""
    if not spec.saturate:
        return spec
    fields = ("section", "mode", "groups", "workers", "rows_per_interval", "repeat")
    closed = [
        r
        for r in rows
        if all(r.get(f) == getattr(spec, f) for f in fields) and not r.get("saturate")
    ]
    if not closed or not closed[-1].get("verified") or not closed[-1].get("achieved_rate"):
        raise ValueError("the closed-loop run this open-loop run follows did not verify")
    return msgspec.structs.replace(spec, rate=spec.saturate * closed[-1]["achieved_rate"])


def _runs(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """The verified closed-loop and open-loop runs of the section."""
    mine = [r for r in rows if r.get("section") == "saturation" and r.get("verified")]
    return [r for r in mine if not r.get("saturate")], [r for r in mine if r.get("saturate")]


def headline(rows: list[dict]) -> list[str]:
    """The closed loop's rate and latency, the open loop's target, achieved
    rate, backlog and latency from the intended start (medians of repeats)."""
    closed, opened = _runs(rows)
    if not closed or not opened:
        return []

    def med(runs: list[dict], key: str, sub: str | None = None) -> float:
        return statistics.median(r[key][sub] if sub else r[key] for r in runs)

    first = closed[0]
    return [
        f"- {first['groups']}x{first['workers']} R={first['rows_per_interval']} {first['mode']}, "
        f"medians of {len(closed)} and {len(opened)} repeats: closed loop (pace max) "
        f"{med(closed, 'achieved_rate'):.1f} intervals/s, p99 "
        f"{med(closed, 'append_latency_ms', 'p99'):,.1f} ms from each mint; open loop at "
        f"{opened[0]['saturate']:g}x that ({med(opened, 'target_rate'):.1f}/s) achieved "
        f"{med(opened, 'achieved_rate'):.1f}/s, its backlog grew to "
        f"{med(opened, 'max_backlog'):,.0f} intervals and its p99 from the intended start was "
        f"{med(opened, 'append_latency_ms', 'p99'):,.1f} ms (max "
        f"{med(opened, 'append_latency_ms', 'max'):,.1f})."
    ]


def report_lines(rows: list[dict]) -> list[str]:
    """A line per run: its loop, rates, backlog and latency distribution."""
    closed, opened = _runs(rows)
    if not closed and not opened:
        return []
    lines = [
        "",
        "| repeat | loop | target /s | achieved /s | max backlog | p50 | p99 | p99.9 | max ms |",
        "|" + "---|" * 9,
    ]
    for r in sorted(closed + opened, key=lambda r: (r["repeat"], bool(r.get("saturate")))):
        d = r["append_latency_ms"]
        loop = f"open, {r['saturate']:g}x" if r.get("saturate") else "closed (pace max)"
        target = f"{r['target_rate']:.1f}" if r.get("target_rate") else "-"
        lines.append(
            f"| {r['repeat']} | {loop} | {target} | {r['achieved_rate']:.1f} | "
            f"{r.get('max_backlog', 0):,} | {d['p50']:.1f} | {d['p99']:.1f} | {d['p99.9']:.1f} | "
            f"{d['max']:.1f} |"
        )
    return lines


def plot(plt, rows: list[dict], out: Path, caption: str = "") -> list[Path]:
    """``saturation.png``: over time, per window, the p99 latency of both
    loops (log scale), the open loop's backlog, and both rates."""
    from ..._figures import add_caption, legend_beside, save

    closed, opened = _runs(rows)
    if not closed or not opened:
        return []
    fig, axes = plt.subplots(1, 3, figsize=(17, 5))
    styles = ("-", "--", ":", "-.")
    for runs, color, loop in (
        (closed, "C0", "closed loop, pace max (from each mint)"),
        (opened, "C3", "open loop (from the intended start)"),
    ):
        for k, r in enumerate(sorted(runs, key=lambda r: r["repeat"])):
            t = [w["t_s"] for w in r["series"]]
            label = f"{loop}, repeat {r['repeat']}"
            # a marker per window: a short run has few
            style = styles[k % len(styles)] + "o"
            axes[0].plot(t, [w["p99_ms"] for w in r["series"]], style, color=color, label=label)
            axes[1].plot(t, [w["backlog"] for w in r["series"]], style, color=color, label=label)
            axes[2].plot(t, [w["rate"] for w in r["series"]], style, color=color, label=label)
            if r.get("target_rate"):
                axes[2].axhline(
                    r["target_rate"],
                    color="grey",
                    linestyle=styles[k % len(styles)],
                    linewidth=0.8,
                    label=f"open loop's target, repeat {r['repeat']}",
                )
    window = closed[0].get("series_window_s", 1.0)
    axes[0].set_yscale("log")
    axes[0].set_ylabel(f"p99 append latency per {window:g} s window (ms, log scale)")
    axes[1].set_ylabel("backlog: intervals due and not appended (most in the window)")
    axes[2].set_ylabel(f"appends/s per {window:g} s window")
    for ax, title in zip(axes, ("latency", "backlog", "rate"), strict=True):
        ax.set_xlabel("time into the run (s)")
        ax.set_title(title, fontsize=10)
    for ax in axes[1:]:
        ax.set_ylim(bottom=0)
    legend_beside(axes[2])
    first = closed[0]
    fig.suptitle(
        f"past saturation: {first['groups']}x{first['workers']} R={first['rows_per_interval']} "
        f"{first['mode']}, closed loop against open loop at {opened[0]['saturate']:g}x its rate"
    )
    fig.tight_layout()
    add_caption(fig, caption)
    return [save(fig, out / "saturation.png")]
