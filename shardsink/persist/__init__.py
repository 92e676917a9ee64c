"""The durable shard: state versions, compare-and-append, leased readers,
garbage collection and compaction.

``Shard.open`` is the entry point (``shard.py``; writers in ``writer.py``,
readers in ``reader.py``); ``shardsink.open_shard`` also reaches a consensus
server. The state machine
(``commands``, ``transitions``, ``machine``) is public for the consensus
server that applies the same commands remotely.
"""

from .commands import Command, Result
from .compaction import CompactionReport
from .config import ShardConfig
from .errors import (
    Contended,
    CorruptState,
    NotReadable,
    PartMissing,
    PersistError,
    SchemaMismatch,
    ShardNotFound,
    UpperMismatch,
)
from .gc import GcReport
from .machine import LocalMachine, ShardMachine
from .parts import DEFAULT_SCHEMA
from .reader import ListenEvent, Reader
from .shard import Shard
from .state import Batch, BlobPart, InlinePart, ShardState
from .stats import MachineStats, ShardStats
from .writer import Writer

__all__ = [
    "DEFAULT_SCHEMA",
    "Batch",
    "BlobPart",
    "Command",
    "CompactionReport",
    "Contended",
    "CorruptState",
    "GcReport",
    "InlinePart",
    "ListenEvent",
    "LocalMachine",
    "MachineStats",
    "NotReadable",
    "PartMissing",
    "PersistError",
    "Reader",
    "Result",
    "SchemaMismatch",
    "Shard",
    "ShardConfig",
    "ShardMachine",
    "ShardNotFound",
    "ShardState",
    "ShardStats",
    "UpperMismatch",
    "Writer",
]
