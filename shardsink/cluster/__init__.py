"""Launching clusters, supervision, process groups and the workloads they write.

``Cluster`` is the Python API (``with Cluster(ClusterConfig(...)) as c:
c.run(); c.stats()``); ``shardsink up`` is its command line.
"""

from ..config import ClusterConfig
from ..workloads import Workload
from .cluster import Cluster, ClusterError, IntervalRecord
from .stats import ClusterStats, ProcessInfo, Supervision
from .verify import Verification

__all__ = [
    "Cluster",
    "ClusterConfig",
    "ClusterError",
    "ClusterStats",
    "IntervalRecord",
    "ProcessInfo",
    "Supervision",
    "Verification",
    "Workload",
]
