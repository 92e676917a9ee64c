"""Fault injection at random times: ``shardsink chaos`` (docs/chaos.md).

A churn cluster runs under a seeded nemesis that kills and pauses its
processes and releases fault points, while readers check snapshots and
maintenance compacts and collects garbage; at the end the shard, its blobs,
its processes and its shared memory are checked.

Modules: ``schedule`` (the seeded fault schedule, pure), ``nemesis`` (carries
it out), ``clients`` (readers, maintenance), ``checks`` (the final checks),
``runner`` (the coordinator's lifecycle and the run), ``config``, ``context``.
"""

from .config import ChaosConfig as ChaosConfig
from .runner import run_chaos as run_chaos
from .schedule import FAULT_KINDS as FAULT_KINDS, schedule as schedule
