"""The durable shard: state versions, compare-and-append, leased readers,
garbage collection and compaction.

``open_shard`` is the entry point; see ``shard.py``. The state machine
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
from .shard import ListenEvent, Reader, Shard, Writer, open_shard
from .state import Batch, BlobPart, InlinePart, ShardState
from .stats import MachineStats, ShardStats

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
    "open_shard",
]
