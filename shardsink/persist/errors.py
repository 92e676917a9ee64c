"""Errors of the durable shard; each names the shard and what went wrong."""

from __future__ import annotations


class PersistError(Exception):
    """Base of every shard error."""


class UpperMismatch(PersistError):
    """A compare-and-append expected the upper ``expected``; the shard's upper is ``actual``."""

    def __init__(self, shard: str, expected: int, actual: int) -> None:
        super().__init__(
            f"shard {shard!r}: upper mismatch: expected upper {expected}, actual upper {actual}"
        )
        self.shard, self.expected, self.actual = shard, expected, actual


class PartMissing(PersistError):
    """A part's blob stayed missing through every refresh of state."""

    def __init__(self, shard: str, key: str, attempts: int) -> None:
        super().__init__(
            f"shard {shard!r}: part {key!r} is missing from blob after {attempts} reads "
            "from refreshed state"
        )
        self.shard, self.key, self.attempts = shard, key, attempts


class SchemaMismatch(PersistError, ValueError):
    """The shard exists with a schema other than the one asked for."""


class ShardNotFound(PersistError, LookupError):
    """The shard has no state and was not to be created."""


class StateMissing(PersistError):
    """The consensus store knows no state of a shard whose parts or rollups
    the blob store holds: the consensus store was emptied, replaced or
    deleted while the blobs stayed. Nothing is created over them (a new
    shard at upper 0 would hide them, and a sweep would delete them as
    leaked); restoring the store, or deleting the blobs, is the user's act."""


class WriterExpired(PersistError):
    """The writer is no longer registered (its lease ran out): nothing was
    appended; register a new writer, and write the batch again under it."""


class PartsNotFound(PersistError):
    """An append or compaction named blob parts that are not in blob as
    described; nothing was committed. ``keys`` names them."""

    def __init__(self, shard: str, keys: tuple[str, ...], reason: str) -> None:
        super().__init__(f"shard {shard!r}: refused to commit parts not in blob: {reason}")
        self.shard, self.keys = shard, keys


class NotReadable(PersistError, ValueError):
    """A read asked for times the shard cannot serve (not yet written, or
    already merged forward below ``since``)."""


class CorruptState(PersistError):
    """Stored state, a diff, a rollup or a part does not decode, or a rollup is
    missing; nothing is guessed."""


class Contended(PersistError):
    """A command lost every compare-and-set it tried (``max_attempts``)."""
