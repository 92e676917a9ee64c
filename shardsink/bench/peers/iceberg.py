"""Apache Iceberg (``pyiceberg``) as a peer's table format: its SQL
catalog on SQLite (``catalog.db``) and a local warehouse, both in the
peer's directory.

A committer holds its catalog and table for the life of its process and
refreshes the table before each append (what pyiceberg's own retry does
after a lost race: without it every writer but the last to commit would
lose a race, and sleep pyiceberg's backoff, on every interval). ``append``
is ``Table.append`` (one Parquet file, one snapshot, one commit).

Iceberg has no unsigned integers: the shard schema's ``ts`` (uint64) is
stored as a long and cast back when read. Commit retries are counted as
pyiceberg makes them: every ``CommitFailedException`` the catalog raises is
an attempt lost to another writer, which pyiceberg retries (table property
``commit.retry.num-retries``, its backoff from 100 ms doubling) until one
escapes, a failure. Metadata is the table's ``metadata`` directory
(metadata JSON, manifest lists, manifests) after its creation; the
catalog's one row per table is not counted.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from ...persist import parts as P
from .formats import Stored, files_under, total_bytes
from .wire import Outcome

if TYPE_CHECKING:
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.table import Table

NAMESPACE = "bench"
IDENTIFIER = f"{NAMESPACE}.peer"
#: The shard schema as Iceberg holds it (``ts`` a signed long).
SCHEMA = pa.schema(
    [("key", pa.int64()), ("val", pa.string()), ("ts", pa.int64()), ("diff", pa.int64())]
)


def catalog(location: Path) -> SqlCatalog:
    """The peer's SQL catalog in ``location``, counting lost commits."""
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.exceptions import CommitFailedException

    class Counting(SqlCatalog):
        """A SQL catalog that counts the commits it refused (``conflicts``)."""

        conflicts = 0

        def commit_table(self, table, requirements, updates):
            try:
                return super().commit_table(table, requirements, updates)
            except CommitFailedException:
                self.conflicts += 1
                raise

    root = location.absolute()
    # pyiceberg warns at every retry; they are counted, not printed
    logging.getLogger("pyiceberg.table").setLevel(logging.ERROR)
    return Counting(
        "peer", uri=f"sqlite:///{root}/catalog.db", warehouse=f"file://{root}/warehouse"
    )


class IcebergFormat:
    """:class:`~.formats.Format` for Iceberg."""

    modules = ("pyiceberg", "sqlalchemy")

    def create(self, location: Path, retries: int) -> None:
        """An empty table whose commits retry up to ``retries`` times."""
        store = catalog(location)
        store.create_namespace(NAMESPACE)
        store.create_table(
            IDENTIFIER, schema=SCHEMA, properties={"commit.retry.num-retries": str(retries)}
        )

    def open(self, location: Path, retries: int) -> IcebergCommitter:
        """A committer (the table keeps its ``retries``)."""
        return IcebergCommitter(location)

    def stored(self, location: Path) -> Stored:
        with _pool_shut_after():
            return self._stored(location)

    def _stored(self, location: Path) -> Stored:
        table = catalog(location).load_table(IDENTIFIER)
        referenced = {_local(task.file.file_path) for task in table.scan().plan_files()}
        data = files_under(location / "warehouse", "*.parquet")
        metadata = files_under(Path(_local(table.metadata_location)).parent, "*")
        written = [p for p in metadata if not p.name.startswith("00000-")]
        return Stored(
            rows=P.conform(table.scan().to_arrow(), P.full_schema()),
            data_files=len(data),
            data_bytes=total_bytes(data),
            metadata_files=len(written),
            metadata_bytes=total_bytes(written),
            commits=len(table.metadata.snapshots),
            orphans=sum(str(p) not in referenced for p in data) + _orphan_metadata(table, metadata),
            retries=0,
        )


ICEBERG = IcebergFormat()


class IcebergCommitter:
    """A writer's open Iceberg table (:class:`~.formats.Committer`)."""

    def __init__(self, location: Path) -> None:
        self.catalog = catalog(location)
        self.table = self.catalog.load_table(IDENTIFIER)

    def append(self, data: pa.Table) -> Outcome:
        from pyiceberg.exceptions import CommitFailedException

        before = self.catalog.conflicts
        self.table.refresh()
        try:
            self.table.append(data.cast(SCHEMA))
        except CommitFailedException as exc:
            lost = self.catalog.conflicts - before
            return Outcome(retries=max(lost - 1, 0), error=f"CommitFailedException: {exc}")
        return Outcome(retries=self.catalog.conflicts - before)


@contextlib.contextmanager
def _pool_shut_after() -> Iterator[None]:
    """Shut pyiceberg's process-wide thread pool (its scans plan and read
    through it) after the block. Left running, its threads outlive the read:
    a process with threads no longer forks its zygote but spawns it
    (:func:`shardsink.process.zygote.fork_is_safe`), so every cluster a
    bench or test process starts after an Iceberg read-back would start
    slower than one before it."""
    from pyiceberg.utils.concurrent import ExecutorFactory

    try:
        yield
    finally:
        pool, ExecutorFactory._instance = ExecutorFactory._instance, None
        if pool is not None:
            pool.shutdown(wait=True)


def _local(uri: str) -> str:
    return uri.removeprefix("file://")


def _orphan_metadata(table: Table, files: list[Path]) -> int:
    """Metadata files no version of the table reaches: metadata JSON files
    past one for each version up to the current (a lost commit wrote one
    too), manifest lists and manifests of no snapshot."""
    current = int(Path(_local(table.metadata_location)).name.split("-", 1)[0])
    json_files = sum(p.name.endswith(".metadata.json") for p in files)
    reached = {_local(s.manifest_list) for s in table.metadata.snapshots}
    for snapshot in table.metadata.snapshots:
        reached.update(_local(m.manifest_path) for m in snapshot.manifests(table.io))
    avro = [p for p in files if p.suffix == ".avro"]
    return json_files - (current + 1) + sum(str(p) not in reached for p in avro)
