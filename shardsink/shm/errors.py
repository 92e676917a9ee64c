"""Errors of the shared-memory part transport.

Every failure names what it concerns: the segment, offset and length of a part,
or the builder endpoint a worker is waiting for.
"""

from __future__ import annotations


class ShmError(Exception):
    """Base of every transport failure; never raised directly."""


class UnknownSegment(ShmError):
    """A reference names a segment that does not exist, is not of this cluster
    (or of an accepted creator), or is not private to this user."""


class CorruptPart(ShmError):
    """The bytes of a part are not exactly one valid Arrow IPC stream holding one
    record batch stamped with the reference's part id."""


class PartOutOfBounds(CorruptPart):
    """A reference's offset and length reach past the end of its segment."""


class SchemaMismatch(ShmError):
    """A part decoded fine but its schema is not the one the reader expects."""


class TransportTimeout(ShmError):
    """A worker waited too long for its builder: the arena stayed full of
    unacknowledged parts, or the send queue stayed full."""


class TransportError(ShmError):
    """The other side broke the protocol: the builder rejected a part, a part
    arrived out of order, or a message could not be decoded."""
