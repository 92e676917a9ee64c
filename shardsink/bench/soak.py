"""``shardsink bench soak``: one cluster for many intervals, measured per block.

A sink runs for days; this runs one cluster (pace ``max``, the consensus
server's automatic compaction and retention on, as ``up`` runs them) for
``--intervals`` intervals and measures every block of ``--block`` intervals:

- append latency p50/p99 (ms);
- blob PUTs and bytes per append, the appends' own and compaction's apart;
- consensus diff bytes per append (the appends' own) and rollup bytes;
- batches, parts and inline bytes in state at the block's end (the most
  batches seen at any sample of the block too);
- peak RSS of each process kind: each process's high-water mark
  (``VmHWM``) at the block's end, read every few appends too so that a
  process restarted within the block counts; for a kind with several
  processes, the largest of them. A high-water mark cannot be reset from
  outside, so it only grows: a block's figure is the peak so far, and a
  block that raised it is one whose peak is above the block before;
- compactions applied and abandoned and the batches they replaced.

It writes ``soak.json`` (the blocks, the run's config and the steady-state
checks: batches in every block, PUTs per append over the last quarter,
latency and peak RSS of the last block against the median of the blocks
after the warm-up, the first :data:`WARMUP_SHARE` of them) and ``soak.png``, and
reads the shard back at the end (``verified``). After the last append it
waits until the spine has no pass due and records the batches left against
the rule's bound (``settled``): the count compaction reaches whatever the
machine's speed, where the most batches seen during a block depends on how
fast merges run beside the appends.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import numpy as np

from ..config import ClusterConfig
from .showing import Bar, no_bar

#: Intervals per block.
BLOCK = 500
#: Appends between two samples of RSS and of the server's counters.
SAMPLE_EVERY = 25
#: Longest wait after the last append for the spine to have no pass due.
SETTLE_S = 60.0
#: The steady-state bounds the checks hold the run to (issue #12).
MAX_BATCHES = 64
MAX_PUTS_PER_APPEND = 0.5
MAX_LATENCY_GROWTH = 1.2
MAX_RSS_GROWTH = 1.2
#: The share of the blocks (at least one) taken as the warm-up and left out
#: of the baseline the last block is compared with.
WARMUP_SHARE = 0.25


@dataclass
class _Block:
    """What one block measured so far."""

    first: int
    latencies: list[float] = field(default_factory=list)
    puts: int = 0
    put_bytes: int = 0
    diff_bytes: int = 0
    max_batches: int = 0
    rss: dict[str, int] = field(default_factory=dict)

    def row(self, start, end) -> dict:
        """The block's figures; ``start`` and ``end`` are the server's
        counters when it began and ended."""
        appends = len(self.latencies)
        return {
            "first_interval": self.first,
            "appends": appends,
            "append_ms_p50": float(np.percentile(self.latencies, 50)),
            "append_ms_p99": float(np.percentile(self.latencies, 99)),
            "append_puts_per_append": self.puts / appends,
            "append_put_bytes_per_append": self.put_bytes / appends,
            "compaction_puts_per_append": (end.compaction_puts - start.compaction_puts) / appends,
            "compaction_put_bytes_per_append": (
                end.compaction_put_bytes - start.compaction_put_bytes
            )
            / appends,
            "diff_bytes_per_append": self.diff_bytes / appends,
            "rollup_bytes": end.machine.rollup_bytes - start.machine.rollup_bytes,
            "batches": end.batches,
            "max_batches": max(self.max_batches, end.batches),
            "parts": end.parts,
            "inline_bytes": end.inline_bytes,
            "compactions": end.compactions - start.compactions,
            "compactions_abandoned": end.compactions_abandoned - start.compactions_abandoned,
            "compacted_batches": end.compacted_batches - start.compacted_batches,
            "peak_rss": dict(self.rss),
        }


def _server_counters(client, shard: str):
    """The consensus server's :class:`~shardsink.server.wire.ShardCounters`
    of ``shard`` now (the cluster opened it, so the server holds it)."""
    (counters,) = [c for c in client.stats().shards if c.shard == shard]
    return counters


def _settle(shard, client, first) -> dict:
    """Wait (up to :data:`SETTLE_S`) until the consensus server's spine has
    no pass due on ``shard``'s state; the batches then in state, the rule's
    bound over the same state plus the slack a pass waits for, the
    compactions applied since the counters ``first`` and the batches they
    replaced (the settling's passes included), and how long it took."""
    from ..persist import COMPACT_SLACK, spine

    started = time.monotonic()
    while True:
        state = shard.state(refresh=True)
        due = spine.pass_due(spine.merges(state), COMPACT_SLACK)
        if not due or time.monotonic() - started > SETTLE_S:
            break
        time.sleep(0.1)
    now = _server_counters(client, first.shard)
    return {
        "batches": len(state.batches),
        "compactions": now.compactions - first.compactions,
        "compacted_batches": now.compacted_batches - first.compacted_batches,
        "bound": spine.batch_bound(state) + COMPACT_SLACK,
        "pass_due": due,
        "wait_s": time.monotonic() - started,
    }


def _sample_rss(cluster, into: dict[str, int], seen: dict[int, int]) -> None:
    """Raise ``into``'s figure of each process kind to its processes' high-water
    marks, each the highest read of it so far (``seen``, by pid). Why not the
    last read: the kernel sums a process's RSS from per-CPU counters (Linux
    6.2 on), so a read of ``VmHWM`` can come out a few hundred kB below an
    earlier one (103,002,112 then 102,793,216 bytes in one CI run)."""
    from ..process import peak_rss

    for info in cluster.processes():
        rss = peak_rss(info.pid)
        if rss is not None:  # else restarted or gone since the list was made
            seen[info.pid] = max(seen.get(info.pid, 0), rss)
            into[info.kind] = max(into.get(info.kind, 0), seen[info.pid])


def warmup(blocks: list) -> int:
    """How many of ``blocks`` are the warm-up (:data:`WARMUP_SHARE`, at least one)."""
    return max(1, int(len(blocks) * WARMUP_SHARE))


def _growth(blocks: list[dict], value) -> tuple[float, float] | None:
    """The last block's ``value(block)`` and the median of the blocks between
    the warm-up and the last; ``None`` with too few blocks or no baseline."""
    steady = [value(b) for b in blocks[warmup(blocks) : -1]]
    steady = [v for v in steady if v]
    if not steady or not value(blocks[-1]):
        return None
    return value(blocks[-1]), float(np.median(steady))


def checks(blocks: list[dict]) -> dict:
    """The steady-state checks over ``blocks`` (see the module doc); each
    ``{"value": ..., "bound": ..., "ok": bool}``. Latency p50 and each kind's
    peak RSS compare the last block with the median of the blocks after the
    warm-up (:func:`warmup`) and before the last (``last``, ``median``; at
    least three blocks); PUTs per append count compaction's with the
    appends' over the last quarter of the blocks."""
    out: dict[str, dict] = {}
    worst = max(b["max_batches"] for b in blocks)
    out["max_batches"] = {"value": worst, "bound": MAX_BATCHES, "ok": worst <= MAX_BATCHES}
    tail = blocks[-max(1, len(blocks) // 4) :]
    appends = sum(b["appends"] for b in tail)
    puts = sum(
        (b["append_puts_per_append"] + b["compaction_puts_per_append"]) * b["appends"] for b in tail
    )
    value = puts / appends
    out["puts_per_append_last_quarter"] = {
        "value": value,
        "bound": MAX_PUTS_PER_APPEND,
        "ok": value <= MAX_PUTS_PER_APPEND,
    }
    kinds = sorted({kind for b in blocks for kind in b["peak_rss"]})
    figures = [("append_p50", lambda b: b["append_ms_p50"], MAX_LATENCY_GROWTH)]
    figures += [
        (f"rss_{kind}", lambda b, kind=kind: b["peak_rss"].get(kind, 0), MAX_RSS_GROWTH)
        for kind in kinds
    ]
    for name, value, bound in figures:
        compared = _growth(blocks, value)
        if compared is not None:
            last, median = compared
            out[f"{name}_last_over_median"] = {
                "value": last / median,
                "last": last,
                "median": median,
                "bound": bound,
                "ok": last / median <= bound,
            }
    return out


def run(config: ClusterConfig, out: Path, block: int = BLOCK, *, progress: Bar = no_bar) -> dict:
    """Run the soak of ``config`` (its ``intervals``, ``data_dir`` replaced by
    a fresh one under ``out``, removed at the end), write ``soak.json`` and
    ``soak.png`` into ``out`` and return what ``soak.json`` holds; the
    intervals counted on ``progress`` (``soak``) as they are appended.
    ``ValueError`` for a ``block`` not within 1..intervals."""
    from ..cluster import Cluster
    from ..server import ServerClient

    if block < 1 or config.intervals < block:
        raise ValueError(f"--block must be 1..intervals ({config.intervals}), got {block}")
    out.mkdir(parents=True, exist_ok=True)
    data = out / "data"
    shutil.rmtree(data, ignore_errors=True)
    config = msgspec.structs.replace(config, data_dir=str(data), pace="max", verify=True)
    blocks: list[dict] = []
    started = time.monotonic()
    try:
        with Cluster(config) as cluster:
            client = ServerClient(cluster.shard_address)
            try:
                current = _Block(first=0)
                peaks: dict[int, int] = {}
                start = first = _server_counters(client, config.shard)

                def appended(record) -> None:
                    nonlocal current, start
                    current.latencies.append(record.latency_ms)
                    current.puts += record.blob_puts
                    current.put_bytes += record.blob_put_bytes
                    current.diff_bytes += record.diff_bytes
                    steps.advance()
                    n = len(current.latencies)
                    if n % SAMPLE_EVERY and n < block:
                        return
                    _sample_rss(cluster, current.rss, peaks)
                    now = _server_counters(client, config.shard)
                    current.max_batches = max(current.max_batches, now.batches)
                    if n == block:
                        blocks.append(current.row(start, now))
                        current, start = _Block(first=record.interval + 1), now

                with progress("soak", config.intervals) as steps:
                    stats = cluster.run(config.intervals, on_append=appended)
                settled = _settle(cluster.shard, client, first)
            finally:
                client.close()
    finally:
        shutil.rmtree(data, ignore_errors=True)
    result = {
        "config": msgspec.to_builtins(config),
        "block": block,
        "wall_s": time.monotonic() - started,
        "verified": bool(stats.verified),
        "verify_detail": stats.verify_detail,
        "restarts": stats.restarts,
        "read_back_peak_rss": stats.peak_rss.get("read-back"),
        "blocks": blocks,
        "settled": settled,
        "checks": checks(blocks) if blocks else {},
    }
    (out / "soak.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(blocks, out / "soak.png")
    return result


def plot(blocks: list[dict], path: Path) -> None:
    """Draw the blocks' figures, one panel each, against the interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .._figures import add_caption, caption

    x = [b["first_interval"] + b["appends"] for b in blocks]
    panels = [
        ("append latency (ms)", {"p50": "append_ms_p50", "p99": "append_ms_p99"}),
        (
            "blob PUTs per append",
            {"appends'": "append_puts_per_append", "compaction's": "compaction_puts_per_append"},
        ),
        ("consensus diff bytes per append", {"appends'": "diff_bytes_per_append"}),
        ("state", {"batches (max)": "max_batches", "parts": "parts"}),
        ("inline bytes in state", {"inline": "inline_bytes"}),
        ("rollup bytes per block", {"rollups": "rollup_bytes"}),
        ("compactions per block", {"applied": "compactions", "abandoned": "compactions_abandoned"}),
    ]
    kinds = sorted({k for b in blocks for k in b["peak_rss"]})
    figure, axes = plt.subplots(4, 2, figsize=(12, 13))
    for axis, (title, series) in zip(axes.flat, panels, strict=False):
        for label, key in series.items():
            axis.plot(x, [b[key] for b in blocks], marker=".", label=label)
        axis.set_title(title)
        axis.legend(fontsize="small")
    rss_axis = axes.flat[len(panels)]
    for kind in kinds:
        rss_axis.plot(
            x, [b["peak_rss"].get(kind, 0) / 2**20 for b in blocks], marker=".", label=kind
        )
    rss_axis.set_title("peak RSS (high-water mark) per process kind (MiB)")
    rss_axis.legend(fontsize="small")
    for axis in axes.flat:
        axis.set_xlabel("interval (each point: the block ending there)")
        axis.set_ylim(bottom=0)
    figure.tight_layout()
    note = f"blocks of {blocks[0]['appends']} intervals" if blocks else ""
    add_caption(figure, caption(note=note))
    figure.savefig(path, dpi=90)
    plt.close(figure)
