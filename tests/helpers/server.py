"""A consensus server in a thread of the test, for tests of its maintenance."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

from shardsink.persist import spine
from shardsink.persist.state import ShardState
from shardsink.server import ConsensusServer
from shardsink.storage import open_consensus
from tests.helpers.wait import wait_until


@contextlib.contextmanager
def serving(tmp_path: Path, blob, *, consensus=None, **options) -> Iterator[ConsensusServer]:
    """A ``ConsensusServer`` on ``consensus`` (a URI or an open store;
    default SQLite in ``tmp_path``) and ``blob`` (an open store), serving
    from a thread until the block ends; then stopped, joined (bounded) and
    closed. ``options`` go to the server;
    its GC and sweep are off unless they name an interval."""
    options = {"gc_interval_s": 0, "sweep_interval_s": 0, **options}
    server = ConsensusServer(
        consensus
        if consensus is not None and not isinstance(consensus, str)
        else open_consensus(consensus or f"sqlite://{tmp_path}/c.db"),
        blob,
        f"ipc://{tmp_path}/sock/c",
        **options,
    )
    stop = threading.Event()
    loop = threading.Thread(target=server.serve, args=(stop,))
    loop.start()
    try:
        yield server
    finally:
        stop.set()
        loop.join(30)
        server.close()
    assert not loop.is_alive(), "the server's loop did not stop"


def settled_spine(shard, timeout_s: float = 30.0) -> ShardState:
    """The shard's state once the server's spine has no merge left to make."""
    last: list[ShardState] = []

    def settled() -> bool:
        last[:] = [shard.state(refresh=True)]
        return not spine.merges(last[0])

    wait_until(settled, timeout_s, lambda: f"a settled spine ({len(last[0].batches)} batches stay)")
    return last[0]
