"""``bench cluster --matrix hosts``: the same work on this machine alone and
on 1, 2 and 3 hosts of a Ray cluster, every variant, side by side.

Each group does the same work whatever the shape (:data:`ROWS_PER_GROUP`
trickle rows an interval): a run on ``H`` hosts has one group of
:data:`WORKERS` workers on each, the local runs :data:`LOCAL_GROUPS` groups
on this machine (as many as the most hosts). Without a Ray cluster given
(``[cluster] hosts = "ray:ADDRESS"``), the matrix starts one of
``max(HOST_COUNTS)`` nodes on loopback for its runs
(:class:`~shardsink.testing.ray.RayTestCluster`) and stops it at the end; its
nodes share this machine's cores and its blob directory, so what the
figures show is the cost of placing groups on hosts (TCP with CURVE
between hosts, one host builder each), not more cores.

The report's table gives, by variant and hosts, the median over repeats of
parts per append, diff bytes per append, rows/s and append latency (with
their range); ``hosts.png`` draws them.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import msgspec

from ...config import ClusterConfig
from .. import scale

#: Hosts of each run: 0 is this machine alone.
HOST_COUNTS = (0, 1, 2, 3)
LOCAL_GROUPS = max(HOST_COUNTS)
WORKERS = 4
ROWS_PER_GROUP = 2000
INTERVALS = 20
REPEATS = 2

#: What the table and the plot compare: (row key, header, format).
FIGURES = (
    ("parts_per_append", "parts/append", "{:.2f}"),
    ("diff_bytes_per_append", "diff bytes/append", "{:,.0f}"),
    ("rows_per_s", "rows/s", "{:,.0f}"),
    ("append_latency_ms_p50", "p50 ms", "{:.1f}"),
)


def hosts_matrix(make: Callable[..., msgspec.Struct], variants: Sequence[tuple[str, str]]) -> list:
    """Every variant of ``variants`` (mode, coalesce) at each of
    :data:`HOST_COUNTS`, :data:`REPEATS` times; ``make`` builds a run spec
    from its fields."""
    runs = []
    for repeat in range(REPEATS):
        for hosts in HOST_COUNTS:
            groups = hosts or LOCAL_GROUPS
            for mode, coalesce in variants:
                runs.append(
                    make(
                        section="hosts",
                        mode=mode,
                        coalesce=coalesce,
                        groups=groups,
                        workers=WORKERS,
                        workload="trickle",
                        rows_per_interval=ROWS_PER_GROUP * groups,
                        intervals=INTERVALS,
                        repeat=repeat,
                        hosts=hosts,
                    )
                )
    return runs


@contextlib.contextmanager
def ray_for(specs: Sequence, base: ClusterConfig) -> Iterator[ClusterConfig]:
    """``base`` with ``hosts`` naming a Ray cluster, while the runs of
    ``specs`` need one: ``base``'s own, or a loopback one started here
    (then its blob directory is declared shared: every node is this
    machine)."""
    most = max((spec.hosts for spec in specs), default=0)
    if not most or base.hosts != "local":
        yield base
        return
    from ...testing.ray import RayTestCluster

    cluster = RayTestCluster(nodes=most).start()
    try:
        yield msgspec.structs.replace(base, hosts=f"ray:{cluster.address}", blob_shared=True)
    finally:
        cluster.stop()


def config_for(spec, config: ClusterConfig) -> ClusterConfig:
    """The config of a run of ``spec`` from ``config`` (every run's fields
    set): on this machine alone, or on ``spec.hosts`` hosts, ``groups``
    then being each host's."""
    if not spec.hosts:
        return msgspec.structs.replace(config, hosts="local")
    if config.hosts == "local":
        raise ValueError("a run on hosts needs a Ray cluster: [cluster] hosts = 'ray:ADDRESS'")
    return msgspec.structs.replace(config, groups=spec.groups // spec.hosts, max_hosts=spec.hosts)


def hosts_label(hosts: int) -> str:
    return f"{hosts} host{'s' if hosts > 1 else ''}" if hosts else "local"


def _figure(row: dict, key: str) -> float:
    if key == "parts_per_append":
        return row["data_parts_per_append"] + row["inline_parts_per_append"]
    return row[key]


def _by_cell(rows: list[dict]) -> dict[tuple[str, int], list[dict]]:
    cells: dict[tuple[str, int], list[dict]] = {}
    for row in rows:
        if row.get("section") == "hosts" and row.get("verified"):
            cells.setdefault((scale.variant(row), row.get("hosts", 0)), []).append(row)
    return cells


def report_lines(rows: list[dict]) -> list[str]:
    """The side table: by variant and hosts, each figure's median over
    repeats and its range."""
    cells = _by_cell(rows)
    if not cells:
        return []
    lines = [
        "",
        f"Medians over repeats (range in brackets); each group {ROWS_PER_GROUP:,} rows an "
        f"interval, {WORKERS} workers; local: {LOCAL_GROUPS} groups on this machine.",
        "",
        "| variant | hosts | runs | " + " | ".join(h for _, h, _ in FIGURES) + " |",
        "|" + "---|" * (3 + len(FIGURES)),
    ]
    for (variant, hosts), picked in sorted(cells.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        figures = []
        for key, _, fmt in FIGURES:
            values = [_figure(r, key) for r in picked]
            low, high = fmt.format(min(values)), fmt.format(max(values))
            figures.append(f"{fmt.format(statistics.median(values))} [{low} to {high}]")
        lines.append(
            f"| {variant} | {hosts_label(hosts)} | {len(picked)} | " + " | ".join(figures) + " |"
        )
    return lines


def plot(plt, rows: list[dict], out: Path, caption: str = "") -> list[Path]:
    """``hosts.png``: each figure of :data:`FIGURES` by hosts, a line per
    variant through the medians over 1, 2 and 3 hosts, the local runs (as
    many groups as the most hosts) a point of their own beside them; bars
    from the least to the most of the repeats."""
    from ..._figures import add_caption, legend_beside, median_range, save

    cells = _by_cell(rows)
    if not cells:
        return []
    counts = sorted({hosts for _, hosts in cells if hosts})
    variants = list(dict.fromkeys(v for v, _ in sorted(cells)))
    local_x = len(counts) + 0.5
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    for ax, (key, header, _) in zip(axes.flat, FIGURES, strict=True):
        for k, variant in enumerate(variants):
            color = f"C{k}"
            points = [
                (i, median_range([_figure(r, key) for r in cells[(variant, hosts)]]))
                for i, hosts in enumerate(counts)
                if (variant, hosts) in cells
            ]
            if points:
                xs = [x for x, _ in points]
                ys = [m[0] for _, m in points]
                lows, highs = [m[1] for _, m in points], [m[2] for _, m in points]
                ax.errorbar(xs, ys, yerr=[lows, highs], marker="o", capsize=3, color=color,
                            label=variant)  # fmt: skip
            if (variant, 0) in cells:
                y, low, high = median_range([_figure(r, key) for r in cells[(variant, 0)]])
                ax.errorbar([local_x], [y], yerr=[[low], [high]], marker="s", capsize=3,
                            color=color, linestyle="none", fillstyle="none")  # fmt: skip
        ticks = [hosts_label(h) for h in counts] + [f"local\n({LOCAL_GROUPS} groups)"]
        ax.set_xticks([*range(len(counts)), local_x], ticks)
        ax.set_xlabel("hosts of the Ray cluster (one group each), and this machine alone")
        ax.set_ylabel(header)
        ax.set_ylim(bottom=0)
        ax.grid(axis="y", alpha=0.3)
    # the local runs are open squares beside the hosts' lines
    legend_beside(axes.flat[1])
    fig.suptitle(
        "bench cluster --matrix hosts: medians over repeats, bars from least to most "
        f"({ROWS_PER_GROUP:,} rows per group an interval)"
    )
    fig.tight_layout()
    if caption:
        add_caption(fig, caption)
    return [save(fig, out / "hosts.png")]
