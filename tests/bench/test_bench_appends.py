"""``bench appends``: through the server, racing clients never lose a compare-and-set."""

from __future__ import annotations

from shardsink.bench.appends import measure
from shardsink.process import ConsensusProcess
from shardsink.server.config import ServeConfig


def test_server_serializes_racing_clients(tmp_path) -> None:
    store = f"sqlite://{tmp_path}/c.db"
    blob = f"file://{tmp_path}/blob"
    with ConsensusProcess(store, blob, ServeConfig(bind=f"ipc://{tmp_path}/sock/c")) as server:
        via_server = measure(store, "server", server.address, blob, 4, 1.0)
    local = measure(store, "local", store, blob, 4, 1.0)
    assert via_server["appends"] > 0 and local["appends"] > 0
    assert via_server["cas_mismatches"] == 0
