"""Workloads: what a cluster's workers write (docs/workloads.md).

:class:`AnyWorkload` is the protocol; :func:`of` finds the one a
:class:`~shardsink.config.ClusterConfig` names. The built-ins: trickle,
churn and hydrate (:class:`Workload`, with exact expected collections) and
synth (:class:`~.synth.Synth`, a YCSB-like generator verified by digest).
"""

from .builtin import SCHEMA, Workload, values
from .loading import AnyWorkload, expected, of, prepare, resolve, shard_schema, updates

__all__ = [
    "SCHEMA",
    "AnyWorkload",
    "Workload",
    "expected",
    "of",
    "prepare",
    "resolve",
    "shard_schema",
    "updates",
    "values",
]
