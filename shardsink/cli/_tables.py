"""The tables ``shardsink up`` and ``shardsink status`` print (rich)."""

from __future__ import annotations

from .._units import MIB
from ..config import WORKLOADS


def host_words(config) -> str:
    """`` coalesced per host`` for a config or stats of ``coalesce`` host in a sharing mode."""
    return " coalesced per host" if config.coalesce == "host" and config.mode != "off" else ""


def status_tables(status):
    """``shardsink status`` as rich tables: the cluster, its hosts (on a Ray
    cluster), then its processes."""
    from rich.table import Table

    summary = Table(title=f"cluster {status.cluster_id}", show_header=False)
    summary.add_column(style="bold")
    summary.add_column(overflow="fold")
    rows = [
        ("shape", f"{status.groups}x{status.workers} {status.mode}{host_words(status)}"),
        ("workload", f"{status.workload} ({status.pace})"),
        ("shard", f"{status.shard!r}, upper {status.upper}, {status.appends} appends"),
        ("intervals / s", f"{status.intervals_per_s:.2f} (last {status.window_s:g} s)"),
        (
            "latency p50 / p99",
            f"{status.append_latency_ms_p50:.1f} / {status.append_latency_ms_p99:.1f} ms",
        ),
        ("data parts / append", f"{status.data_parts_per_append:.2f}"),
        ("blob PUTs / append", f"{status.blob_puts_per_append:.2f}"),
        ("diff bytes / append", f"{status.diff_bytes_per_append:,.0f}"),
        (
            "restarts",
            f"{status.restarts} groups, {status.consensus_restarts} consensus, "
            f"{status.abandoned_attempts} attempts abandoned",
        ),
        ("maintenance failures", status.maintenance_failures.describe()),
        ("consensus", status.consensus),
        ("metrics", status.metrics or "none (up --metrics-port P)"),
        ("dashboard", status.dashboard or "none (up --dashboard)"),
        ("data dir", status.data_dir),
    ]
    for name, value in rows:
        summary.add_row(name, value)
    procs = Table("kind", "name", "pid", "alive", "RSS", "CPU %", title="processes")
    for p in status.processes:
        procs.add_row(
            p.kind,
            p.name,
            str(p.pid),
            "yes" if p.alive else "NO",
            f"{p.rss_bytes / MIB:.1f} MiB",
            f"{p.cpu_percent:.0f}",
        )
    if not any(h.node_id for h in status.hosts):
        return summary, procs
    hosts = Table(
        "host", "machine", "node", "address", "alive", "groups", "restarts", title="hosts"
    )
    for h in status.hosts:
        hosts.add_row(
            str(h.index),
            h.hostname,
            h.node_id[:12],
            h.address,
            "yes" if h.alive else "NO",
            ",".join(map(str, h.groups)) or "-",
            str(h.restarts),
        )
    return summary, hosts, procs


def _restart_times(restart_s: list[float]) -> str:
    if not restart_s:
        return ""
    ordered = sorted(restart_s)
    return f" (median {ordered[len(ordered) // 2] * 1000:.0f} ms, max {ordered[-1] * 1000:.0f} ms)"


def _by_host(parts: dict[int, float]) -> list[tuple[str, str]]:
    """The summary's row of parts per append by host, with more than one."""
    if len(parts) < 2:
        return []
    return [
        ("parts / append by host", ", ".join(f"{h}: {n:.2f}" for h, n in sorted(parts.items())))
    ]


def _by_shard(stats) -> list[tuple[str, str]]:
    """The summary's row of parts per append by shard, with more than one
    (whose transactions' consensus work the server alone counts)."""
    parts = stats.parts_per_append_by_shard
    if len(parts) < 2:
        return []
    listed = ", ".join(f"{s}: {n:.2f}" for s, n in parts.items())
    return [("parts / append by shard", f"{listed} (one transaction an append)")]


def _open_loop(stats) -> list[tuple[str, str]]:
    """The summary's row of an open-loop run (``rate``): target against achieved."""
    if stats.target_rate is None:
        return []
    behind = " FELL BEHIND" if stats.fell_behind else ""
    return [
        (
            "rate (open loop)",
            f"{stats.achieved_rate:.2f} of {stats.target_rate:g} intervals/s, "
            f"max backlog {stats.max_backlog}{behind}",
        )
    ]


def workload_words(stats) -> str:
    """The summary's workload: a built-in's rows per interval (R) and
    snapshot rows (S), the arguments of any other."""
    if stats.workload in WORKLOADS:
        args = {"rows_per_interval": stats.rows_per_interval, "snapshot_rows": stats.snapshot_rows}
        args.update(stats.workload_args)
        return f"{stats.workload} (R={args['rows_per_interval']}, S={args['snapshot_rows']})"
    listed = ", ".join(f"{k}={v!r}" for k, v in stats.workload_args.items())
    return f"{stats.workload} ({listed})" if listed else stats.workload


def summary_table(stats):
    """The end-of-run summary of ``stats`` as a rich table."""
    from rich.table import Table

    def mib(n: float) -> str:
        return f"{n / MIB:.1f} MiB"

    verified = {True: "yes", False: "NO", None: "not checked"}
    rows = [
        ("shape", f"{stats.groups}x{stats.workers} {stats.mode}{host_words(stats)}"),
        ("workload", workload_words(stats)),
        ("appends", f"{stats.appends} (upper {stats.upper})"),
        ("rows", f"{stats.rows} ({stats.rows_per_s:,.0f}/s over {stats.wall_s:.2f}s)"),
        ("data parts / append", f"{stats.data_parts_per_append:.2f}"),
        ("inline parts / append", f"{stats.inline_parts_per_append:.2f}"),
        *_by_host(stats.parts_per_append_by_host),
        *_by_shard(stats),
        ("inline bytes / append", f"{stats.inline_bytes_per_append:,.0f}"),
        ("blob PUTs", f"{stats.blob_puts} ({mib(stats.blob_put_bytes)})"),
        *(
            [
                ("diff bytes / append", f"{stats.diff_bytes_per_append:,.0f}"),
                ("CaA calls / append", f"{stats.cas_per_append:.2f}"),
            ]
            if len(stats.shards) < 2
            else []  # a transaction's are the consensus server's alone: not counted here
        ),
        ("latency p50 / p99 / p99.9", stats.append_latency_ms.describe()),
        *_open_loop(stats),
        ("start-up", f"{stats.startup_s:.3f}s ({stats.start})"),
        (
            "restarts",
            f"{stats.restarts} groups{_restart_times(stats.restart_s)}, "
            f"{stats.consensus_restarts} consensus, "
            f"{stats.abandoned_attempts} attempts abandoned",
        ),
        ("maintenance failures", stats.maintenance_failures.describe()),
        (
            "peak RSS",
            ", ".join(f"{kind} {mib(n)}" for kind, n in sorted(stats.peak_rss.items())),
        ),
        (
            "verified",
            verified[stats.verified] + (f": {stats.verify_detail}" * bool(stats.verify_detail)),
        ),
    ]
    table = Table(title="shardsink up", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    for name, value in rows:
        table.add_row(name, value)
    return table
