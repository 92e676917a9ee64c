"""Which ZeroMQ addresses shardsink binds and connects to.

One policy for every socket of the project (consensus server, cluster control,
the shared-memory part channel): ``ipc://`` sockets live in a directory only
this user can enter (mode 0700). TCP binds are loopback only, except for the
sockets that answer only CURVE clients (:mod:`shardsink._curve`: the
consensus server's and the coordinator's), which bind the address they are
configured with so that other machines reach them.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import stat
from pathlib import Path
from urllib.parse import urlsplit

#: The schemes of a ZeroMQ address; as a consensus URI, they name a running
#: consensus server rather than a store.
REMOTE_SCHEMES = ("tcp", "ipc")


def check_address(addr: str, *, for_bind: bool, curve: bool = False) -> str:
    """Validate a ZeroMQ address; return it unchanged.

    Accepted: ``ipc:///absolute/path`` whose directory, if it exists, is ours
    with mode 0700 (a bind creates it so when missing; a connect to a missing
    one is allowed, since the binder will create it), and ``tcp://HOST:PORT``
    where a bind HOST must be loopback (``127.x.x.x``, ``::1`` or
    ``localhost``) and PORT may be ``*`` or ``0`` for a free port. A socket
    that answers only CURVE clients (``curve``: the consensus server's and
    the coordinator's TCP binds) may bind any address it is configured with,
    so that other machines reach it.
    Raises ``ValueError`` naming the address and the problem.
    """
    forms = "accepted forms: ipc:///absolute/path, tcp://127.0.0.1:PORT"
    if not isinstance(addr, str) or "://" not in addr:
        raise ValueError(f"invalid address {addr!r}: missing scheme; {forms}")
    scheme, rest = addr.split("://", 1)
    if scheme == "ipc":
        if not rest.startswith("/"):
            raise ValueError(f"invalid address {addr!r}: ipc path must be absolute; {forms}")
        _check_private_dir(Path(rest).parent, addr, create=for_bind)
        return addr
    if scheme == "tcp":
        parts = urlsplit(f"tcp://{rest}")
        try:
            port = parts.port
        except ValueError:
            port = None
        host = parts.hostname
        if not host or (port is None and not rest.endswith(":*")):
            raise ValueError(f"invalid address {addr!r}: expected HOST:PORT; {forms}")
        if for_bind and not curve and not _is_loopback(host):
            raise ValueError(
                f"refusing to bind {addr!r}: only loopback addresses may be bound by a socket "
                "that does not require CURVE keys"
            )
        return addr
    raise ValueError(f"invalid address {addr!r}: unsupported scheme {scheme!r}; {forms}")


def free_port() -> int:
    """A TCP port of ``127.0.0.1`` that nothing listened on when asked.
    Another process may take it before the caller binds it: a caller that
    binds it retries with another when the bind fails."""
    with socket.socket(socket.AF_INET) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_private_dir(directory: Path, addr: str, *, create: bool) -> None:
    try:
        if create:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = directory.stat()
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ValueError(f"cannot use socket directory {directory} for {addr!r}: {exc}") from exc
    if not stat.S_ISDIR(st.st_mode):
        raise ValueError(f"socket directory {directory} for {addr!r} is not a directory")
    if st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) & 0o077:
        raise ValueError(
            f"socket directory {directory} for {addr!r} must be owned by this user with "
            f"mode 0700 (it is {stat.S_IMODE(st.st_mode):o}); other users could connect"
        )
