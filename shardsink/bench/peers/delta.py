"""Delta Lake (``deltalake``, delta-rs) as a peer's table format.

A committer holds a ``DeltaTable`` for the life of its process, as a
long-running writer does; delta-rs brings it up to date at each commit.
``append`` is ``write_deltalake`` (one Parquet file, one commit); the
``per-interval`` peer's workers write their files with ``write_file`` and
the driver commits them all in one transaction (``commit_files``).

Commit retries are delta-rs's own count, ``num_retries`` in each commit's
``commitInfo``; a commit it gives up on raises ``CommitFailedError``.
Metadata is the ``_delta_log`` directory (commits, checkpoints) after the
table's creation (version 0).
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.compute as pc
import pyarrow.parquet as pq

from ...persist import parts as P
from .formats import Stored, files_under, total_bytes
from .wire import FileRef, Outcome

if TYPE_CHECKING:
    import pyarrow as pa

#: The log's first commit, which created the empty table.
_CREATED = "00000000000000000000.json"


class DeltaFormat:
    """:class:`~.formats.Format` for Delta Lake."""

    modules = ("deltalake",)

    def create(self, location: Path, retries: int) -> None:
        """An empty table of the shard schema (delta-rs takes ``retries`` per commit)."""
        from deltalake import write_deltalake

        write_deltalake(str(location), P.full_schema().empty_table(), mode="append")

    def open(self, location: Path, retries: int) -> DeltaCommitter:
        return DeltaCommitter(location, retries)

    def stored(self, location: Path) -> Stored:
        from deltalake import DeltaTable

        table = DeltaTable(str(location))
        referenced = {Path(p).name for p in table.file_uris()}
        data = files_under(location, "*.parquet")
        data = [p for p in data if "_delta_log" not in p.parts]
        log = [p for p in files_under(location / "_delta_log", "*") if p.name != _CREATED]
        commits = [p for p in log if p.name.endswith(".json") and p.name[:20].isdigit()]
        return Stored(
            rows=P.conform(table.to_pyarrow_table(), P.full_schema()),
            data_files=len(data),
            data_bytes=total_bytes(data),
            metadata_files=len(log),
            metadata_bytes=total_bytes(log),
            commits=len(commits),
            orphans=sum(p.name not in referenced for p in data),
            retries=sum(_retries(p) for p in commits),
        )


DELTA = DeltaFormat()


class DeltaCommitter:
    """A writer's open Delta table (:class:`~.formats.Committer`), retrying
    a lost race up to ``retries`` times."""

    def __init__(self, location: Path, retries: int) -> None:
        from deltalake import CommitProperties, DeltaTable

        self.location = location
        self.table = DeltaTable(str(location))
        self.properties = CommitProperties(max_commit_retries=retries)

    def append(self, data: pa.Table) -> Outcome:
        from deltalake import write_deltalake
        from deltalake.exceptions import CommitFailedError

        try:
            write_deltalake(self.table, data, mode="append", commit_properties=self.properties)
        except CommitFailedError as exc:
            return Outcome(error=f"CommitFailedError: {exc}")
        return Outcome()

    def write_file(self, data: pa.Table) -> FileRef:
        """``data`` as a new Parquet file in the table's directory, not committed."""
        name = f"part-{uuid.uuid4().hex}.parquet"
        pq.write_table(data, self.location / name)
        return FileRef(path=name, size=(self.location / name).stat().st_size, stats=_stats(data))

    def commit_files(self, files: list[FileRef]) -> Outcome:
        """One commit adding ``files`` (written by :meth:`write_file`)."""
        from deltalake.exceptions import CommitFailedError
        from deltalake.transaction import AddAction

        now = int(time.time() * 1000)
        actions = [AddAction(f.path, f.size, {}, now, True, f.stats) for f in files]
        try:
            self.table.create_write_transaction(
                actions, "append", P.full_schema(), commit_properties=self.properties
            )
        except CommitFailedError as exc:
            return Outcome(error=f"CommitFailedError: {exc}")
        return Outcome()


def _retries(commit: Path) -> int:
    """delta-rs's ``num_retries`` of the commit in ``commit`` (its first
    line is the ``commitInfo``)."""
    with commit.open() as f:
        info = json.loads(f.readline()).get("commitInfo", {})
    return int(info.get("operationMetrics", {}).get("num_retries", 0))


def _stats(table: pa.Table) -> str:
    """Delta file statistics (row count, min/max of key and ts, null counts)."""
    columns = ("key", "ts")
    return json.dumps(
        {
            "numRecords": table.num_rows,
            "minValues": {c: pc.min(table[c]).as_py() for c in columns},
            "maxValues": {c: pc.max(table[c]).as_py() for c in columns},
            "nullCount": {c: 0 for c in table.column_names},
        }
    )
