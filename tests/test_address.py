"""One address policy for every ZeroMQ socket: private ipc directories, loopback
binds but for CURVE-only sockets."""

from __future__ import annotations

import os
import socket

import pytest

from shardsink._address import check_address, free_port


def test_addresses_are_checked(tmp_path) -> None:
    for good in ("tcp://127.0.0.1:0", "tcp://[::1]:5000", "tcp://localhost:*"):
        assert check_address(good, for_bind=True) == good
    with pytest.raises(ValueError, match="only loopback"):
        check_address("tcp://0.0.0.0:5000", for_bind=True)
    # a socket answering only CURVE clients binds where it is configured to
    assert check_address("tcp://10.1.2.3:5000", for_bind=True, curve=True) == "tcp://10.1.2.3:5000"
    with pytest.raises(ValueError, match="must be absolute"):
        check_address("ipc://relative/x", for_bind=True)
    with pytest.raises(ValueError, match="unsupported scheme 'udp'"):
        check_address("udp://127.0.0.1:1", for_bind=False)
    with pytest.raises(ValueError, match="expected HOST:PORT"):
        check_address("tcp://127.0.0.1", for_bind=False)
    made = tmp_path / "made"
    check_address(f"ipc://{made}/sock", for_bind=True)
    assert made.stat().st_mode & 0o777 == 0o700
    wide = tmp_path / "wide"
    wide.mkdir(mode=0o755)
    os.chmod(wide, 0o755)
    with pytest.raises(ValueError, match="mode 0700"):
        check_address(f"ipc://{wide}/sock", for_bind=True)
    # a connect checks an existing directory too, but may precede the bind
    with pytest.raises(ValueError, match="mode 0700"):
        check_address(f"ipc://{wide}/sock", for_bind=False)
    later = f"ipc://{tmp_path}/later/sock"
    assert check_address(later, for_bind=False) == later
    assert not (tmp_path / "later").exists()
    assert check_address("tcp://10.1.2.3:5555", for_bind=False) == "tcp://10.1.2.3:5555"


def test_a_free_port_can_be_bound() -> None:
    port = free_port()
    assert 0 < port < 65536
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
