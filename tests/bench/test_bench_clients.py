"""Racing bench clients take a typed payload on stdin, decoded strictly."""

from __future__ import annotations

import pytest

from shardsink.bench import clients as racing
from shardsink.bench.appends import AppendsClient
from shardsink.bench.consensus import ConsensusClient
from shardsink.storage import open_consensus
from shardsink.storage.uri import STORE_ENV


def test_clients_race_as_their_payloads_say(tmp_path) -> None:
    """Each client appends to the payload's shard, versions of its size
    marked with its number."""
    store = f"sqlite://{tmp_path}/c.db"
    racing.check_stores([store], 0.2)  # the store's tables, before its clients race
    payloads = [ConsensusClient("s", c, 16, 0.2) for c in range(2)]
    reports = racing.race(
        "shardsink.bench.consensus:_client", payloads, 0.2, "two clients", env={STORE_ENV: store}
    )
    assert len(reports) == 2 and all(r["latencies_us"] for r in reports)  # each one raced
    consensus = open_consensus(store)
    try:
        log = consensus.scan("s", 0, 10**9)
    finally:
        consensus.close()
    assert len(log) == sum(r["committed"] for r in reports) > 0
    assert all(len(x.data) == 16 and x.data.split(b":")[0] in (b"0", b"1") for x in log)


def test_a_client_refuses_a_payload_of_another_type(tmp_path, capfd) -> None:
    """A consensus client given an appending client's payload does not start:
    its error names the field it does not know."""
    with pytest.raises(RuntimeError, match="did not get ready"):
        racing.race(
            "shardsink.bench.consensus:_client",
            [AppendsClient(["s"], 0.1)],
            0.1,
            "a mistyped client",
            env={STORE_ENV: f"sqlite://{tmp_path}/c.db"},
        )
    assert "unknown field `shards`" in capfd.readouterr().err
