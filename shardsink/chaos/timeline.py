"""A chaos run over time, for ``chaos --out DIR``: what it appended, how long
each append took, each fault and each restart, as ``timeline.json`` and the
picture ``timeline.png``.

Times are seconds since the run started (the nemesis's clock). Appends come
from the coordinators' ``--events`` lines (each says when it was appended);
a fault point firing from the run's ``fired.jsonl`` (when it fired, in which
process); a signal (a kill or a pause, which has a window: until the process
is continued) at the time the schedule gave it, since the nemesis sends it
then (later only while the cluster restarts and there is no process of the
kind to hit). Group and consensus restarts are where a coordinator's
counts of them grow; coordinator restarts are its new starts.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from .. import faults
from .schedule import Event, kind_of

#: Seconds per bar of the throughput panel.
BIN_S = 1.0


class Mark(msgspec.Struct, frozen=True):
    """Something at ``t`` (seconds since the start), lasting ``until`` if it
    has a window; ``kind`` a fault kind or a restart's (``group restart``,
    ``consensus restart``, ``coordinator restart``), ``text`` in words."""

    t: float
    kind: str
    text: str
    until: float | None = None


class Timeline(msgspec.Struct, kw_only=True):
    """A run: wall-clock ``started`` (seconds since the epoch), its
    ``duration_s`` of faults and ``ran_s`` in all, the appends as ``(t,
    latency_ms)``, the faults and the restarts."""

    started: float
    duration_s: float
    ran_s: float
    appends: list[tuple[float, float]]
    faults: list[Mark]
    restarts: list[Mark]


def collect(
    *,
    started: float,
    duration_s: float,
    ran_s: float,
    events_path: Path,
    fault_dir: Path,
    schedule: list[Event],
    coordinator_starts: list[float],
) -> Timeline:
    """The timeline of a run that ``started`` (wall clock) from its files:
    the ``--events`` lines at ``events_path``, the firings in ``fault_dir``,
    its ``schedule`` and the wall-clock times its coordinators were started."""
    appends, restarts = _appends(events_path, started)
    restarts += [
        Mark(t - started, "coordinator restart", "the coordinator started again")
        for t in coordinator_starts[1:]
    ]
    marks = [_signal_mark(e) for e in schedule if e.how == "signal"]
    for fired in faults.fired(fault_dir):
        kind = kind_of(fired["point"], fired["action"])
        where = fired.get("role") or "a process"
        text = f"{fired['point']} {fired['action']} in {where}"
        marks.append(Mark(fired["time"] - started, kind, text))
    return Timeline(
        started=started,
        duration_s=duration_s,
        ran_s=ran_s,
        appends=appends,
        faults=sorted(marks, key=lambda m: m.t),
        restarts=sorted(restarts, key=lambda m: m.t),
    )


def _signal_mark(event: Event) -> Mark:
    if event.pause_s:
        return Mark(
            event.at_s, event.kind, f"paused for {event.pause_s:g} s", event.at_s + event.pause_s
        )
    return Mark(event.at_s, event.kind, "killed (SIGKILL)")


def _appends(path: Path, started: float) -> tuple[list[tuple[float, float]], list[Mark]]:
    """The appends of the ``--events`` file at ``path`` and the group and
    consensus restarts its counts show, each where the count grew."""
    appends: list[tuple[float, float]] = []
    restarts: list[Mark] = []
    last: dict[int, dict[str, int]] = {}
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        lines = []
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line cut by a killed coordinator
            continue
        if "time" not in record:
            continue
        t = record["time"] - started
        if record.get("kind", "append") == "append":
            appends.append((round(t, 3), record["latency_ms"]))
        before = last.setdefault(record["coordinator"], {})
        for key, kind in (
            ("restarts", "group restart"),
            ("consensus_restarts", "consensus restart"),
        ):
            grew = record.get(key, 0) - before.get(key, 0)
            if grew > 0:
                text = f"{grew} {kind}{'s' if grew > 1 else ''} before this line"
                restarts.append(Mark(round(t, 3), kind, text))
            before[key] = record.get(key, 0)
    return appends, restarts


def write(timeline: Timeline, out: Path, caption_text: str) -> list[Path]:
    """Write ``timeline.json`` and ``timeline.png`` into ``out``; the files."""
    out.mkdir(parents=True, exist_ok=True)
    data = out / "timeline.json"
    data.write_bytes(msgspec.json.format(msgspec.json.encode(timeline)) + b"\n")
    picture = out / "timeline.png"
    plot(timeline, picture, caption_text)
    return [data, picture]


def plot(timeline: Timeline, path: Path, caption_text: str) -> None:
    """Throughput (intervals appended per second) over latency (each append,
    log scale), faults as shaded windows (pauses) or lines, restarts as
    marks, the end of the faults as a dashed line; captioned."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .._figures import add_caption

    end = max(timeline.ran_s, max((t for t, _ in timeline.appends), default=0.0))
    fig, (rate, latency) = plt.subplots(2, 1, figsize=(13, 7.5), sharex=True)
    bins = max(1, int(end / BIN_S) + 1)
    counts = [0] * bins
    for t, _ in timeline.appends:
        if 0 <= t < bins * BIN_S:
            counts[int(t / BIN_S)] += 1
    rate.bar([i * BIN_S for i in range(bins)], [c / BIN_S for c in counts], BIN_S,
             align="edge", color="#2f6fdf", label="intervals appended")  # fmt: skip
    rate.set_ylabel(f"intervals appended per second\n({BIN_S:g} s bars)")
    rate.set_ylim(bottom=0)
    if timeline.appends:
        latency.scatter(*zip(*timeline.appends, strict=True), s=6, color="#2f6fdf",
                        label="an append")  # fmt: skip
        latency.set_yscale("log")
    latency.set_ylabel("append latency (ms, log scale)")
    latency.set_xlabel("seconds since the run started")
    _draw_faults(timeline, (rate, latency))
    _draw_restarts(timeline, (rate, latency))
    for ax in (rate, latency):
        ax.axvline(timeline.duration_s, color="black", linestyle="--", linewidth=1)
        stopping = "stopping: readers, maintenance,\nthen the coordinator (SIGINT)"
        ax.axvspan(timeline.ran_s, end + BIN_S, color="grey", alpha=0.12, label=stopping)
        ax.set_xlim(0, end + BIN_S)
    rate.annotate("faults end", (timeline.duration_s, 1), xycoords=("data", "axes fraction"),
                  xytext=(3, -12), textcoords="offset points", fontsize=8)  # fmt: skip
    rate.set_title(
        f"chaos run: {len(timeline.appends)} intervals appended, {len(timeline.faults)} faults, "
        f"{len(timeline.restarts)} restarts marked"
    )
    handles: dict[str, object] = {}
    for ax in (rate, latency):
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    fig.legend(handles.values(), handles.keys(), loc="center left", fontsize=8,
               bbox_to_anchor=(0.80, 0.55))  # fmt: skip
    fig.tight_layout(rect=(0, 0, 0.8, 1))
    add_caption(fig, caption_text)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _draw_faults(timeline: Timeline, axes) -> None:
    """Each fault: a shaded window if it lasts (a pause), else a thin line;
    one colour per kind."""
    kinds = sorted({m.kind for m in timeline.faults})
    colours = {kind: f"C{1 + i}" for i, kind in enumerate(kinds)}
    for mark in timeline.faults:
        for ax in axes:
            if mark.until is not None:
                ax.axvspan(mark.t, mark.until, color=colours[mark.kind], alpha=0.25,
                           label=f"fault: {mark.kind}")  # fmt: skip
            else:
                ax.axvline(mark.t, color=colours[mark.kind], linewidth=1.2, alpha=0.9,
                           label=f"fault: {mark.kind}")  # fmt: skip


def _draw_restarts(timeline: Timeline, axes) -> None:
    """Restarts as triangles along the top of the throughput panel, the
    coordinator's as dotted lines across both."""
    styles = {"group restart": ("v", "#c0392b"), "consensus restart": ("s", "#7a3fc0")}
    rate = axes[0]
    for mark in timeline.restarts:
        if mark.kind == "coordinator restart":
            for ax in axes:
                ax.axvline(mark.t, color="black", linestyle=":", linewidth=1.5, label=mark.kind)
            continue
        marker, colour = styles.get(mark.kind, ("o", "black"))
        rate.plot([mark.t], [1.0], marker=marker, color=colour, markersize=8, linestyle="none",
                  transform=rate.get_xaxis_transform(), clip_on=False, label=mark.kind)  # fmt: skip
