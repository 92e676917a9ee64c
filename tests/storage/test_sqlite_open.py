"""Opening a new SQLite consensus file from several connections at once: the
switch to WAL takes an exclusive lock outside SQLite's busy handler, so
without retries one opener in a few failed with "database is locked"."""

from __future__ import annotations

import contextlib
import threading

from shardsink.storage.errors import StorageError
from shardsink.storage.sqlite import SqliteConsensus

ROUNDS = 50
OPENERS = 3


def test_concurrent_openers_of_a_new_file_all_succeed(tmp_path) -> None:
    failures: list[str] = []
    for round_ in range(ROUNDS):
        path = tmp_path / f"c{round_}.db"
        start = threading.Barrier(OPENERS)

        def open_one(path=path, start=start) -> None:
            start.wait(10)
            try:
                with contextlib.closing(SqliteConsensus(path)) as consensus:
                    consensus.head("s")
            except StorageError as exc:
                failures.append(str(exc))

        threads = [threading.Thread(target=open_one) for _ in range(OPENERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    assert failures == []
