"""Workloads: what a cluster's workers write (docs/workloads.md).

:class:`AnyWorkload` is the protocol (one shard, or several); :func:`of`
finds the one a :class:`~shardsink.config.ClusterConfig` names. The built-ins: trickle,
churn and hydrate (:class:`Workload`, with exact expected collections) and
synth (:class:`~.synth.Synth`, a YCSB-like generator verified by digest).
"""

from .builtin import SCHEMA, Workload, values
from .loading import (
    AnyWorkload,
    check,
    expected,
    expected_shards,
    is_sharded,
    of,
    prepare,
    resolve,
    shard_schema,
    shard_schemas,
    shard_updates,
    updates,
)

__all__ = [
    "SCHEMA",
    "AnyWorkload",
    "Workload",
    "check",
    "expected",
    "expected_shards",
    "is_sharded",
    "of",
    "prepare",
    "resolve",
    "shard_schema",
    "shard_schemas",
    "shard_updates",
    "updates",
    "values",
]
