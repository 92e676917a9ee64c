"""The scale-out curves of ``shardsink bench cluster --matrix scale``.

Two sweeps of the trickle workload with a fixed number of rows per worker
per interval, so that ideal scaling is linear: workers per group grow at one
group (``scale-workers``), and groups grow at a fixed number of workers each
(``scale-groups``), for every coalescing mode. Each point is one cluster run
(rows/s, data and inline parts per append, append latency p50), verified
like every other run, plus where its CPU went (:func:`cpu_use`); a point
is the median of its repeats.

This module reads the result rows: :func:`sweeps` and :func:`stop` find
where scaling stops and say why, :func:`report_lines` writes that into
``report.md`` and :func:`plot` draws each sweep against its ideal linear line
and the machine's core count. Nothing here runs a cluster.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from pathlib import Path

import msgspec
import psutil

#: The sections of the scale matrix and the axis each one grows.
SECTIONS = {"scale-workers": "workers", "scale-groups": "groups"}
#: A step ends the scaling when it raises rows/s by less than this share of
#: what linear scaling would (doubling the workers: less than x1.5).
GAIN = 0.5
#: A process using at least this share of one core is saturated.
SATURATED = 0.90
#: Above this share of all the machine's cores busy, the machine is saturated.
MACHINE_SATURATED = 0.90


class Point(msgspec.Struct, frozen=True):
    """One point of a sweep: ``n`` the value of the axis, ``processes`` the
    worker processes in all (groups x workers); the figures of the run with
    the median rows/s among its verified repeats (``runs`` of them), and
    the lowest and highest rows/s, parts per append and p50 latency of those
    repeats (``*_range``)."""

    n: int
    processes: int
    runs: int
    rows_per_s: float
    parts_per_append: float
    latency_ms_p50: float
    machine_busy: float
    cpu_cores: dict[str, float]
    busiest: str
    busiest_core: float
    rows_per_s_range: tuple[float, float] = (0.0, 0.0)
    parts_per_append_range: tuple[float, float] = (0.0, 0.0)
    latency_ms_p50_range: tuple[float, float] = (0.0, 0.0)


class Sweep(msgspec.Struct, frozen=True):
    """The points of one mode along one axis (``workers`` or ``groups``), by ``n``."""

    section: str
    axis: str
    mode: str
    points: list[Point]


class Stop(msgspec.Struct, frozen=True):
    """Where a sweep stops scaling: ``last`` is the last point that still
    gained at least :data:`GAIN` of the linear step over the one before;
    ``next`` the point after it (``None`` if every step did: scaling had not
    stopped yet)."""

    last: Point
    next: Point | None
    why: str


#: ``pid -> (kind, name, user + system CPU seconds)``: see :func:`cpu_times`.
CpuTimes = dict[int, tuple[str, str, float]]


def cpu_use(before: CpuTimes, after: CpuTimes, wall_s: float) -> dict:
    """Where the CPU went between two :func:`cpu_times` samples ``wall_s``
    apart: cores used per process kind (``cpu_cores``), and the busiest
    process (``busiest``, ``busiest_core``: its share of one core)."""
    by_kind: dict[str, float] = {}
    busiest, busiest_s = "", 0.0
    for pid, (kind, name, seconds) in after.items():
        used = seconds - before.get(pid, (kind, name, 0.0))[2]
        by_kind[kind] = by_kind.get(kind, 0.0) + used
        if used > busiest_s:
            busiest, busiest_s = f"{kind} {name}", used
    wall = max(wall_s, 1e-9)
    return {
        "cpu_cores": {kind: round(s / wall, 3) for kind, s in sorted(by_kind.items())},
        "busiest": busiest,
        "busiest_core": round(busiest_s / wall, 3),
    }


def cpu_times(processes: Iterable[tuple[str, str, int]]) -> CpuTimes:
    """``pid -> (kind, name, user + system CPU seconds)`` of the live ones of
    ``processes`` (kind, name, pid)."""
    out = {}
    for kind, name, pid in processes:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.Error:  # gone since it was listed
            continue
        out[pid] = (kind, name, times.user + times.system)
    return out


def cpu_sample() -> tuple[float, float]:
    """The machine's idle and total CPU seconds so far, all cores together
    (every process, other users' included), for :func:`machine_busy`."""
    times = psutil.cpu_times()
    return times.idle + getattr(times, "iowait", 0.0), sum(times)


def machine_busy(before: tuple[float, float], after: tuple[float, float]) -> float:
    """The share of all the machine's cores that was busy between two
    :func:`cpu_sample` samples."""
    idle, total = after[0] - before[0], after[1] - before[1]
    return round(1.0 - idle / total, 3) if total > 0 else 0.0


def variant(row: dict) -> str:
    """A run's mode as the bench compares it: ``host best-effort`` and
    ``host barrier`` for ``coalesce`` host, else the mode (``off`` ignores
    ``coalesce``)."""
    host = row.get("coalesce") == "host" and row["mode"] != "off"
    return f"host {row['mode']}" if host else row["mode"]


def sweeps(rows: list[dict]) -> list[Sweep]:
    """The sweeps of the verified scale runs in ``rows``, by section and mode."""
    out = []
    for section, axis in SECTIONS.items():
        picked = [r for r in rows if r.get("section") == section and r.get("verified")]
        for mode in dict.fromkeys(variant(r) for r in picked):
            by_n: dict[int, list[dict]] = {}
            for r in picked:
                if variant(r) == mode:
                    by_n.setdefault(r[axis], []).append(r)
            points = [_point(n, runs) for n, runs in sorted(by_n.items())]
            out.append(Sweep(section, axis, mode, points))
    return out


def _point(n: int, runs: list[dict]) -> Point:
    row = sorted(runs, key=lambda r: r["rows_per_s"])[len(runs) // 2]
    return Point(
        n=n,
        processes=row["groups"] * row["workers"],
        runs=len(runs),
        rows_per_s=row["rows_per_s"],
        parts_per_append=row["data_parts_per_append"] + row["inline_parts_per_append"],
        latency_ms_p50=row["append_latency_ms_p50"],
        machine_busy=row.get("machine_busy", 0.0),
        cpu_cores=row.get("cpu_cores", {}),
        busiest=row.get("busiest", ""),
        busiest_core=row.get("busiest_core", 0.0),
        rows_per_s_range=_range(runs, lambda r: r["rows_per_s"]),
        parts_per_append_range=_range(
            runs, lambda r: r["data_parts_per_append"] + r["inline_parts_per_append"]
        ),
        latency_ms_p50_range=_range(runs, lambda r: r["append_latency_ms_p50"]),
    )


def _range(runs: list[dict], value) -> tuple[float, float]:
    values = [value(r) for r in runs]
    return min(values), max(values)


def stop(sweep: Sweep, cores: int) -> Stop:
    """Where ``sweep`` stops scaling (see :class:`Stop`) and why, from what
    the run measured: more worker processes than ``cores``, the machine's
    CPUs saturated, one process using a whole core (the bottleneck), or the
    cluster using fewer cores than it has (waiting)."""
    points = sweep.points
    for before, after in itertools.pairwise(points):
        linear = after.processes / before.processes
        if after.rows_per_s / before.rows_per_s - 1 < GAIN * (linear - 1):
            return Stop(before, after, _why(after, cores))
    return Stop(points[-1], None, "")


def _why(point: Point, cores: int) -> str:
    reasons = []
    if point.processes > cores:
        reasons.append(f"{point.processes} worker processes share the machine's {cores} cores")
    if point.machine_busy >= MACHINE_SATURATED:
        reasons.append(
            f"the CPUs were {point.machine_busy:.0%} busy (every process on the machine)"
        )
    if point.busiest_core >= SATURATED:
        reasons.append(
            f"{point.busiest} used {point.busiest_core:.2f} of a core: it is the bottleneck"
        )
    elif point.busiest:
        reasons.append(
            f"the busiest process, {point.busiest}, used {point.busiest_core:.2f} of a core"
        )
    if point.cpu_cores:
        total = sum(point.cpu_cores.values())
        used = ", ".join(f"{kind} {n:.2f}" for kind, n in point.cpu_cores.items())
        reasons.append(f"the cluster used {total:.2f} of {cores} cores ({used})")
        if total < MACHINE_SATURATED * cores and point.busiest_core < SATURATED:
            reasons.append(
                "other processes on the machine held the rest"
                if point.machine_busy >= MACHINE_SATURATED
                else "the rest of the time it waited (handoffs, fsyncs, appends)"
            )
    return "; ".join(reasons)


def report_lines(rows: list[dict], cores: int) -> list[str]:
    """``report.md``'s account of the scale sweeps: per sweep, how far it
    scaled (speed-up over its first point and share of linear) and where and
    why it stopped."""
    found = sweeps(rows)
    if not found:
        return []
    lines = [
        "",
        "## Where scaling stops",
        "",
        f"Rows per worker per interval are fixed, so ideal scaling is linear. A sweep stops "
        f"scaling at the first step that raises rows/s by less than {GAIN:.0%} of what linear "
        f"scaling would (doubling the workers: less than x{1 + GAIN:.1f}). The machine has "
        f"{cores} cores; the reasons come from the run's CPU use.",
        "",
        "| sweep | mode | scales to | speed-up | of linear | then | why |",
        "|---|---|---|---|---|---|---|",
    ]
    for sweep in found:
        first = sweep.points[0]
        end = stop(sweep, cores)
        speedup = end.last.rows_per_s / max(first.rows_per_s, 1e-9)
        linear = speedup / (end.last.processes / first.processes)
        then = "still scaling at the largest size"
        if end.next is not None:
            step = end.next.rows_per_s / end.last.rows_per_s
            then = f"{sweep.axis}={end.next.n}: rows/s x{step:.2f}"
        lines.append(
            f"| {sweep.section} | {sweep.mode} | {sweep.axis}={end.last.n} | x{speedup:.2f} | "
            f"{linear:.0%} | {then} | {end.why or '-'} |"
        )
    return lines + _curves(found)


def _curves(found: list[Sweep]) -> list[str]:
    """Each sweep's points: rows/s, parts per append and append latency p50."""
    lines = ["", "Each point (median of its repeats): rows/s, parts per append, p50 ms."]
    for section in SECTIONS:
        mine = [s for s in found if s.section == section]
        if not mine:
            continue
        ns = sorted({p.n for s in mine for p in s.points})
        lines += [
            "",
            f"| {section} | " + " | ".join(f"{mine[0].axis}={n}" for n in ns) + " |",
            "|---|" + "---|" * len(ns),
        ]
        for sweep in mine:
            by_n = {p.n: p for p in sweep.points}
            cells = [
                f"{by_n[n].rows_per_s:,.0f}, {by_n[n].parts_per_append:.2f}, "
                f"{by_n[n].latency_ms_p50:.0f}"
                if n in by_n
                else "-"
                for n in ns
            ]
            lines.append(f"| {sweep.mode} | " + " | ".join(cells) + " |")
    return lines


def plot(rows: list[dict], out: Path, cores: int) -> list[Path]:
    """Per sweep axis, rows/s (with each mode's ideal linear line), parts per
    append and append latency p50 against the worker processes in all, the
    machine's ``cores`` marked; returns the PNG files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .._figures import add_caption, caption, legend_beside, save

    written = []
    found = sweeps(rows)
    for section, axis in SECTIONS.items():
        mine = [s for s in found if s.section == section]
        if not mine:
            continue
        fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
        for k, sweep in enumerate(mine):
            color = f"C{k}"
            xs = [p.processes for p in sweep.points]
            first = sweep.points[0]
            for ax, figure in zip(axes, ("rows_per_s", "parts_per_append", "latency_ms_p50"),
                                  strict=True):  # fmt: skip
                ys = [getattr(p, figure) for p in sweep.points]
                spans = [getattr(p, f"{figure}_range") for p in sweep.points]
                ax.errorbar(xs, ys, yerr=[[y - lo for y, (lo, _) in zip(ys, spans, strict=True)],
                                          [hi - y for y, (_, hi) in zip(ys, spans, strict=True)]],
                            fmt="o-", capsize=3, color=color, label=sweep.mode)  # fmt: skip
            axes[0].plot(
                xs,
                [first.rows_per_s * x / xs[0] for x in xs],
                ":",
                color=color,
                label=f"{sweep.mode}: ideal (linear)",
            )
        axes[0].set_yscale("log")  # the ideal line stays straight, the measured ones readable
        titles = (
            "rows/s (median of repeats, bars: lowest to highest)",
            "parts per append (the median-rows/s run's; bars: all repeats)",
            "append latency p50 (the median-rows/s run's; bars: all repeats)",
        )
        units = ("rows/s (log scale)", "parts per append", "p50 append latency (ms)")
        fixed = "G=1" if axis == "workers" else f"W={_fixed_workers(rows, section)}"
        ticks = {p.processes: p.n for sweep in mine for p in sweep.points}
        labels = [f"{t}\n{axis[0].upper()}={n}" for t, n in sorted(ticks.items())]
        for ax, title, unit in zip(axes, titles, units, strict=True):
            ax.axvline(cores, color="grey", linestyle="--", label=f"{cores} cores")
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted(ticks), labels)
            ax.set_xlabel(f"worker processes ({axis} grow, {fixed})")
            ax.set_ylabel(unit)
            ax.set_title(title, fontsize=10)
        for ax in axes[1:]:
            ax.set_ylim(bottom=0)
        legend_beside(axes[2], handles=axes[0].get_legend_handles_labels()[0])
        fig.tight_layout()
        add_caption(fig, caption())
        written.append(save(fig, out / f"{section}.png"))
    return written


def _fixed_workers(rows: list[dict], section: str) -> int:
    return next(r["workers"] for r in rows if r.get("section") == section)
