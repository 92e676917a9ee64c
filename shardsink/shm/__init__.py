"""Shared-memory part transport: zero-copy Arrow parts from worker to builder.

A worker writes each part as an Arrow IPC stream into its own pooled arena of
POSIX shared-memory segments (mode 0600) and sends a small reference over
ZeroMQ; its builder maps the segment once, reads the batch in place and
acknowledges it, which frees the space. Small parts travel inline instead.
Segments are named after their cluster and creator, so :func:`sweep` can remove
those of dead processes and :func:`unlink_cluster` all of a cluster at exit.
"""

from .arena import DEFAULT_CAPACITY, DEFAULT_SEGMENT_SIZE, Arena, size_bound
from .errors import (
    CorruptPart,
    PartOutOfBounds,
    SchemaMismatch,
    ShmError,
    TransportError,
    TransportTimeout,
    UnknownSegment,
)
from .link import MESSAGE_PART_MAX_BYTES, PartReceiver, PartSender, Received
from .messages import PartRef
from .segments import SegmentReader, decode_part
from .sweep import SegmentName, creator_alive, list_segments, sweep, unlink_cluster

__all__ = [
    "DEFAULT_CAPACITY",
    "DEFAULT_SEGMENT_SIZE",
    "MESSAGE_PART_MAX_BYTES",
    "Arena",
    "CorruptPart",
    "PartOutOfBounds",
    "PartReceiver",
    "PartRef",
    "PartSender",
    "Received",
    "SchemaMismatch",
    "SegmentName",
    "SegmentReader",
    "ShmError",
    "TransportError",
    "TransportTimeout",
    "UnknownSegment",
    "creator_alive",
    "decode_part",
    "list_segments",
    "size_bound",
    "sweep",
    "unlink_cluster",
]
