"""Fault injection at random times: ``shardsink chaos`` (DESIGN.md section 10).

A churn cluster runs under a seeded nemesis that kills and pauses its
processes and releases fault points, while readers check snapshots and
maintenance compacts and collects garbage; at the end the shard, its blobs,
its processes and its shared memory are checked. See :mod:`.runner`.
"""

from .runner import ChaosConfig, ChaosReport, run_chaos
from .schedule import FAULT_KINDS, Event, schedule

__all__ = ["FAULT_KINDS", "ChaosConfig", "ChaosReport", "Event", "run_chaos", "schedule"]
