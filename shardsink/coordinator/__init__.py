"""The coordinator: mint and append operators, the accounting check that
guards every append, supervision, and the consensus process it runs."""

from .coordinator import (
    STOP_S as STOP_S,
    Coordinator as Coordinator,
    consensus_call as consensus_call,
    interval_of as interval_of,
)
from .errors import ClusterError as ClusterError
from .groups import HostInfo as HostInfo
from .ray_groups import close_agents as close_agents, place_hosts as place_hosts
from .records import IntervalRecord as IntervalRecord
