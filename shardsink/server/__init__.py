"""The consensus server (one process that serializes every shard's state
changes) and its client, a shard machine over ZeroMQ."""

from .client import RemoteMachine as RemoteMachine, ServerClient as ServerClient
from .config import ServeConfig as ServeConfig
from .history import (
    HISTORY_ENV as HISTORY_ENV,
    PROCESS_ENV as PROCESS_ENV,
    Op as Op,
    describe as describe,
)
from .metrics import (
    LATENCY_BUCKETS as LATENCY_BUCKETS,
    MetricsEndpoint as MetricsEndpoint,
    process_families as process_families,
)
from .server import ConsensusServer as ConsensusServer
