"""The table formats the peers write (Delta Lake, Iceberg), behind one
contract, so every way of writing an interval runs the same harness.

A :class:`Format` makes a table in a directory, opens a :class:`Committer`
on it in any process, and at the end tells what the table holds and what
writing it left on disk (:class:`Stored`). The formats are imported only
by name (:mod:`.registry`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Protocol

if TYPE_CHECKING:
    import pyarrow as pa

    from .wire import Outcome

#: How many times a commit that lost a race is retried before it fails: the
#: libraries' defaults (delta-rs 15, pyiceberg 4) run out with 32 writers
#: released together, which would measure the retry limit, not the format;
#: a commit that still fails is counted and its rows are missing.
COMMIT_RETRIES = 10_000


class Stored(NamedTuple):
    """What a table holds and what writing it left: its rows as read back
    (conformed to the shard schema), the data files on disk and their
    bytes, the metadata files written after the table's creation and their
    bytes, the commits after its creation, the files on disk the table
    does not reference (``orphans``), and the commit retries the table's
    own files record (delta-rs writes its count into each commit; 0 for a
    format that reports them per commit)."""

    rows: pa.Table
    data_files: int
    data_bytes: int
    metadata_files: int
    metadata_bytes: int
    commits: int
    orphans: int
    retries: int


class Committer(Protocol):
    """An open table in one process. ``append`` commits ``data`` as one
    data file in one commit, retrying a lost race as the library does (up
    to the budget it was opened with); a commit the library gives up on is
    an :class:`~.wire.Outcome` with its ``error`` (its rows are not in the
    table), never an exception. Any other error raises."""

    def append(self, data: pa.Table) -> Outcome: ...


class Format(Protocol):
    """A table format: ``modules`` it needs installed; ``create`` makes an
    empty table in ``location`` (an empty directory) whose commits retry a
    lost race up to ``retries`` times where the format keeps that with the
    table; ``open`` a :class:`Committer` on it (``retries`` where the format
    takes it per commit); ``stored`` reads it back (:class:`Stored`)."""

    modules: tuple[str, ...]

    def create(self, location: Path, retries: int) -> None: ...

    def open(self, location: Path, retries: int) -> Committer: ...

    def stored(self, location: Path) -> Stored: ...


def files_under(directory: Path, pattern: str) -> list[Path]:
    """The files under ``directory`` matching ``pattern`` (recursively)."""
    return [p for p in directory.rglob(pattern) if p.is_file()]


def total_bytes(paths: list[Path]) -> int:
    return sum(p.stat().st_size for p in paths)
