"""Launching clusters, supervision, process groups and the workloads they write.

``Cluster`` is the Python API (``with Cluster(ClusterConfig(...)) as c:
c.run(); c.stats()``); ``shardsink up`` is its command line.
"""

from ..config import ClusterConfig as ClusterConfig
from ..coordinator.errors import ClusterError as ClusterError
from ..coordinator.records import IntervalRecord as IntervalRecord
from ..workloads import Workload as Workload
from .cluster import Cluster as Cluster
from .stats import ClusterStats as ClusterStats
