"""The run specs of every ``bench cluster --matrix``: what each run sets, how
the runs of a matrix are built and interleaved, and how a run's shape is named
in tables and progress lines.

Side by side: a matrix's runs go repeat by repeat (every run of repeat 0,
then of repeat 1, ...), and within a repeat in a fresh random order drawn
from :data:`ORDER_SEED` and the repeat (:func:`repeat_order`), so no variant
always runs first, or always after another on a machine that drifts. Each
run records its place (``order``) and the seed (``order_seed``) in
``results.json``. Every benchmark that compares variants orders them with
:func:`repeat_order`.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

import msgspec

from ..._units import MIB
from ...config import AUTO, ClusterConfig
from .. import scale
from ..peers import PEERS
from . import hosts, peer_matrix, rates, saturation

UNLIMITED = 1 << 50  # "everything through the builder"
#: The seed of every benchmark's run order (:func:`repeat_order`).
ORDER_SEED = 26
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
#: ClusterConfig fields each run of a matrix sets itself (a config's
#: ``[cluster]`` table may set any other).
RUN_FIELDS = (
    "groups",
    "workers",
    "mode",
    "coalesce",
    "shared_max_bytes",
    "workload",
    "workload_args",
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
    sets itself (``ValueError`` naming such a key). ``workload``: a
    ``[workload]`` table naming a workload of your own (``use``, as
    ``--workload`` takes it) and its keyword arguments; given, ``bench
    cluster`` runs it side by side with trickle (:func:`workload_matrix`)
    instead of ``matrix``."""

    out: str | None = None
    workload: dict[str, Any] = {}
    matrix: Literal[
        "default",
        "quick",
        "trickle",
        "hydrate",
        "scale",
        "auto",
        "latency",
        "hosts",
        "digest",
        "rate",
        "peers",
        "saturation",
    ] = "default"
    slo_p99_ms: float = rates.SLO_P99_MS
    cluster: ClusterConfig = msgspec.field(default_factory=ClusterConfig)


def bench_config(fields: dict, source: str) -> BenchClusterConfig:
    """A :class:`BenchClusterConfig` of ``fields`` (:func:`~shardsink.config.build`),
    refusing a ``cluster`` key of :data:`RUN_FIELDS` by name; its ``out``
    made absolute (from a file too: the runs' ``file://`` URIs are built from
    it, and ``file://bq/...`` names host ``bq``)."""
    from ...options import build

    taken = sorted(set(fields.get("cluster") or {}) & set(RUN_FIELDS))
    if taken:
        raise ValueError(
            f"{source}: cluster.{taken[0]} is set by each run of the matrix; the cluster "
            f"table may set any ClusterConfig field but {', '.join(RUN_FIELDS)}"
        )
    config = build(BenchClusterConfig, fields, source=source)
    if config.out is None:
        return config
    return msgspec.structs.replace(config, out=str(Path(config.out).absolute()))


SECTIONS = (
    "small-writes",
    "trickle",
    "latency",
    "compaction",
    "peer",
    "hydrate",
    "hosts",
    "workload",
    "digest",
    "rate",
    "peers",
    "saturation",
    *scale.SECTIONS,
)


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
    #: hosts of a Ray cluster its groups run on (``groups`` in all), 0: this machine alone
    hosts: int = 0
    #: the workload's keyword arguments (a [workload] table's), and whether
    #: the run computes digests (off only to measure what they cost)
    workload_args: dict[str, Any] = {}
    digests: bool = True
    #: open loop: intervals a second (``up --rate``), and the p99 its knee is judged by
    rate: float | None = None
    slo_p99_ms: float = rates.SLO_P99_MS
    #: open loop at this multiple of the rate the closed-loop run before it
    #: in its repeat achieved (:mod:`.saturation`; it sets ``rate``), 0: not
    saturate: float = 0.0
    #: its place in the matrix's run order, and the seed that drew it (:func:`ordered`)
    order: int = 0
    order_seed: int = ORDER_SEED

    @property
    def label(self) -> str:
        row = msgspec.structs.asdict(self)
        return f"{scale.variant(row)} {self.workload} {describe(row)}"


def bytes_label(n: int | str) -> str:
    """A ``shared_max_bytes`` as tables show it: ``auto``, ``unlimited``, whole
    MiB, or bytes."""
    if n == AUTO:
        return AUTO
    if n >= UNLIMITED:
        return "unlimited"
    return f"{n // MIB} MiB" if n >= MIB and n % MIB == 0 else str(n)


def shape_of(row: dict) -> str:
    """A run's groups x workers and rows per interval, e.g. ``4x8 R=128``."""
    return f"{row['groups']}x{row['workers']} R={row['rows_per_interval']}"


def describe(row: dict) -> str:
    """A run's shape for tables and progress: groups x workers, rows, and the
    snapshot, threshold, compaction and repeat where they matter."""
    text = shape_of(row)
    if row.get("snapshot_rows"):
        text += f" S={row['snapshot_rows']:,}"
    if row["mode"] not in PEERS and (
        row.get("snapshot_rows") or row.get("shared_max_bytes", MIB) != MIB
    ):
        text += f" B={bytes_label(row['shared_max_bytes'])}"
    if row.get("compaction"):
        text += " +compaction"
    if row.get("hosts"):
        text += f" on {row['hosts']} host{'s' if row['hosts'] > 1 else ''}"
    if row.get("saturate"):
        text += f" open loop at {row['saturate']:g}x"
    elif row.get("rate"):
        text += f" at {row['rate']:g}/s"
    return text + (f" #{row['repeat']}" if row.get("repeat") else "")


def matrix(name: str) -> list[RunSpec]:
    """The runs of matrix ``name`` (see :data:`MATRICES`), interleaved by repeat:
    ``default``; ``quick``, its cut-down version; ``trickle``, only its trickle
    section (every variant of :data:`VARIANTS`, host coalescing included, at
    4x8 with 128 and 32 rows per interval); ``scale``,
    the scale-out sweeps (:func:`scale_matrix`); ``auto``, small writes and
    hydration with ``--shared-max-bytes auto`` against 1 MiB and ``off``."""
    if name not in MATRICES:
        raise ValueError(f"unknown matrix {name!r}; choose one of {', '.join(MATRICES)}")
    return ordered(MATRICES[name]())


T = TypeVar("T")


def repeat_order(variants: Sequence[T], repeat: int, seed: int = ORDER_SEED) -> list[T]:
    """``variants`` in the order repeat ``repeat`` runs them: a shuffle drawn
    from ``seed`` and ``repeat`` alone, so each repeat has its own order and a
    rerun has the same."""
    out = list(variants)
    random.Random(f"{seed}/{repeat}").shuffle(out)
    return out


def ordered(specs: Sequence[RunSpec], seed: int = ORDER_SEED) -> list[RunSpec]:
    """``specs`` in the order a matrix runs them: repeat by repeat, each
    repeat's runs in :func:`repeat_order`, each run given its place and the
    seed. A run that follows another (``saturate``: its rate comes from the
    run before it in ``specs``) stays right after it."""
    runs = []
    for repeat in sorted({s.repeat for s in specs}):
        units: list[list[RunSpec]] = []
        for spec in (s for s in specs if s.repeat == repeat):
            if spec.saturate and units:
                units[-1].append(spec)
            else:
                units.append([spec])
        runs += [spec for unit in repeat_order(units, repeat, seed) for spec in unit]
    return [msgspec.structs.replace(s, order=i, order_seed=seed) for i, s in enumerate(runs)]


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


def workload_matrix(table: dict[str, Any], repeats: int = 3) -> list[RunSpec]:
    """A ``[workload]`` table's runs: its workload (``use``) and trickle at
    4x8 best-effort, the same rows per interval (the table's
    ``rows_per_interval``, else 128), 20 intervals; and the workload with
    and without digests (section ``digest``: what they cost on its rows, at
    :data:`DIGEST_ROWS`); ``repeats`` times, interleaved."""
    args = dict(table)
    use = args.pop("use", None)
    if not use:
        raise ValueError('the [workload] table needs use = "PATH.py:NAME" (or a built-in)')
    r = int(args.get("rows_per_interval", 128))
    runs = []
    for repeat in range(repeats):
        shape = {"mode": "best-effort", "groups": 4, "workers": 8, "rows_per_interval": r}
        runs += [
            RunSpec(section="workload", workload=use, workload_args=args, intervals=20,
                    repeat=repeat, **shape),
            RunSpec(section="workload", workload="trickle", intervals=20, repeat=repeat,
                    **shape),
        ]  # fmt: skip
        digest_args = {k: v for k, v in args.items() if k != "rows_per_interval"}
        runs += _digest_runs(repeat, use, digest_args)
    return ordered(runs)


def _digest_runs(
    repeat: int, workload: str = "trickle", workload_args: dict[str, Any] | None = None
) -> list[RunSpec]:
    """``workload`` 1x4 best-effort at :data:`DIGEST_ROWS`, digests on and off."""
    return [
        RunSpec(section="digest", mode="best-effort", groups=1, workers=4,
                rows_per_interval=DIGEST_ROWS, workload=workload,
                workload_args=workload_args or {}, intervals=DIGEST_INTERVALS,
                repeat=repeat, digests=digests)
        for digests in (True, False)
    ]  # fmt: skip


def _digest_only() -> list[RunSpec]:
    """``--matrix digest``: what digests cost on trickle, the cheapest rows
    there are (so the hash's largest share), :data:`DIGEST_REPEATS`
    repeats interleaved."""
    return [run for repeat in range(DIGEST_REPEATS) for run in _digest_runs(repeat)]


#: Repeats of ``--matrix digest``: a repeat's ratio moved from 0.76 to 1.28
#: in runs of 12 on ffb6fa2, whose medians were 0.950 and 0.986, so a
#: median of 12 is not good to the 3% it is to check.
DIGEST_REPEATS = 24


#: Rows per interval of the digest-cost runs: enough that hashing is a
#: measurable share of the workers' and builder's CPU (parts go to blob).
DIGEST_ROWS = 200_000
#: Intervals of a digest-cost run: about 5 s of appends at 1x4 (60 took 1.8 s
#: on 27a1159, and ratios of single runs spread by 5-10%), so that
#: start-up and the first intervals weigh little.
DIGEST_INTERVALS = 150


def workload_lines(section: str, rows: list[dict]) -> list[str]:
    """The side-by-side medians of a ``workload`` or ``digest`` section:
    per workload (or digests on and off), rows/s, MB/s stored, data parts
    and diff bytes per append, CPU per row (all processes, workers), and the
    ratio to trickle (to digests off); for ``digest``, the ratio of each
    repeat too."""
    key = "workload" if section == "workload" else "digests"
    groups: dict = {}
    for r in rows:
        if r.get("verified"):
            groups.setdefault(r[key], []).append(r)
    base = groups.get("trickle" if section == "workload" else False)
    lines = ["", "| variant | rows/s | MB/s | data parts / append | diff bytes / append | "
             "CPU ns / row (all, workers) | rows/s vs base |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for variant, picked in groups.items():
        med = {f: _median([r[f] for r in picked]) for f in FIGURES}
        ratio = med["rows_per_s"] / _median([r["rows_per_s"] for r in base]) if base else 0
        lines.append(
            f"| {variant} | {med['rows_per_s']:,.0f} | {med['mb_per_s']:.2f} | "
            f"{med['data_parts_per_append']:.2f} | {med['diff_bytes_per_append']:,.0f} | "
            f"{_median([cpu_per_row(r) for r in picked]):,.0f}, "
            f"{_median([cpu_per_row(r, 'worker') for r in picked]):,.0f} | {ratio:.3f} |"
        )
    if section == "digest":
        lines += _repeat_ratios(groups)
    return lines


def cpu_per_row(row: dict, kind: str | None = None) -> float:
    """Nanoseconds of CPU per row the run's processes (of ``kind``) spent."""
    cores = row.get("cpu_cores", {})
    used = sum(cores.values()) if kind is None else cores.get(kind, 0.0)
    return used * row["wall_s"] / row["rows"] * 1e9 if row.get("rows") else 0.0


def _repeat_ratios(groups: dict) -> list[str]:
    """Rows/s with digests over without, per repeat (the runs of a repeat
    are the nearest in time), and their median."""
    on = {r["repeat"]: r["rows_per_s"] for r in groups.get(True, [])}
    off = {r["repeat"]: r["rows_per_s"] for r in groups.get(False, [])}
    ratios = [on[k] / off[k] for k in sorted(on) if off.get(k)]
    if not ratios:
        return []
    listed = ", ".join(f"{x:.3f}" for x in ratios)
    mean = statistics.geometric_mean(ratios)
    return [
        "",
        f"Digests on / off per repeat: {listed}; median {_median(ratios):.3f}, "
        f"geometric mean {mean:.3f}.",
    ]


FIGURES = ("rows_per_s", "mb_per_s", "data_parts_per_append", "diff_bytes_per_append")


def _median(values: list[float]) -> float:
    values = sorted(values)
    n = len(values)
    return 0.0 if not n else (values[n // 2] + values[(n - 1) // 2]) / 2


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
    """Hydration by threshold: one run of each ``(mode, shared_max_bytes)``,
    and the plain-pyarrow baseline of the same rows (mode ``pyarrow``: as
    many processes as workers; :mod:`shardsink.bench.baseline`)."""
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
        for mode, smb in [*thresholds, ("pyarrow", 0)]
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


def _hydrate_only() -> list[RunSpec]:
    """Hydration of 4M rows at 1x2 by threshold, against the plain-pyarrow
    baseline of two processes, three times interleaved."""
    return [
        r for repeat in range(3) for r in _hydrate(4_000_000, 1000, 4, workers=2, repeat=repeat)
    ]


MATRICES: dict[str, Callable[[], list[RunSpec]]] = {
    "default": _default,
    "hydrate": _hydrate_only,
    "quick": _quick,
    "trickle": _trickle_only,
    "scale": _scale,
    "auto": _auto,
    "latency": _latency,
    "hosts": lambda: hosts.hosts_matrix(RunSpec, VARIANTS),
    "digest": _digest_only,
    "rate": lambda: rates.rate_matrix(RunSpec),
    "peers": lambda: peer_matrix.peers_matrix(RunSpec),
    "saturation": lambda: saturation.saturation_matrix(RunSpec),
}
