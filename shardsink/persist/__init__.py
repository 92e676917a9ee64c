"""The durable shard: state versions, compare-and-append, leased readers,
garbage collection and compaction.

``Shard.open`` is the entry point (``shard.py``; writers in ``writer.py``,
readers in ``reader.py``); ``shardsink.open_shard`` also reaches a consensus
server, which applies the same commands (``commands``, ``transitions``,
``machine``) remotely. This door re-exports what other floors take from the
floor as a whole; the package's public names are the root's (docs/api.md).
"""

from .batches import BatchBuilder as BatchBuilder, build_batch as build_batch
from .commands import (
    CLIENT_COMMANDS as CLIENT_COMMANDS,
    AlreadyAppended as AlreadyAppended,
    Appended as Appended,
    Command as Command,
    CompareAndAppend as CompareAndAppend,
    ExpireWriter as ExpireWriter,
    HeartbeatWriter as HeartbeatWriter,
    Leased as Leased,
    LeaseSeqno as LeaseSeqno,
    PartsMissing as PartsMissing,
    RegisterReader as RegisterReader,
    Result as Result,
    Retain as Retain,
    WriterGone as WriterGone,
    WrongUpper as WrongUpper,
)
from .compaction import (
    CompactionReport as CompactionReport,
    compact as compact,
    merge_runs as merge_runs,
)
from .config import (
    COMPACT_INTERVAL_S as COMPACT_INTERVAL_S,
    COMPACT_PART_BYTES as COMPACT_PART_BYTES,
    COMPACT_SLACK as COMPACT_SLACK,
    OFFLINE as OFFLINE,
    SERVED_FIELDS as SERVED_FIELDS,
    ShardConfig as ShardConfig,
    check_served as check_served,
)
from .digest import (
    NO_DIGEST_ENV as NO_DIGEST_ENV,
    Digest as Digest,
    comparable as comparable,
    mix as mix,
    row_hashes as row_hashes,
    total_known as total_known,
    written as written,
)
from .errors import (
    Contended as Contended,
    CorruptState as CorruptState,
    NotReadable as NotReadable,
    PartMissing as PartMissing,
    PartsNotFound as PartsNotFound,
    PersistError as PersistError,
    SchemaMismatch as SchemaMismatch,
    ShardNotFound as ShardNotFound,
    StateMissing as StateMissing,
    UpperMismatch as UpperMismatch,
    WriterExpired as WriterExpired,
)
from .gc import (
    GcReport as GcReport,
    check_grace as check_grace,
    collect_garbage as collect_garbage,
    expire as expire,
    sweep_leaked_blobs as sweep_leaked_blobs,
)
from .machine import (
    LocalMachine as LocalMachine,
    Prepared as Prepared,
    ShardMachine as ShardMachine,
    wall_clock_ms as wall_clock_ms,
)
from .maintenance import register_writer as register_writer
from .parts import (
    DEFAULT_SCHEMA as DEFAULT_SCHEMA,
    full_schema as full_schema,
    schema_from_bytes as schema_from_bytes,
)
from .reader import ListenEvent as ListenEvent, Reader as Reader
from .shard import (
    REMOTE_SCHEMES as REMOTE_SCHEMES,
    Shard as Shard,
    existing_shards as existing_shards,
)
from .shards import (
    ShardSet as ShardSet,
    TransactionMismatch as TransactionMismatch,
    TransactionRefused as TransactionRefused,
    at_one_upper as at_one_upper,
)
from .state import (
    Batch as Batch,
    BlobPart as BlobPart,
    ShardState as ShardState,
    check_shard_name as check_shard_name,
)
from .stats import MachineStats as MachineStats, ShardStats as ShardStats
from .transactions import LocalTransactions as LocalTransactions
from .writer import Writer as Writer
