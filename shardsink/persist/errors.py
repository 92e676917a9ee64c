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


class NotReadable(PersistError, ValueError):
    """A read asked for times the shard cannot serve (not yet written, or
    already merged forward below ``since``)."""


class CorruptState(PersistError):
    """Stored state, a diff, a rollup or a part does not decode, or a rollup is
    missing; nothing is guessed."""


class Contended(PersistError):
    """A command lost every compare-and-set it tried (``max_attempts``)."""
