"""Shared-memory part transport: zero-copy Arrow parts from worker to builder.

A worker writes each part as an Arrow IPC stream into its own pooled arena of
POSIX shared-memory segments (mode 0600) and sends a small reference over
ZeroMQ; its builder maps the segment once, reads the batch in place and
acknowledges it, which frees the space. Small parts travel inline instead.
Segments are named after their cluster and creator, so :func:`sweep` can remove
those of dead processes and :func:`unlink_cluster` all of a cluster at exit.
"""

from .arena import DEFAULT_CAPACITY as DEFAULT_CAPACITY, Arena as Arena, size_bound as size_bound
from .errors import (
    CorruptPart as CorruptPart,
    PartOutOfBounds as PartOutOfBounds,
    SchemaMismatch as SchemaMismatch,
    ShmError as ShmError,
    TransportError as TransportError,
    TransportTimeout as TransportTimeout,
    UnknownSegment as UnknownSegment,
)
from .link import (
    MESSAGE_PART_MAX_BYTES as MESSAGE_PART_MAX_BYTES,
    PartReceiver as PartReceiver,
    PartSender as PartSender,
    Received as Received,
)
from .messages import PartRef as PartRef
from .segments import SegmentReader as SegmentReader, decode_part as decode_part
from .sweep import (
    SegmentName as SegmentName,
    creator_alive as creator_alive,
    list_segments as list_segments,
    sweep as sweep,
    unlink_cluster as unlink_cluster,
    unlink_segment as unlink_segment,
)
