"""The request/reply plumbing alone (``server/rpc.py``), in one process: a
reply is matched to its request by id, a reply that does not come in time
is an indeterminate error, and a request that is not one frame of an id and
more is dropped."""

from __future__ import annotations

import threading
import time

import pytest
import zmq

from shardsink.server.rpc import RpcClient, RpcServer
from shardsink.storage.errors import IndeterminateError


@pytest.fixture
def pair(tmp_path):
    server = RpcServer(f"ipc://{tmp_path}/sock/rpc")
    client = RpcClient(server.address, timeout_s=2.0)
    yield server, client
    client.close()
    server.close()


def _answer(server: RpcServer, answer) -> threading.Thread:
    """Answer the next request with ``answer(peer, request_id, payload)``,
    in a thread."""

    def serve() -> None:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            for peer, request_id, payload in server.receive(100):
                answer(peer, request_id, payload)
                return

    thread = threading.Thread(target=serve)
    thread.start()
    return thread


def test_a_reply_with_another_requests_id_is_not_taken_for_the_answer(pair):
    server, client = pair

    def stale_first(peer: bytes, request_id: bytes, payload: bytes) -> None:
        stale = (int.from_bytes(request_id, "big") - 1).to_bytes(8, "big")
        server.reply(peer, stale, b"stale")
        server.reply(peer, request_id, b"echo " + payload)

    thread = _answer(server, stale_first)
    assert client.call(b"hello") == b"echo hello"
    thread.join(timeout=10)
    assert not thread.is_alive()


def test_no_reply_in_time_is_an_indeterminate_error_and_the_next_call_works(pair):
    server, client = pair
    started = time.monotonic()
    with pytest.raises(IndeterminateError, match=r"no reply from ipc://.* within 0\.3s"):
        client.call(b"nobody answers", timeout_s=0.3)
    assert time.monotonic() - started < 2
    server.receive(1000)  # the unanswered request
    thread = _answer(server, lambda peer, rid, payload: server.reply(peer, rid, payload))
    assert client.call(b"again") == b"again"
    thread.join(timeout=10)


def test_a_request_that_is_not_one_frame_with_an_id_is_dropped(pair, tmp_path):
    server, _ = pair
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    try:
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(server.address)
        for frames in ([b"short"], [b"x" * 8, b"two frames"], [b""], [b"x" * 8 + b"ok"]):
            sock.send_multipart(frames)
        received: list = []
        deadline = time.monotonic() + 5
        while not received and time.monotonic() < deadline:
            received = server.receive(100)
        assert [(rid, payload) for _, rid, payload in received] == [(b"x" * 8, b"ok")]
        assert server.dropped == 3
    finally:
        sock.close()
        ctx.term()
