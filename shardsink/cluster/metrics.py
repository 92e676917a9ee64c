"""Prometheus metrics of a running cluster (``shardsink up --metrics-port P``).

:class:`Metrics` serves ``/metrics`` on loopback from the HTTP server thread
shared with consensus servers (:class:`~shardsink.server.metrics.MetricsEndpoint`): the
coordinator only :meth:`~Metrics.observe`\\ s each appended interval (the
client's counters are thread-safe), and supervision counts and per-process
figures are read when scraped. Names follow Prometheus conventions:
``shardsink_*_total`` counters, ``_seconds`` and ``_bytes`` units.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .._http import LOOPBACK
from ..coordinator import HostInfo, IntervalRecord
from ..server import LATENCY_BUCKETS, MetricsEndpoint, process_families

#: IntervalRecord fields counted as ``shardsink_<name>_total``, with their help.
COUNTED = {
    "rows": "Rows appended",
    "blob_puts": "Blob PUTs of data parts",
    "blob_put_bytes": "Bytes of data parts PUT to the blob store",
    "data_parts": "Data parts appended",
    "inline_parts": "Parts of shared batches that reached their builder inline",
    "inline_bytes": "Bytes of parts that reached their builder inline",
    "segment_parts": "Parts of shared batches that reached their builder through shared memory",
    "diff_bytes": "Bytes of state diffs written by appends",
    "cas_calls": "Compare-and-append calls",
}


class Supervised(Collector):
    """What is read at scrape time: restarts by kind, abandoned attempts, and
    each live process's resident memory and CPU time. ``supervision`` returns
    (group restarts, consensus restarts, abandoned attempts); ``members``
    (kind, name, pid, alive) of every process; ``hosts`` every host placed
    (alive, groups, group restarts: ``shardsink_host_*``); all run in the
    scrape thread and may raise ``RuntimeError`` while the coordinator
    restarts a group (then the scrape lacks those families rather than
    fail)."""

    def __init__(
        self,
        supervision: Callable[[], tuple[int, int, int]],
        members: Callable[[], list[tuple[str, str, int, bool]]],
        hosts: Callable[[], list[HostInfo]],
    ) -> None:
        self._supervision = supervision
        self._members = members
        self._hosts = hosts

    def collect(self) -> Iterable[Metric]:
        try:
            groups, consensus, abandoned = self._supervision()
            members = self._members()
            hosts = self._hosts()
        except RuntimeError:  # a dict changed size under us: the next scrape has them
            return
        restarts = CounterMetricFamily(
            "shardsink_restarts", "Process restarts by kind", labels=["kind"]
        )
        restarts.add_metric(["group"], groups)
        restarts.add_metric(["consensus"], consensus)
        yield restarts
        yield CounterMetricFamily(
            "shardsink_abandoned_attempts", "Interval attempts not appended", value=abandoned
        )
        yield from process_families(
            (kind, name, pid) for kind, name, pid, alive in members if alive
        )
        yield from host_families(hosts)


def host_families(hosts: list[HostInfo]) -> Iterable[Metric]:
    """``shardsink_host_up`` (labelled with its node and address),
    ``shardsink_host_groups`` and ``shardsink_host_restarts_total``, by host."""
    up = GaugeMetricFamily(
        "shardsink_host_up", "1 while the host's agent lives", labels=["host", "node", "address"]
    )
    groups = GaugeMetricFamily("shardsink_host_groups", "Groups the host runs", labels=["host"])
    restarts = CounterMetricFamily(
        "shardsink_host_restarts", "Group restarts of groups on the host", labels=["host"]
    )
    for host in hosts:
        name = str(host.index)
        up.add_metric([name, host.node_id, host.address], 1.0 if host.alive else 0.0)
        groups.add_metric([name], len(host.groups))
        restarts.add_metric([name], host.restarts)
    yield from (up, groups, restarts)


class Metrics:
    """A registry of one cluster's metrics and its HTTP server on
    ``host:port`` (0: a free port; :attr:`url` says which). ``close()`` stops
    the server and is idempotent. ``ValueError`` naming the port if it cannot
    be bound."""

    def __init__(self, port: int, supervised: Supervised, host: str = LOOPBACK) -> None:
        self.registry = CollectorRegistry()
        self._appends = Counter("shardsink_appends", "Intervals appended", registry=self.registry)
        self._counted = {
            name: Counter(f"shardsink_{name}", text, registry=self.registry)
            for name, text in COUNTED.items()
        }
        self._latency = Histogram(
            "shardsink_append_latency_seconds",
            "Append latency of each interval appended (latency_ms of its IntervalRecord)",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(supervised)
        self._endpoint = MetricsEndpoint(self.registry, port, host)
        self.url = self._endpoint.url

    def observe(self, record: IntervalRecord) -> None:
        """Count an appended interval."""
        self._appends.inc()
        for name, counter in self._counted.items():
            counter.inc(getattr(record, name))
        self._latency.observe(record.latency_ms / 1000)

    def close(self) -> None:
        self._endpoint.close()
