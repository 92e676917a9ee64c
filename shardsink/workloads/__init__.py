"""Workloads: what a cluster's workers write (docs/workloads.md).

:class:`AnyWorkload` is the protocol (one shard, or several); :func:`of`
finds the one a :class:`~shardsink.config.ClusterConfig` names. The built-ins: trickle,
churn and hydrate (:class:`Workload`, with exact expected collections) and
synth (:class:`~.synth.Synth`, a YCSB-like generator verified by digest).
"""

from .builtin import SCHEMA as SCHEMA
from .builtin import Workload as Workload
from .builtin import values as values
from .loading import (
    AnyWorkload as AnyWorkload,
)
from .loading import (
    check as check,
)
from .loading import (
    expected as expected,
)
from .loading import (
    expected_shards as expected_shards,
)
from .loading import (
    of as of,
)
from .loading import (
    prepare as prepare,
)
from .loading import (
    resolve as resolve,
)
from .loading import (
    shard_schema as shard_schema,
)
from .loading import (
    shard_schemas as shard_schemas,
)
from .loading import (
    shard_updates as shard_updates,
)
from .loading import (
    updates as updates,
)
