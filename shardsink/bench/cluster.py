"""``shardsink bench cluster``: the scale-out matrix, against a Delta Lake peer.

Every run gets a fresh data directory, runs a cluster (or the Delta peer) on
the embedded default stores, reads the shard back and verifies it. A run that
fails or does not verify is kept in the results with ``verified: false`` and
its ``error``, never dropped. Output, in ``--out DIR``:

- ``results.json``: ``{"runs": [...]}`` in the schema of DESIGN.md section 9,
  plus ``section``, ``repeat``, ``compaction``, ``error``, ``peak_rss``,
  where the CPU went (``machine_busy``, ``cpu_cores`` by process kind,
  ``busiest`` and ``busiest_core``: see :func:`shardsink.bench.scale.cpu_use`)
  and the peer's ``commits`` / ``files_per_interval`` / ``commit_bytes_per_interval``;
- ``report.md``: the exact command, the machine, one table per section, the
  checks the design promises (pass or fail) and side-by-side ratios, and for
  the scale sweeps where scaling stops and why;
- PNG plots: parts, blob PUTs and diff bytes per append by mode and shape;
  hydration wall time by threshold; append latency; the scale curves.

Ratios are measured side by side in one run: runs that are compared are
interleaved (repeat 0 of each, then repeat 1, ...) and compared by median.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import msgspec

from ..config import AUTO, ClusterConfig
from ..workloads import Workload
from . import scale

MIB = 1 << 20
UNLIMITED = 1 << 50  # "everything through the builder"
CLUSTER_MODES = ("off", "best-effort", "barrier")
#: What the trickle and scale sections compare side by side: ``(mode,
#: coalesce)``, shown as :func:`~shardsink.bench.scale.variant` names them.
VARIANTS = (
    ("off", "group"),
    ("best-effort", "group"),
    ("barrier", "group"),
    ("best-effort", "host"),
    ("barrier", "host"),
)
COMPACT_EVERY = 10  # intervals between compactions when compaction is on
#: ClusterConfig fields each run of a matrix sets itself (a config's
#: ``[cluster]`` table may set any other).
RUN_FIELDS = (
    "groups",
    "workers",
    "mode",
    "coalesce",
    "shared_max_bytes",
    "workload",
    "rows_per_interval",
    "snapshot_rows",
    "intervals",
    "pace",
    "data_dir",
    "blob",
    "consensus",
    "verify",
)


class BenchClusterConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What ``bench cluster`` runs: ``matrix`` (one of :data:`MATRICES`) into
    ``out`` (required to run; a file may leave it to ``--out``), each cluster
    run from ``cluster``: ClusterConfig fields every run starts from
    (``start``, ``best_effort_linger_ms``,
    ``blob_target_bytes``, ...), all but :data:`RUN_FIELDS`, which each run
    sets itself (``ValueError`` naming such a key)."""

    out: str | None = None
    matrix: Literal["default", "quick", "trickle", "scale", "auto", "latency"] = "default"
    cluster: ClusterConfig = msgspec.field(default_factory=ClusterConfig)


def bench_config(fields: dict, source: str) -> BenchClusterConfig:
    """A :class:`BenchClusterConfig` of ``fields`` (:func:`~shardsink.config.build`),
    refusing a ``cluster`` key of :data:`RUN_FIELDS` by name."""
    from ..config import build

    taken = sorted(set(fields.get("cluster") or {}) & set(RUN_FIELDS))
    if taken:
        raise ValueError(
            f"{source}: cluster.{taken[0]} is set by each run of the matrix; the cluster "
            f"table may set any ClusterConfig field but {', '.join(RUN_FIELDS)}"
        )
    return build(BenchClusterConfig, fields, source=source)


SECTIONS = ("small-writes", "trickle", "latency", "compaction", "peer", "hydrate", *scale.SECTIONS)

if TYPE_CHECKING:
    from ..cluster.cluster import Cluster


class RunSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One run of the matrix."""

    section: str
    mode: str
    groups: int
    workers: int
    workload: str
    rows_per_interval: int
    intervals: int
    snapshot_rows: int = 0
    shared_max_bytes: int | str = MIB
    compaction: bool = False
    repeat: int = 0
    coalesce: str = "group"

    @property
    def label(self) -> str:
        row = msgspec.structs.asdict(self)
        return f"{scale.variant(row)} {self.workload} {describe(row)}"


def _bytes(n: int | str) -> str:
    if n == AUTO:
        return AUTO
    if n >= UNLIMITED:
        return "unlimited"
    return f"{n // MIB} MiB" if n >= MIB and n % MIB == 0 else str(n)


def matrix(name: str) -> list[RunSpec]:
    """The runs of matrix ``name`` (see :data:`MATRICES`), interleaved by repeat:
    ``default``; ``quick``, its cut-down version; ``trickle``, only its trickle
    section (every variant of :data:`VARIANTS`, host coalescing included, at
    4x8 with 128 and 32 rows per interval); ``scale``,
    the scale-out sweeps (:func:`scale_matrix`); ``auto``, small writes and
    hydration with ``--shared-max-bytes auto`` against 1 MiB and ``off``."""
    if name not in MATRICES:
        raise ValueError(f"unknown matrix {name!r}; choose one of {', '.join(MATRICES)}")
    return MATRICES[name]()


def _build(
    n: int,
    shapes: list[tuple[int, int, int]],
    hydrate: tuple[int, int],
    repeats: int,
) -> list[RunSpec]:
    """A matrix: ``n`` intervals per run; small writes at 1x8 with 1000 rows;
    every mode at each ``(groups, workers, rows)`` of ``shapes``; compaction on
    and off and the Delta peer at the first of them; hydration of
    ``hydrate = (snapshot rows, workers)`` by threshold, ``repeats`` times."""
    runs = _small_writes(n)
    runs += _trickles(shapes, n)
    g, w, r = shapes[0]
    runs += [_trickle("compaction", "best-effort", g, w, r, n, compaction=c) for c in (False, True)]
    runs += [
        _trickle("peer", mode, g, w, r, n) for mode in ("delta-per-worker", "delta-per-interval")
    ]
    snapshot, workers = hydrate
    for repeat in range(repeats):
        runs += _hydrate(snapshot, 1000, 4, workers=workers, repeat=repeat)
    return runs


def _small_writes(n: int) -> list[RunSpec]:
    """1x8, 1000 rows an interval: every mode, and best-effort with ``auto``."""
    runs = [_trickle("small-writes", mode, 1, 8, 1000, n) for mode in CLUSTER_MODES]
    return [*runs, _trickle("small-writes", "best-effort", 1, 8, 1000, n, shared_max_bytes=AUTO)]


def _trickle(section: str, mode: str, g: int, w: int, r: int, n: int, **extra) -> RunSpec:
    return RunSpec(
        section=section,
        mode=mode,
        groups=g,
        workers=w,
        workload="trickle",
        rows_per_interval=r,
        intervals=n,
        **extra,
    )


def _trickles(shapes: list[tuple[int, int, int]], n: int) -> list[RunSpec]:
    """Every variant (:data:`VARIANTS`) at each ``(groups, workers, rows)`` of
    ``shapes``, ``n`` intervals."""
    return [
        _trickle("trickle", mode, *shape, n, coalesce=coalesce)
        for shape in shapes
        for mode, coalesce in VARIANTS
    ]


#: The trickle shapes of the default matrix.
TRICKLE_SHAPES = [(4, 8, 128), (4, 8, 32)]


def _default() -> list[RunSpec]:
    return _build(40, TRICKLE_SHAPES, (2_000_000, 8), repeats=3)


def _trickle_only() -> list[RunSpec]:
    return _trickles(TRICKLE_SHAPES, 40)


def _quick() -> list[RunSpec]:
    return _build(10, [(2, 4, 128)], (200_000, 4), repeats=3)


def _auto() -> list[RunSpec]:
    """What ``--shared-max-bytes auto`` must show: small writes, then hydration
    of 2M rows at 1x8 against ``off`` and 1 MiB, three times interleaved."""
    runs = _small_writes(40)
    thresholds = [("off", MIB), ("best-effort", MIB), ("best-effort", AUTO)]
    for repeat in range(3):
        runs += _hydrate(2_000_000, 1000, 4, workers=8, repeat=repeat, thresholds=thresholds)
    return runs


#: Hydration's modes and thresholds: ``off``, best-effort sharing nothing, at
#: 1 MiB, everything, and ``auto``.
HYDRATE_THRESHOLDS = [
    ("off", MIB),
    ("best-effort", 0),
    ("best-effort", MIB),
    ("best-effort", UNLIMITED),
    ("best-effort", AUTO),
]


def _hydrate(
    snapshot: int,
    r: int,
    n: int,
    *,
    workers: int,
    repeat: int,
    thresholds: list[tuple[str, int | str]] = HYDRATE_THRESHOLDS,
) -> list[RunSpec]:
    """Hydration by threshold: one run of each ``(mode, shared_max_bytes)``."""
    return [
        RunSpec(
            section="hydrate",
            mode=mode,
            groups=1,
            workers=workers,
            workload="hydrate",
            rows_per_interval=r,
            snapshot_rows=snapshot,
            intervals=n,
            shared_max_bytes=smb,
            repeat=repeat,
        )
        for mode, smb in thresholds
    ]


#: The ``(mode, coalesce)`` pairs the scale sweeps compare.
SCALE_MODES = VARIANTS
#: Workers at one group, then groups of :data:`SCALE_GROUP_WORKERS` workers.
SCALE_WORKERS = (1, 2, 4, 8, 16, 32)
SCALE_GROUPS = (1, 2, 4, 8)
SCALE_GROUP_WORKERS = 4
#: Trickle rows per worker per interval: every worker has the same work
#: whatever the shape, so ideal scaling is linear.
SCALE_ROWS_PER_WORKER = 5000
SCALE_INTERVALS = 20
#: Runs of each point; the report and plots take the median (a shared
#: 2-core machine is noisy).
SCALE_REPEATS = 3


def scale_matrix(
    workers: tuple[int, ...],
    groups: tuple[int, ...],
    *,
    group_workers: int,
    rows_per_worker: int,
    intervals: int,
    repeats: int,
) -> list[RunSpec]:
    """The scale sweeps (see :mod:`shardsink.bench.scale`): every mode of
    :data:`SCALE_MODES` at one group of each of ``workers``, then at each of
    ``groups`` groups of ``group_workers``; ``rows_per_worker`` trickle rows
    per worker per interval, ``intervals`` intervals a run; all of it
    ``repeats`` times, interleaved."""
    shapes = [("scale-workers", 1, w) for w in workers]
    shapes += [("scale-groups", g, group_workers) for g in groups]
    return [
        _trickle(
            section,
            mode,
            g,
            w,
            rows_per_worker * g * w,
            intervals,
            repeat=repeat,
            coalesce=coalesce,
        )
        for repeat in range(repeats)
        for section, g, w in shapes
        for mode, coalesce in SCALE_MODES
    ]


def _scale() -> list[RunSpec]:
    return scale_matrix(
        SCALE_WORKERS,
        SCALE_GROUPS,
        group_workers=SCALE_GROUP_WORKERS,
        rows_per_worker=SCALE_ROWS_PER_WORKER,
        intervals=SCALE_INTERVALS,
        repeats=SCALE_REPEATS,
    )


#: What sharing may add to ``off``'s p50 append latency, by ``(groups,
#: workers)`` at 128 rows per interval (issue 17's bound).
LATENCY_BOUNDS_MS = {(1, 8): 2.0, (4, 8): 5.0}
LATENCY_INTERVALS = 200
LATENCY_REPEATS = 3


def _latency() -> list[RunSpec]:
    """Every variant at 1x8 and 4x8 with 128 rows per interval,
    :data:`LATENCY_REPEATS` times interleaved, for the p50 each adds to off's."""
    return [
        _trickle("latency", mode, g, w, 128, LATENCY_INTERVALS, coalesce=coalesce, repeat=repeat)
        for repeat in range(LATENCY_REPEATS)
        for g, w in LATENCY_BOUNDS_MS
        for mode, coalesce in VARIANTS
    ]


MATRICES: dict[str, Callable[[], list[RunSpec]]] = {
    "default": _default,
    "quick": _quick,
    "trickle": _trickle_only,
    "scale": _scale,
    "auto": _auto,
    "latency": _latency,
}


# --- running ---------------------------------------------------------------------------


def run_one(spec: RunSpec, work_dir: Path, base: ClusterConfig | None = None) -> dict:
    """Run ``spec`` in a fresh ``work_dir``, a cluster run from ``base``'s
    settings (see :class:`BenchClusterConfig`); never raises: a failure is a
    row with ``verified: false`` and the ``error``."""
    row = {**msgspec.structs.asdict(spec), "verified": False, "error": ""}
    try:
        if spec.mode.startswith("delta"):
            from .delta_peer import run_delta

            workload = Workload(spec.workload, spec.rows_per_interval, spec.snapshot_rows)
            row.update(
                run_delta(
                    spec.mode,
                    spec.groups,
                    spec.workers,
                    workload,
                    spec.intervals,
                    work_dir / "delta",
                )
            )
        else:
            row.update(_run_cluster(spec, work_dir, base or ClusterConfig()))
    except Exception as exc:
        row["error"] = f"{type(exc).__name__}: {exc}"
        row["traceback"] = traceback.format_exc(limit=5)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    return row


def _run_cluster(spec: RunSpec, work_dir: Path, base: ClusterConfig) -> dict:
    from ..cluster.cluster import Cluster

    config = msgspec.structs.replace(
        base,
        groups=spec.groups,
        workers=spec.workers,
        mode=spec.mode,
        coalesce=spec.coalesce,
        shared_max_bytes=spec.shared_max_bytes,
        workload=spec.workload,
        rows_per_interval=spec.rows_per_interval,
        snapshot_rows=spec.snapshot_rows,
        intervals=spec.intervals,
        pace="max",
        data_dir=str(work_dir / "data"),
        verify=False,
    )
    extra: dict = {}
    with Cluster(config) as cluster:
        cpu_before = _cpu_times(cluster)
        machine_before = scale.cpu_sample()
        started = time.monotonic()
        if spec.compaction:
            compacted = 0
            done = 0
            while done < spec.intervals:
                step = min(COMPACT_EVERY, spec.intervals - done)
                cluster.run(step)
                done += step
                compacted += cluster.shard.compact().applied
            extra["compactions"] = compacted
        else:
            cluster.run(spec.intervals)
        extra["machine_busy"] = scale.machine_busy(machine_before, scale.cpu_sample())
        extra.update(scale.cpu_use(cpu_before, _cpu_times(cluster), time.monotonic() - started))
        state = cluster.shard.state(refresh=True)
        extra["batches_in_state"] = len(state.batches)
        extra["thresholds"] = [r.shared_max_bytes for r in cluster.records]
        extra["parts_in_state"] = sum(len(b.parts) for b in state.batches.values())
        cluster.verify()
        stats = cluster.stats()
    row = msgspec.structs.asdict(stats)
    row["verified"] = bool(stats.verified)
    if not stats.verified:
        row["error"] = stats.verify_detail or "the shard does not match the workload"
    row.update(extra)
    return row


def _cpu_times(cluster: Cluster) -> scale.CpuTimes:
    return scale.cpu_times((p.kind, p.name, p.pid) for p in cluster.processes())


# --- reporting ---------------------------------------------------------------------------


def checks(rows: list[dict]) -> list[tuple[str, bool | None, str]]:
    """The design's promises, each ``(claim, passed or None if not measured, figures)``."""
    ok = [r for r in rows if r.get("verified")]
    out: list[tuple[str, bool | None, str]] = []

    def find(**kv) -> list[dict]:
        # rows of runs before coalesce existed coalesced per group
        return [
            r
            for r in ok
            if all(r.get(k, "group" if k == "coalesce" else None) == v for k, v in kv.items())
        ]

    def parts(row: dict) -> float:
        return row["data_parts_per_append"] + row["inline_parts_per_append"]

    barrier = [r for r in find(mode="barrier", coalesce="group") if r["workload"] == "trickle"]
    if barrier:
        counts = [(r["groups"], parts(r)) for r in barrier]
        out.append(
            (
                "barrier: data-or-inline parts per append == groups",
                all(abs(p - g) < 1e-9 for g, p in counts),
                ", ".join(f"{g} groups: {p:.2f}" for g, p in counts),
            )
        )
    for threshold, most, claim in (
        (MIB, 1.1, "best-effort 1x8, 1000-row writes: <= 1.1 parts per append (reference 1.05)"),
        (AUTO, 1.05, "best-effort auto 1x8, 1000-row writes: <= 1.05 parts per append"),
    ):
        small = find(section="small-writes", mode="best-effort", shared_max_bytes=threshold)
        if small:
            p = parts(small[0])
            out.append((claim, p <= most, f"{p:.3f}"))
    trickle = {"section": "trickle", "groups": 4, "workers": 8, "rows_per_interval": 128}
    off = find(mode="off", **trickle)
    for mode, coalesce, fewer in (("barrier", "group", 2.0), ("barrier", "host", 4.0)):
        bar = find(mode=mode, coalesce=coalesce, **trickle)
        if off and bar:
            name = scale.variant(bar[0])
            ratio = off[0]["diff_bytes_per_append"] / max(bar[0]["diff_bytes_per_append"], 1e-9)
            out.append(
                (
                    f"4x8 R=128: {name} diff bytes per append >= {fewer:g}x fewer than off's",
                    ratio >= fewer,
                    f"off/{name} = {ratio:.2f}x",
                )
            )
    for mode, most, claim in (
        ("barrier", 1.0, "4x8 R=128: host barrier 1.00 part per append"),
        ("best-effort", 1.1, "4x8 R=128: host best-effort <= 1.1 parts per append"),
    ):
        host = find(mode=mode, coalesce="host", **trickle)
        if host:
            p = parts(host[0])
            out.append((claim, p <= most + 1e-9, f"{p:.3f}"))
    out += _latency_checks(find)
    hyd_off = [r["wall_s"] for r in find(section="hydrate", mode="off")]
    for threshold, most in ((MIB, 1.10), (AUTO, 1.0)):
        walls = [
            r["wall_s"]
            for r in find(section="hydrate", mode="best-effort", shared_max_bytes=threshold)
        ]
        if hyd_off and walls:
            ratio = statistics.median(walls) / statistics.median(hyd_off)
            figures = f"{ratio:.3f}x ({len(walls)} vs {len(hyd_off)} runs)"
            claim = (
                f"hydrate: {_bytes(threshold)} threshold wall time <= {most:.2f}x off "
                "(medians, interleaved)"
            )
            out.append((claim, ratio <= most, figures))
    out.append(
        (
            "every run verified",
            all(r.get("verified") for r in rows),
            f"{sum(bool(r.get('verified')) for r in rows)}/{len(rows)}",
        )
    )
    return out


def _latency_checks(find: Callable[..., list[dict]]) -> list[tuple[str, bool | None, str]]:
    """Per shape of :data:`LATENCY_BOUNDS_MS`: the median p50 each sharing
    variant adds to off's median p50 (section ``latency``), within the bound."""
    out: list[tuple[str, bool | None, str]] = []
    for (g, w), most in LATENCY_BOUNDS_MS.items():
        shape = {"section": "latency", "groups": g, "workers": w}
        off = [r["append_latency_ms_p50"] for r in find(mode="off", **shape)]
        for mode, coalesce in VARIANTS[1:]:
            rows = find(mode=mode, coalesce=coalesce, **shape)
            if not off or not rows:
                continue
            added = statistics.median(r["append_latency_ms_p50"] for r in rows)
            added -= statistics.median(off)
            name = scale.variant(rows[0])
            out.append(
                (
                    f"{g}x{w} R=128: {name} adds <= {most:g} ms to off's p50 append latency",
                    added <= most,
                    f"{added:+.1f} ms (medians of {len(rows)} and {len(off)} runs)",
                )
            )
    return out


_COLUMNS = [
    ("mode", "mode", "{}"),
    ("shape", None, "{}"),
    ("data parts/append", "data_parts_per_append", "{:.2f}"),
    ("inline parts/append", "inline_parts_per_append", "{:.2f}"),
    ("blob PUTs", "blob_puts", "{:,}"),
    ("PUTs/append", None, "{:.2f}"),
    ("diff bytes/append", "diff_bytes_per_append", "{:,.0f}"),
    ("CaS/append", "cas_per_append", "{:.2f}"),
    ("wall s", "wall_s", "{:.2f}"),
    ("rows/s", "rows_per_s", "{:,.0f}"),
    ("p50 ms", "append_latency_ms_p50", "{:.1f}"),
    ("p99 ms", "append_latency_ms_p99", "{:.1f}"),
    ("CPU busy", "machine_busy", "{:.0%}"),
    ("busiest (core)", None, "{} {:.2f}"),
    ("verified", "verified", "{}"),
]


def _cell(row: dict, name: str, key: str | None, fmt: str) -> str:
    if name == "shape":
        return describe(row)
    if name == "mode":
        return scale.variant(row)
    if name == "busiest (core)":
        return fmt.format(row["busiest"], row["busiest_core"]) if row.get("busiest") else "-"
    if name == "PUTs/append":
        return fmt.format(row.get("blob_puts", 0) / max(row.get("appends") or 1, 1))
    value = row.get(key)
    if value is None:
        return "-"
    if key == "verified" and not value:
        return f"**no**: {row.get('error', '')[:80]}"
    return fmt.format(value)


def table_rows(rows: list[dict]) -> list[list[str]]:
    return [[_cell(r, name, key, fmt) for name, key, fmt in _COLUMNS] for r in rows]


def write_report(rows: list[dict], out: Path, command: str, elapsed_s: float) -> Path:
    """Write ``report.md`` next to ``results.json``; return its path."""
    lines = [
        "# shardsink bench cluster",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"{platform.system()} {platform.machine()}; total {elapsed_s:.0f} s.",
        "",
        "## Checks",
        "",
        "| claim | result | figures |",
        "|---|---|---|",
    ]
    for claim, passed, figures in checks(rows):
        verdict = "not measured" if passed is None else ("pass" if passed else "**FAIL**")
        lines.append(f"| {claim} | {verdict} | {figures} |")
    headers = [name for name, _, _ in _COLUMNS]
    sections = sorted({r["section"] for r in rows}, key=SECTIONS.index)
    for section in sections:
        picked = [r for r in rows if r["section"] == section]
        lines += [
            "",
            f"## {section}",
            "",
            "| " + " | ".join(headers) + " |",
            "|" + "---|" * len(headers),
        ]
        lines += ["| " + " | ".join(cells) + " |" for cells in table_rows(picked)]
        if section == "compaction":
            lines += [
                "",
                "| compaction | batches in state | parts in state | compactions |",
                "|---|---|---|---|",
            ]
            for r in picked:
                lines.append(
                    f"| {'on' if r['compaction'] else 'off'} | "
                    f"{r.get('batches_in_state', '-')} | {r.get('parts_in_state', '-')} | "
                    f"{r.get('compactions', 0)} |"
                )
        if section == "peer":
            lines += [
                "",
                "Files (blob PUTs), parts and commit bytes per interval: the Delta peer "
                "against shardsink on the same shape (commit bytes: the Delta log; for "
                "shardsink, consensus diff bytes):",
                "",
                "| mode | files/interval | parts/interval | commit bytes/interval | commits |",
                "|---|---|---|---|---|",
            ]
            same = [
                r
                for r in rows
                if r["section"] == "trickle"
                and r.get("verified")
                and _shape(r) == _shape(picked[0])
            ]
            for r in picked + same:
                appends = max(r.get("appends") or 1, 1)
                parts = r.get("data_parts_per_append", 0) + r.get("inline_parts_per_append", 0)
                delta = r["mode"].startswith("delta")
                name = r["mode"] if delta else f"shardsink {scale.variant(r)}"
                lines.append(
                    f"| {name} | {r.get('blob_puts', 0) / appends:.2f} | {parts:.2f} | "
                    f"{r.get('diff_bytes_per_append', 0):,.0f} | "
                    f"{r.get('cas_per_append', 0) * appends:.0f} |"
                )
    lines += _threshold_lines(rows)
    lines += scale.report_lines(rows, os.cpu_count() or 1)
    plots = sorted(p.name for p in out.glob("*.png"))
    if plots:
        lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _threshold_lines(rows: list[dict]) -> list[str]:
    """Where ``auto`` took the threshold in each run that used it."""
    auto = [r for r in rows if r.get("shared_max_bytes") == AUTO and r.get("thresholds")]
    if not auto:
        return []
    lines = [
        "",
        "## The auto threshold",
        "",
        "The threshold each interval was minted with (runs of `--shared-max-bytes auto`):",
        "",
        "| run | first | last | interval it last changed | distinct values |",
        "|---|---|---|---|---|",
    ]
    for r in auto:
        seen = r["thresholds"]
        changed = max((i for i in range(1, len(seen)) if seen[i] != seen[i - 1]), default=0)
        lines.append(
            f"| {r['section']} {describe(r)} | {_bytes(seen[0])} | {_bytes(seen[-1])} | "
            f"{changed} | {', '.join(_bytes(v) for v in dict.fromkeys(seen))} |"
        )
    return lines


def _shape(row: dict) -> str:
    return f"{row['groups']}x{row['workers']} R={row['rows_per_interval']}"


def describe(row: dict) -> str:
    """A run's shape for tables and progress: groups x workers, rows, and the
    snapshot, threshold, compaction and repeat where they matter."""
    text = _shape(row)
    if row.get("snapshot_rows"):
        text += f" S={row['snapshot_rows']:,}"
    if row.get("snapshot_rows") or row.get("shared_max_bytes", MIB) != MIB:
        text += f" B={_bytes(row['shared_max_bytes'])}"
    if row.get("compaction"):
        text += " +compaction"
    return text + (f" #{row['repeat']}" if row.get("repeat") else "")


def plot(rows: list[dict], out: Path) -> list[Path]:
    """PNG plots of the verified runs; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r.get("verified")]
    written = []
    shapes = [
        r
        for r in ok
        if r["section"] in ("small-writes", "trickle") and r["shared_max_bytes"] != AUTO
    ]
    labels = sorted({_shape(r) for r in shapes})
    metrics = [
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
    for name, title, value in metrics:
        if not labels:
            break
        fig, ax = plt.subplots(figsize=(8, 4))
        modes = list(dict.fromkeys(scale.variant(r) for r in shapes))
        width = 0.8 / len(modes)
        for k, mode in enumerate(modes):
            ys = []
            for label in labels:
                match = [r for r in shapes if scale.variant(r) == mode and _shape(r) == label]
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
    hydrate = [r for r in ok if r["section"] == "hydrate"]
    if hydrate:
        groups: dict[str, list[float]] = {}
        for r in hydrate:
            key = "off" if r["mode"] == "off" else f"B={_bytes(r['shared_max_bytes'])}"
            groups.setdefault(key, []).append(r["wall_s"])
        fig, ax = plt.subplots(figsize=(6, 4))
        keys = list(groups)
        ax.bar(keys, [statistics.median(groups[k]) for k in keys])
        ax.set_title("hydration wall time by threshold (median s)")
        fig.tight_layout()
        path = out / "hydrate_wall.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written + scale.plot(rows, out, os.cpu_count() or 1)


def run(
    specs: list[RunSpec],
    out: Path,
    command: str,
    *,
    title: str,
    quiet: bool = False,
    base: ClusterConfig | None = None,
) -> list[dict]:
    """Run ``specs`` (a matrix, named ``title``), their clusters from ``base``
    (:func:`run_one`), and write ``results.json``, plots and ``report.md``
    into ``out``."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    out.mkdir(parents=True, exist_ok=True)
    scratch = out / "scratch"
    console = Console(stderr=True, quiet=quiet)
    started = time.monotonic()
    rows: list[dict] = []
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        task = progress.add_task("bench cluster", total=len(specs))

        def done(spec: RunSpec, row: dict) -> None:
            rows.append(row)
            mark = "ok" if row.get("verified") else f"FAILED: {row.get('error', '')[:100]}"
            progress.console.print(f"{spec.label}: {mark}")
            progress.update(task, advance=1)
            # keep what is measured even if a later run crashes the driver
            _write_results(out, rows)

        for i, spec in enumerate(specs):
            progress.update(task, description=spec.label)
            done(spec, run_one(spec, scratch / f"run-{i:03d}", base))
    shutil.rmtree(scratch, ignore_errors=True)
    plot(rows, out)
    write_report(rows, out, command, time.monotonic() - started)
    table = Table(title=f"bench cluster ({title}): {out / 'results.json'}")
    for name, _, _ in _COLUMNS:
        table.add_column(name, justify="left" if name in ("mode", "shape") else "right")
    for cells in table_rows(rows):
        table.add_row(*cells)
    # piped output (CI logs, tee) gets room for the whole table, not 80 columns
    console = Console(quiet=quiet, width=None if sys.stdout.isatty() else 200)
    console.print(table)
    for claim, passed, figures in checks(rows):
        verdict = "not measured" if passed is None else ("pass" if passed else "FAIL")
        console.print(f"{verdict:>12}  {claim}: {figures}")
    return rows


def _write_results(out: Path, rows: list[dict]) -> None:
    tmp = out / "results.json.tmp"
    tmp.write_text(json.dumps({"runs": rows}, indent=2, default=str) + "\n")
    tmp.replace(out / "results.json")


def command_line() -> str:
    return " ".join(["shardsink", *sys.argv[1:]])
