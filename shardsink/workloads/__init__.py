"""Workloads: what a cluster's workers write (docs/workloads.md).

:class:`AnyWorkload` is the protocol (one shard, or several); :func:`of`
finds the one a :class:`~shardsink.config.ClusterConfig` names. The built-ins: trickle,
churn and hydrate (:class:`Workload`, with exact expected collections) and
synth (:class:`~.synth.Synth`, a YCSB-like generator verified by digest).
"""

from .builtin import SCHEMA as SCHEMA, Workload as Workload, values as values
from .loading import (
    AnyWorkload as AnyWorkload,
    check as check,
    expected as expected,
    expected_shards as expected_shards,
    is_sharded as is_sharded,
    of as of,
    prepare as prepare,
    resolve as resolve,
    shard_schema as shard_schema,
    shard_schemas as shard_schemas,
    shard_updates as shard_updates,
    updates as updates,
)
