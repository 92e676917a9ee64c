"""The consensus server's typed launch: its ServeConfig is the child's
payload (no store URI in it), readiness is a :class:`Ready` on its channel
(with metrics too), and a child that fails or stays silent before it is
ready is reported with its log tail."""

from __future__ import annotations

import urllib.request

import msgspec
import pytest

from shardsink import open_shard
from shardsink.persist.config import ShardConfig
from shardsink.process import ConsensusProcess, ConsensusStartError, Zygote, consensus as launcher
from shardsink.server.config import ServeConfig

PW = "Zq7-s3cr3t"


def _stores(tmp_path) -> tuple[str, str]:
    return f"sqlite://{tmp_path}/consensus.db", f"file://{tmp_path}/blob"


def test_the_serve_config_is_the_payload_and_the_child_serves_with_it(tmp_path) -> None:
    store, blob = _stores(tmp_path)
    config = ServeConfig(bind=f"ipc://{tmp_path}/sock/c", rollup_threshold=4, max_attempts=8)
    server = ConsensusProcess(store, blob, config)
    payload = server.child.launch.payload
    assert msgspec.msgpack.decode(payload, type=ServeConfig) == config
    assert store.encode() not in payload and blob.encode() not in payload
    with server:
        assert server.address == config.bind and server.metrics_url is None
        other = ShardConfig(rollup_threshold=5, max_attempts=9)
        with pytest.raises(ValueError) as refused:
            open_shard("s", blob=blob, consensus=server.address, config=other, create=True)
    # the server's values, which only its payload gave it
    assert "rollup_threshold=4 (--rollup-threshold), max_attempts=8" in str(refused.value)


def test_a_config_naming_its_stores_or_no_bind_is_refused(tmp_path) -> None:
    store, blob = _stores(tmp_path)
    secret = f"postgresql://u:{PW}@h/db"
    with pytest.raises(ValueError, match="not in its config") as refused:
        ConsensusProcess(store, blob, ServeConfig(bind=f"ipc://{tmp_path}/c", store=secret))
    assert PW not in str(refused.value)
    with pytest.raises(ValueError, match=r"config\.bind"):
        ConsensusProcess(store, blob, ServeConfig())


def test_it_is_ready_with_metrics_on(tmp_path) -> None:
    """With metrics the command prints ``metrics at`` first; the launcher
    reads a message, not a line, so that changes nothing."""
    store, blob = _stores(tmp_path)
    config = ServeConfig(bind=f"ipc://{tmp_path}/sock/c", metrics_port=0)
    with ConsensusProcess(store, blob, config) as server:
        assert server.address == config.bind
        url = server.metrics_url
        assert url is not None and url.startswith("http://127.0.0.1:"), url
        with urllib.request.urlopen(url, timeout=10) as response:
            assert b"shardsink_" in response.read()
        with open_shard("s", blob=blob, consensus=server.address, create=True) as shard:
            assert shard.upper == 0


def test_it_is_ready_forked_from_a_zygote_too(tmp_path) -> None:
    store, blob = _stores(tmp_path)
    zygote = Zygote([launcher.ROLE], tmp_path).start()
    try:
        config = ServeConfig(bind=f"ipc://{tmp_path}/sock/c")
        with ConsensusProcess(store, blob, config, starter=zygote, run_dir=tmp_path) as server:
            assert server.address == config.bind
    finally:
        zygote.stop()


def test_a_child_that_fails_before_it_is_ready_is_reported_with_its_log(tmp_path) -> None:
    _, blob = _stores(tmp_path)
    server = ConsensusProcess("nope://x", blob, ServeConfig(bind=f"ipc://{tmp_path}/sock/c"))
    with pytest.raises(ConsensusStartError) as failed:
        server.start()
    message = str(failed.value)
    assert "it exited with status 2 before it was ready" in message
    assert "shardsink consensus serve: error:" in message and "nope" in message  # its log
    assert not server.alive()
    server.stop()


def test_a_child_silent_past_the_timeout_is_killed_and_reported(tmp_path) -> None:
    store, blob = _stores(tmp_path)
    config = ServeConfig(bind=f"ipc://{tmp_path}/sock/c")
    server = ConsensusProcess(store, blob, config, timeout_s=0.001)
    with pytest.raises(ConsensusStartError, match=r"not ready within 0\.001 s"):
        server.start()
    assert not server.alive()
    server.stop()
