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
counts of them grow; coordinator restarts are its new starts. A network
fault between emulated hosts is a band from its start to its heal on the
hosts it hit (and, lighter, on the other side of a partition), drawn in a
panel of the hosts beside the parts each append took from each host.
"""

from __future__ import annotations

import json
from collections.abc import Callable
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


class Band(msgspec.Struct, frozen=True):
    """A network fault from ``t`` to its heal ``until`` (seconds since the
    start): its ``kind``, the ``hosts`` it hit, the ``peers`` they were cut
    from (a partition's other side), its parameters in words."""

    t: float
    until: float
    kind: str
    hosts: tuple[str, ...]
    peers: tuple[str, ...]
    text: str


class Timeline(msgspec.Struct, kw_only=True):
    """A run: wall-clock ``started`` (seconds since the epoch), its
    ``duration_s`` of faults and ``ran_s`` in all, the appends as ``(t,
    latency_ms)``, the faults and the restarts; the network faults
    (``network``) and the parts of each append by host (``host_parts``:
    ``(t, host, parts)``, a host by its emulated name, ``h0``, or else
    ``host N`` by its index in the cluster)."""

    started: float
    duration_s: float
    ran_s: float
    appends: list[tuple[float, float]]
    faults: list[Mark]
    restarts: list[Mark]
    network: list[Band] = []
    host_parts: list[tuple[float, str, int]] = []


def collect(
    *,
    started: float,
    duration_s: float,
    ran_s: float,
    events_path: Path,
    fault_dir: Path,
    schedule: list[Event],
    coordinator_starts: list[float],
    host_names: dict[str, str] | None = None,
    started_monotonic: float | None = None,
) -> Timeline:
    """The timeline of a run that ``started`` (wall clock; ``started_monotonic``
    on the monotonic clock) from its files: the ``--events`` lines at
    ``events_path``, the firings in ``fault_dir``, its ``schedule`` and the
    wall-clock times its coordinators were started; ``host_names``: emulated
    hosts' names by address. A line or firing that carries the monotonic
    clock is placed by it: a host's skewed wall clock (a ``clock-skew``)
    moved its ``time`` by up to minutes."""
    since = _since(started, started_monotonic)
    appends, restarts, host_parts = _appends(events_path, since, host_names or {})
    restarts += [
        Mark(t - started, "coordinator restart", "the coordinator started again")
        for t in coordinator_starts[1:]
    ]
    marks = [_signal_mark(e) for e in schedule if e.how == "signal"]
    bands = []
    for fired in faults.fired(fault_dir):
        if fired["action"] == "network":
            bands.append(_band(fired, started))
            continue
        kind = kind_of(fired["point"], fired["action"])
        where = fired.get("role") or "a process"
        text = f"{fired['point']} {fired['action']} in {where}"
        marks.append(Mark(since(fired), kind, text))
    return Timeline(
        started=started,
        duration_s=duration_s,
        ran_s=ran_s,
        appends=appends,
        faults=sorted(marks, key=lambda m: m.t),
        restarts=sorted(restarts, key=lambda m: m.t),
        network=sorted(bands, key=lambda b: b.t),
        host_parts=host_parts,
    )


def _band(fired: dict, started: float) -> Band:
    """A network fault's record in ``fired.jsonl`` as a band."""
    params = ", ".join(f"{k} {v:g}" for k, v in fired.get("params", {}).items())
    return Band(
        round(fired["time"] - started, 3),
        round(fired["end"] - started, 3),
        fired["point"],
        tuple(fired.get("hosts", ())),
        tuple(fired.get("peers", ())),
        params,
    )


def recoveries(timeline: Timeline) -> list[dict]:
    """Each network fault's heal and the time from it to the next append
    (``recovered_s``; ``None``: no append came after it)."""
    times = sorted(t for t, _ in timeline.appends)
    out = []
    for band in timeline.network:
        after = next((t for t in times if t >= band.until), None)
        out.append({
            "kind": band.kind, "hosts": list(band.hosts), "peers": list(band.peers),
            "start_s": band.t, "healed_s": band.until,
            "recovered_s": None if after is None else round(after - band.until, 3),
        })  # fmt: skip
    return out


def _signal_mark(event: Event) -> Mark:
    if event.pause_s:
        return Mark(
            event.at_s, event.kind, f"paused for {event.pause_s:g} s", event.at_s + event.pause_s
        )
    return Mark(event.at_s, event.kind, "killed (SIGKILL)")


def _since(started: float, started_monotonic: float | None) -> Callable[[dict], float]:
    """Seconds since the run started of a record with ``time`` (wall clock)
    and, if it has one, ``monotonic``, which is preferred."""

    def since(record: dict) -> float:
        if started_monotonic is not None and "monotonic" in record:
            return record["monotonic"] - started_monotonic
        return record["time"] - started

    return since


def _appends(
    path: Path, since: Callable[[dict], float], host_names: dict[str, str]
) -> tuple[list[tuple[float, float]], list[Mark], list[tuple[float, str, int]]]:
    """The appends of the ``--events`` file at ``path``, the group and
    consensus restarts its counts show, each where the count grew, and the
    parts of each append by host (named by ``host_names`` of its address)."""
    appends: list[tuple[float, float]] = []
    restarts: list[Mark] = []
    host_parts: list[tuple[float, str, int]] = []
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
        t = since(record)
        if record.get("kind", "append") == "append":
            appends.append((round(t, 3), record["latency_ms"]))
            addresses = record.get("host_addresses", {})
            for index, parts in record.get("parts_by_host", {}).items():
                name = host_names.get(addresses.get(index, ""), f"host {index}")
                host_parts.append((round(t, 3), name, parts))
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
    return appends, restarts, host_parts


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
    hosts = sorted({name for _, name, _ in timeline.host_parts}
                   | {h for b in timeline.network for h in (*b.hosts, *b.peers)})  # fmt: skip
    if timeline.network or len(hosts) > 1:
        fig, (rate, latency, by_host) = plt.subplots(
            3, 1, figsize=(13, 10), sharex=True, height_ratios=(3, 3, 1 + 0.5 * len(hosts))
        )
        _draw_hosts(timeline, by_host, hosts)
    else:
        fig, (rate, latency) = plt.subplots(2, 1, figsize=(13, 7.5), sharex=True)
        by_host = None
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
    for ax in (rate, latency, *([by_host] if by_host is not None else [])):
        ax.axvline(timeline.duration_s, color="black", linestyle="--", linewidth=1)
        stopping = "stopping: readers, maintenance,\nthen the coordinator (SIGINT)"
        ax.axvspan(timeline.ran_s, end + BIN_S, color="grey", alpha=0.12, label=stopping)
        ax.set_xlim(0, end + BIN_S)
    rate.annotate("faults end", (timeline.duration_s, 1), xycoords=("data", "axes fraction"),
                  xytext=(3, -12), textcoords="offset points", fontsize=8)  # fmt: skip
    faults_n = len(timeline.faults) + len(timeline.network)
    rate.set_title(
        f"chaos run: {len(timeline.appends)} intervals appended, {faults_n} faults, "
        f"{len(timeline.restarts)} restarts marked"
    )
    handles: dict[str, object] = {}
    for ax in (rate, latency, *([by_host] if by_host is not None else [])):
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


def _draw_hosts(timeline: Timeline, ax, hosts: list[str]) -> None:
    """A row per host: a dot per append the host had parts in (larger for
    more parts), each network fault a bar on the hosts it hit (hatched on
    a partition's other side); one colour per kind."""
    rows = {name: i for i, name in enumerate(hosts)}
    kinds = sorted({b.kind for b in timeline.network})
    colours = {kind: f"C{1 + i}" for i, kind in enumerate(kinds)}
    for band in timeline.network:
        width = [(band.t, band.until - band.t)]
        for names, hatch, alpha in ((band.hosts, None, 0.45), (band.peers, "//", 0.15)):
            for name in names:
                ax.broken_barh(width, (rows[name] - 0.4, 0.8), color=colours[band.kind],
                               alpha=alpha, hatch=hatch, label=f"network: {band.kind}")  # fmt: skip
    if timeline.host_parts:
        t, names, parts = zip(*timeline.host_parts, strict=True)
        ax.scatter(t, [rows[n] for n in names], s=[4 + 2 * p for p in parts], color="#2f6fdf",
                   label="parts appended from a host")  # fmt: skip
    ax.set_yticks(range(len(hosts)), hosts)
    ax.set_ylim(-0.6, len(hosts) - 0.4)
    ax.set_ylabel("hosts: appends' parts,\nnetwork faults (hatched:\nthe side cut off from)")
    ax.set_xlabel("seconds since the run started")


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
