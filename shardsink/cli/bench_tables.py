"""The tables ``shardsink bench ...`` prints (rich), each of what its
benchmark returned (``bench consensus`` and ``appends``: ``bench_stores``)."""

from __future__ import annotations

from pathlib import Path

from .._units import MIB


def transport_tables(result: dict) -> list:
    """``bench transport``: GB/s per part size (medians), then the inline
    sweep's if it ran."""
    from rich.table import Table

    from ..bench.transport import COLUMNS

    table = Table(title=f"transport GB/s (median of {result['reps']})")
    for column in ("size", *COLUMNS, "shm/memcpy", "shm/queue"):
        table.add_column(column, justify="right")
    for row in result["parts"]:
        table.add_row(
            _size(row["size"]),
            *(f"{row[f'{t}_gbps']:.2f}" for t in COLUMNS),
            f"{row['shm_gbps'] / row['memcpy_gbps']:.2f}",
            f"{row['shm_gbps'] / row['queue_gbps']:.1f}",
        )
    if "inline_sweep" not in result:
        return [table]
    cut_off = _size(result["message_part_max_bytes"])
    sweep = Table(title=f"inline vs shm GB/s (cut-off {cut_off})")
    for column in ("size", "inline", "shm"):
        sweep.add_column(column, justify="right")
    for row in result["inline_sweep"]:
        sweep.add_row(_size(row["size"]), f"{row['inline_gbps']:.3f}", f"{row['shm_gbps']:.3f}")
    return [table, sweep]


def _size(n: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def startup_table(result: dict):
    """``bench startup``: fork against spawn, medians."""
    from rich.table import Table

    median = result["median"]
    table = Table(title="cluster start-up, fork (zygote) vs spawn, medians")
    for column in ("measure", "fork", "spawn", "fork/spawn"):
        table.add_column(column, justify="left" if column == "measure" else "right")
    for shape, fork in median["cold_start_s"]["fork"].items():
        spawn = median["cold_start_s"]["spawn"][shape]
        ratio = result["fork_over_spawn"]["cold_start_s"][shape]
        table.add_row(f"cold start {shape} (s)", f"{fork:.3f}", f"{spawn:.3f}", f"{ratio:.3f}")
    fork, spawn = median["restart_s"]["fork"], median["restart_s"]["spawn"]
    ratio = result["fork_over_spawn"]["restart_s"]
    table.add_row("group restart 1x8 (s)", f"{fork:.3f}", f"{spawn:.3f}", f"{ratio:.3f}")
    fork, spawn = median["workers_pss_bytes"]["fork"], median["workers_pss_bytes"]["spawn"]
    ratio = result["fork_over_spawn"]["workers_pss_bytes"]
    table.add_row(
        "workers' PSS 1x8 (MiB)", f"{fork / 2**20:.0f}", f"{spawn / 2**20:.0f}", f"{ratio:.3f}"
    )
    return table


def read_table(result: dict):
    """``bench read``: each snapshot size's stream against DuckDB."""
    from rich.table import Table

    table = Table(title="shard reads: Reader.batches / shardsink read against DuckDB")
    columns = (
        "rows", "Arrow MiB", "read peak MiB", "bound MiB", "batches rows/s", "DuckDB rows/s",
        "batches/DuckDB", "batches peak MiB", "DuckDB peak MiB",
    )  # fmt: skip
    for column in columns:
        table.add_column(column, justify="right")
    for r in result["runs"]:
        table.add_row(
            f"{r['rows']:,}",
            f"{r['arrow_bytes'] / MIB:.0f}",
            f"{r['read_peak_rss'] / MIB:.0f}",
            f"{r['read_rss_bound'] / MIB:.0f}",
            f"{r['batches_rows_per_s']:,.0f}",
            f"{r['duckdb_rows_per_s']:,.0f}",
            f"{r['batches_over_duckdb']:.2f}",
            f"{r['batches_peak_rss'] / MIB:.0f}",
            f"{r['duckdb_peak_rss'] / MIB:.0f}",
        )
    return table


def parts_tables(result: dict) -> list:
    """``bench parts``: the builder's rows/s, then each read's and merge's memory."""
    from rich.table import Table

    b = result["builder"]
    first = Table(title=f"BatchBuilder, {b['rows']:,} rows of {b['workers']} workers")
    for column in ("sorted rows/s", "unsorted rows/s", "sorted/unsorted"):
        first.add_column(column, justify="right")
    first.add_row(
        f"{b['sorted_rows_per_s']:,.0f}",
        f"{b['unsorted_rows_per_s']:,.0f}",
        f"{b['sorted_over_unsorted']:.2f}",
    )
    m = result["memory"]
    second = Table(title=f"{m[0]['parts']} overlapping parts of {m[0]['rows_per_part']:,} rows")
    columns = ("", "parts", "encoded MiB", "peak RSS above MiB", "Arrow pool peak MiB", "rows/s")
    for column in columns:
        second.add_column(column, justify="right")
    for r in m:
        second.add_row(
            r["mode"],
            r["layout"],
            f"{r['encoded_bytes'] / MIB:.0f}",
            f"{r['peak_above'] / MIB:.0f}",
            f"{r['pool_peak'] / MIB:.0f}",
            f"{r['rows_per_s']:,.0f}",
        )
    return [first, second]


def allocators_tables(result: dict) -> list:
    """``bench allocators``: a merge's memory per environment, then the
    consensus server's start, forked against fresh."""
    from rich.table import Table

    merge = result["merge"]
    first = Table(title=f"a {merge[0]['rows']:,}-row merge, medians of {merge[0]['repeats']}")
    columns = ("environment", "pool", "s", "peak RSS above MiB", "after MiB", "released MiB")
    for column in (*columns, "MiB held at most, by pool"):
        first.add_column(column, justify="right")
    for r in merge:
        first.add_row(
            r["environment"] + (" (server)" if r["server"] else ""),
            r["pool"],
            f"{r['seconds']:.2f}",
            f"{r['peak_above'] / MIB:.0f}",
            f"{r['after_above'] / MIB:.0f}",
            f"{r['released_above'] / MIB:.0f}",
            ", ".join(f"{k} {v / MIB:.0f}" for k, v in r["pool_peaks"].items()),
        )
    s = result["start"]
    second = Table(title=f"consensus server start, medians of {s['starts']}")
    for column in ("", "fork from the zygote", "fresh interpreter"):
        second.add_column(column, justify="right")
    second.add_row("seconds", f"{s['fork_s']:.3f}", f"{s['fresh_s']:.3f}")
    second.add_row("RSS MiB", f"{s['fork_rss'] / MIB:.0f}", f"{s['fresh_rss'] / MIB:.0f}")
    return [first, second]


def soak_table(result: dict, config):
    """``bench soak`` of ``config`` (a ClusterConfig): each steady-state
    check, then whether the shard verified."""
    from rich.table import Table

    table = Table(
        title=f"soak: {config.intervals} intervals, {config.groups}x{config.workers} {config.mode}"
        + (" (coalesce host)" if config.coalesce == "host" else "")
    )
    for column in ("check", "value", "bound", "ok"):
        table.add_column(column)
    for name, check in result["checks"].items():
        table.add_row(
            name, f"{check['value']:.3g}", f"{check['bound']}", "yes" if check["ok"] else "NO"
        )
    table.add_row("verified", "", "", "yes" if result["verified"] else "NO")
    return table


def cluster_table(rows: list[dict], title: str, results: Path):
    """``bench cluster``'s table of every run of the matrix ``title``,
    whose ``results.json`` is ``results``."""
    from rich.table import Table

    from ..bench.cluster.report import COLUMNS, table_rows

    table = Table(title=f"bench cluster ({title}): {results}")
    for name, _, _ in COLUMNS:
        table.add_column(name, justify="left" if name in ("mode", "shape") else "right")
    for cells in table_rows(rows):
        table.add_row(*cells)
    return table
