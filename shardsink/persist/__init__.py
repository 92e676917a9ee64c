"""The durable shard: state versions, compare-and-append, leased readers,
garbage collection and compaction.

``Shard.open`` is the entry point (``shard.py``; writers in ``writer.py``,
readers in ``reader.py``); ``shardsink.open_shard`` also reaches a consensus
server, which applies the same commands (``commands``, ``transitions``,
``machine``) remotely. This door re-exports what other floors take from the
floor as a whole; the package's public names are the root's (docs/api.md).
"""

from .config import ShardConfig as ShardConfig
from .errors import (
    CorruptState as CorruptState,
)
from .errors import (
    NotReadable as NotReadable,
)
from .errors import (
    PartMissing as PartMissing,
)
from .errors import (
    PersistError as PersistError,
)
from .errors import (
    SchemaMismatch as SchemaMismatch,
)
from .errors import (
    ShardNotFound as ShardNotFound,
)
from .errors import (
    UpperMismatch as UpperMismatch,
)
from .reader import ListenEvent as ListenEvent
from .reader import Reader as Reader
from .shard import Shard as Shard
from .stats import ShardStats as ShardStats
from .writer import Writer as Writer
