"""Shared-memory part transport: zero-copy Arrow parts from worker to builder.

A worker writes each part as an Arrow IPC stream into its own pooled arena of
POSIX shared-memory segments (mode 0600) and sends a small reference over
ZeroMQ; its builder maps the segment once, reads the batch in place and
acknowledges it, which frees the space. Small parts travel inline instead.
Segments are named after their cluster and creator, so :func:`sweep` can remove
those of dead processes and :func:`unlink_cluster` all of a cluster at exit.
"""

from .arena import DEFAULT_CAPACITY as DEFAULT_CAPACITY
from .arena import Arena as Arena
from .arena import size_bound as size_bound
from .errors import (
    CorruptPart as CorruptPart,
)
from .errors import (
    PartOutOfBounds as PartOutOfBounds,
)
from .errors import (
    SchemaMismatch as SchemaMismatch,
)
from .errors import (
    ShmError as ShmError,
)
from .errors import (
    TransportError as TransportError,
)
from .errors import (
    TransportTimeout as TransportTimeout,
)
from .errors import (
    UnknownSegment as UnknownSegment,
)
from .link import (
    MESSAGE_PART_MAX_BYTES as MESSAGE_PART_MAX_BYTES,
)
from .link import (
    PartReceiver as PartReceiver,
)
from .link import (
    PartSender as PartSender,
)
from .link import (
    Received as Received,
)
from .messages import PartRef as PartRef
from .segments import SegmentReader as SegmentReader
from .segments import decode_part as decode_part
from .sweep import (
    SegmentName as SegmentName,
)
from .sweep import (
    creator_alive as creator_alive,
)
from .sweep import (
    list_segments as list_segments,
)
from .sweep import (
    sweep as sweep,
)
from .sweep import (
    unlink_cluster as unlink_cluster,
)
