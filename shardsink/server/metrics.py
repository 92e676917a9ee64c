"""Prometheus metrics of a consensus server (``consensus serve --metrics-port P``),
and what a cluster's metrics (:mod:`shardsink.cluster.metrics`) share with them:
the ``/metrics`` endpoint, the latency buckets, the per-process families.

Names follow Prometheus conventions: ``shardsink_*_total`` counters,
``_seconds`` and ``_bytes`` units. The server's are labelled by shard:
appends and their latency (the compare-and-append's run in the server, its
durable store included) and the data parts they added are counted as the
request loop runs them (:attr:`~.server.ConsensusServer.on_command`);
everything else (diff bytes, rollups, compactions, GC, the server's memory
and CPU) is read from :meth:`~.server.ConsensusServer.stats` when scraped.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import psutil
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .._http import LOOPBACK, HttpServer
from ..persist import Appended, BlobPart, Command, CompareAndAppend, Result
from .server import ConsensusServer

#: Append latency buckets, seconds: a 2-core trickle appends in ~10 ms, a
#: hydrate's first interval or a restart takes seconds.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: Per-shard counters of ``ShardCounters`` exposed as ``shardsink_<name>_total``.
SHARD_COUNTED = {
    "commands": "State commands run",
    "gc_runs": "Garbage collections run",
    "blobs_deleted": "Blobs deleted by garbage collection",
    "leaked_swept": "Leaked blobs swept",
    "compactions": "Compactions applied",
    "compactions_abandoned": "Compactions abandoned (their inputs changed meanwhile)",
    "compacted_batches": "Batches compactions replaced",
    "compaction_puts": "Data parts compactions wrote to blob",
    "compaction_put_bytes": "Bytes of the data parts compactions wrote to blob",
}
#: Per-shard ``MachineStats`` counters exposed as ``shardsink_<name>_total``.
MACHINE_COUNTED = {
    "cas_calls": "Compare-and-set calls on the consensus store",
    "diff_bytes": "Bytes of state diffs written to the consensus store",
    "rollup_puts": "State rollups written to blob",
    "rollup_bytes": "Bytes of state rollups written to blob",
}


def process_families(
    members: Iterable[tuple[str, str, int]],
) -> tuple[GaugeMetricFamily, CounterMetricFamily]:
    """Resident memory and CPU time (user + system) of each ``(kind, name,
    pid)``, labelled by kind and name; a process gone meanwhile is left out."""
    rss = GaugeMetricFamily(
        "shardsink_process_resident_memory_bytes",
        "Resident memory of each live process",
        labels=["kind", "name"],
    )
    cpu = CounterMetricFamily(
        "shardsink_process_cpu_seconds",
        "CPU time (user + system) of each live process",
        labels=["kind", "name"],
    )
    for kind, name, pid in members:
        try:
            proc = psutil.Process(pid)
            memory, times = proc.memory_info(), proc.cpu_times()
        except psutil.Error:  # exited since it was listed
            continue
        rss.add_metric([kind, name], memory.rss)
        cpu.add_metric([kind, name], times.user + times.system)
    return rss, cpu


class MetricsEndpoint:
    """``registry`` served at ``http://host:port/metrics`` (port 0: a free
    one; :attr:`url` says which). ``ValueError`` naming the address if it
    cannot be bound or is not loopback. ``close()`` is idempotent."""

    def __init__(self, registry: CollectorRegistry, port: int, host: str = LOOPBACK) -> None:
        self.registry = registry
        self._http = HttpServer(
            {"/metrics": lambda: (CONTENT_TYPE_LATEST, generate_latest(registry))},
            host,
            port,
            name="shardsink-metrics",
        )
        self.url = f"{self._http.base}/metrics"

    def close(self) -> None:
        self._http.close()


class _Scraped(Collector):
    """What is read from the server when scraped."""

    def __init__(self, server: ConsensusServer) -> None:
        self._server = server

    def collect(self) -> Iterable[Metric]:
        stats = self._server.stats()
        labels = ["shard"]
        families = {
            name: CounterMetricFamily(f"shardsink_{name}", text, labels=labels)
            for name, text in {**SHARD_COUNTED, **MACHINE_COUNTED}.items()
        }
        gauges = {
            name: GaugeMetricFamily(f"shardsink_shard_{name}", f"The shard's {name}", labels=labels)
            for name in ("upper", "seqno", "batches", "parts", "inline_bytes", "readers")
        }
        failures = CounterMetricFamily(
            "shardsink_maintenance_failures",
            "Runs of a shard's maintenance that failed (each is retried on schedule), by kind",
            labels=["shard", "kind"],
        )
        for shard in stats.shards:
            for kind, count in shard.failures.items():
                failures.add_metric([shard.shard, kind], count)
            for name in SHARD_COUNTED:
                families[name].add_metric([shard.shard], getattr(shard, name))
            for name in MACHINE_COUNTED:
                families[name].add_metric([shard.shard], getattr(shard.machine, name))
            for name, gauge in gauges.items():
                gauge.add_metric([shard.shard], getattr(shard, name))
        yield from families.values()
        yield failures
        yield from gauges.values()
        yield CounterMetricFamily(
            "shardsink_requests", "Requests the server answered", value=stats.requests
        )
        yield CounterMetricFamily(
            "shardsink_request_errors", "Requests answered with an error", value=stats.errors
        )
        yield from process_families([("consensus", "consensus", os.getpid())])


class ServerMetrics:
    """The metrics of ``server``, served on ``host:port`` (see the module).
    Sets ``server.on_command``. ``close()`` is idempotent."""

    def __init__(self, server: ConsensusServer, port: int, host: str = LOOPBACK) -> None:
        registry = CollectorRegistry()
        labels = ["shard"]
        self._appends = Counter(
            "shardsink_appends", "Intervals appended", labels, registry=registry
        )
        self._latency = Histogram(
            "shardsink_append_latency_seconds",
            "Time the server took to run each successful compare-and-append, stored durably",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self._puts = Counter(
            "shardsink_blob_puts",
            "Blob data parts in the batches appended",
            labels,
            registry=registry,
        )
        self._put_bytes = Counter(
            "shardsink_blob_put_bytes",
            "Bytes of the blob data parts in the batches appended",
            labels,
            registry=registry,
        )
        registry.register(_Scraped(server))
        self._endpoint = MetricsEndpoint(registry, port, host)
        self.url = self._endpoint.url
        server.on_command = self.observe

    def observe(self, shard: str, command: Command, result: Result, seconds: float) -> None:
        """Count ``command`` (run on ``shard``) if it appended an interval."""
        if not (isinstance(command, CompareAndAppend) and isinstance(result, Appended)):
            return
        parts = [p for batch in command.batches for p in batch.parts if isinstance(p, BlobPart)]
        self._appends.labels(shard).inc()
        self._latency.labels(shard).observe(seconds)
        self._puts.labels(shard).inc(len(parts))
        self._put_bytes.labels(shard).inc(sum(p.encoded_bytes for p in parts))

    def close(self) -> None:
        self._endpoint.close()
