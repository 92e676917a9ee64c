"""Launching clusters, supervision, process groups and the workloads they write.

``Cluster`` is the Python API (``with Cluster(ClusterConfig(...)) as c:
c.run(); c.stats()``); ``shardsink up`` is its command line.
"""

from ..config import ClusterConfig as ClusterConfig
from ..coordinator import ClusterError as ClusterError, IntervalRecord as IntervalRecord
from ..workloads import Workload as Workload
from .cluster import Cluster as Cluster
from .control import (
    TIMEOUT_S as TIMEOUT_S,
    ControlError as ControlError,
    StatusRequest as StatusRequest,
    StopRequest as StopRequest,
    StopRequested as StopRequested,
    find as find,
    request as request,
)
from .dashboard import ControlSource as ControlSource, Dashboard as Dashboard, Plan as Plan
from .stats import ClusterStats as ClusterStats, Supervision as Supervision
from .verify import difference as difference, verify_shards as verify_shards
