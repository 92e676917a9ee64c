"""CURVE keys: who may talk to shardsink's TCP sockets.

A ``tcp://`` socket is reachable by every process that can reach its
address, so each one is a ZeroMQ CURVE server: it encrypts, and accepts
only clients whose public key it was given (ZeroMQ's ZAP handshake, run by
pyzmq's authenticator thread). ``ipc://`` sockets need no keys: they live in
a directory only this user can enter (:mod:`shardsink._address`).

The keys of one deployment live in a *key directory* (mode 0700, every file
0600), in ZeroMQ's certificate format:

- ``server.key_secret`` and ``server.key``: the server's key pair and its
  public half, which clients need;
- ``client.key_secret``: the client key pair shardsink's own clients use;
- ``clients/``: the public keys the server accepts (``client.key`` at
  first; add others' ``.key`` files there).

The directory is ``SHARDSINK_KEYS`` if set, else ``keys/`` in the data dir.
A server makes the keys that are missing; a client only reads them.

A cluster's coordinator needs no directory: :func:`ephemeral_keys` makes
one server key pair and one client key pair in memory for the life of the
cluster, and the children get the client's in their launch payload (never
argv, a log or a file). The ``repr`` of every key tuple hides the secret.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import NamedTuple

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

#: Names the key directory (overrides the data dir's ``keys/``).
KEYS_ENV = "SHARDSINK_KEYS"
_SERVER, _CLIENT, _CLIENTS = "server", "client", "clients"


class ServerKeys(NamedTuple):
    """A CURVE server's key pair and the public keys it accepts: the
    directory of their ``.key`` files, or (in memory) the keys themselves
    (z85)."""

    public: bytes
    secret: bytes
    clients: Path | frozenset[bytes]

    def __repr__(self) -> str:
        return f"ServerKeys(public={self.public!r}, secret=***, clients={self.clients!r})"


class ClientKeys(NamedTuple):
    """A CURVE client's key pair and the server's public key (z85)."""

    server: bytes
    public: bytes
    secret: bytes

    def __repr__(self) -> str:
        return f"ClientKeys(server={self.server!r}, public={self.public!r}, secret=***)"


def key_dir(data_dir: str | os.PathLike | None = None) -> Path | None:
    """The key directory: ``$SHARDSINK_KEYS``, else ``DATA_DIR/keys`` (``None``
    without either)."""
    named = os.environ.get(KEYS_ENV)
    if named:
        return Path(named)
    return None if data_dir is None else Path(data_dir) / "keys"


def needs_keys(address: str) -> bool:
    """Whether a socket at ``address`` is secured with CURVE (``tcp://``)."""
    return address.startswith("tcp://")


def server_keys(directory: Path) -> ServerKeys:
    """The server's keys in ``directory``, made first where missing (the
    directory 0700, the files 0600); ``ValueError`` naming a file that is not
    a certificate or is readable by others."""
    _private_dir(directory, create=True)
    _private_dir(directory / _CLIENTS, create=True)
    for name in (_SERVER, _CLIENT):
        if not (directory / f"{name}.key_secret").exists():
            _write_pair(directory, name)
    client_public = directory / _CLIENTS / f"{_CLIENT}.key"
    if not client_public.exists():
        public, _ = _load(directory / f"{_CLIENT}.key_secret")
        _write(client_public, public, None)
    public, secret = _load(directory / f"{_SERVER}.key_secret")
    assert secret is not None
    return ServerKeys(public, secret, directory / _CLIENTS)


def ephemeral_keys() -> tuple[ServerKeys, ClientKeys]:
    """A fresh server key pair that accepts exactly one fresh client key
    pair, and that client's keys: in memory only, for one cluster's life."""
    server_public, server_secret = zmq.curve_keypair()
    client_public, client_secret = zmq.curve_keypair()
    server = ServerKeys(server_public, server_secret, frozenset({client_public}))
    return server, ClientKeys(server_public, client_public, client_secret)


def client_keys(directory: Path, address: str) -> ClientKeys:
    """The client keys in ``directory`` to reach the server at ``address``;
    ``ValueError`` naming what is missing and where keys come from."""
    where = (
        f"{address} is a tcp:// server, which accepts only CURVE clients: its key "
        f"directory (the server's data dir's keys/, or ${KEYS_ENV}) holds the keys"
    )
    try:
        _private_dir(directory, create=False)
        server, _ = _load(directory / f"{_SERVER}.key")
        public, secret = _load(directory / f"{_CLIENT}.key_secret")
    except FileNotFoundError as exc:
        raise ValueError(f"no CURVE keys at {exc.filename}: {where}") from None
    if secret is None:
        raise ValueError(f"{directory / (_CLIENT + '.key_secret')} holds no secret key: {where}")
    return ClientKeys(server, public, secret)


def keys_for(address: str, data_dir: str | os.PathLike | None = None) -> ClientKeys | None:
    """The client keys a connection to ``address`` needs (``None`` for
    ``ipc://``), from :func:`key_dir`; ``ValueError`` if a ``tcp://``
    address has none to use."""
    if not needs_keys(address):
        return None
    directory = key_dir(data_dir)
    if directory is None:
        raise ValueError(
            f"{address} is a tcp:// server, which accepts only CURVE clients: set {KEYS_ENV} "
            "to its key directory (the server's data dir's keys/)"
        )
    return client_keys(directory, address)


def secure_client(sock: zmq.Socket, keys: ClientKeys) -> None:
    """Make ``sock`` (before it connects) a CURVE client with ``keys``."""
    sock.curve_serverkey = keys.server
    sock.curve_publickey = keys.public
    sock.curve_secretkey = keys.secret


class CurveServer:
    """The CURVE side of a server's sockets in context ``ctx``: starts the
    authenticator that accepts the public keys of ``keys.clients`` (a
    directory is read again by :meth:`reload`). :meth:`secure` a socket
    before it binds; :meth:`close` (idempotent) stops the authenticator.
    ``denied`` counts the handshakes refused for an unknown client key."""

    def __init__(self, ctx: zmq.Context, keys: ServerKeys) -> None:
        self.keys = keys
        self.denied = 0
        self._accepted: frozenset[bytes] = frozenset()
        self.reload()
        self._auth = ThreadAuthenticator(ctx)
        self._auth.start()
        self._auth.configure_curve_callback(domain="*", credentials_provider=self)
        self._closed = False

    def reload(self) -> None:
        clients = self.keys.clients
        if isinstance(clients, Path):
            clients = frozenset(zmq.auth.load_certificates(clients))
        self._accepted = frozenset(clients)

    def callback(self, domain: str, key: bytes) -> bool:
        """Whether the client of public ``key`` (z85) may connect; called by
        the authenticator's thread for every CURVE handshake."""
        if key in self._accepted:
            return True
        self.denied += 1
        return False

    def secure(self, sock: zmq.Socket) -> None:
        sock.curve_server = True
        sock.curve_publickey = self.keys.public
        sock.curve_secretkey = self.keys.secret

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._auth.stop()


def _write_pair(directory: Path, name: str) -> None:
    public, secret = zmq.curve_keypair()
    _write(directory / f"{name}.key_secret", public, secret)
    _write(directory / f"{name}.key", public, None)


def _write(path: Path, public: bytes, secret: bytes | None) -> None:
    """A certificate as ``zmq.auth.load_certificate`` reads it, created 0600
    (a secret key is never readable by others, not even for a moment)."""
    lines = ["#   shardsink CURVE certificate", "curve", f'    public-key = "{public.decode()}"']
    if secret is not None:
        lines.append(f'    secret-key = "{secret.decode()}"')
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")


def _load(path: Path) -> tuple[bytes, bytes | None]:
    if not path.exists():
        raise FileNotFoundError(2, "missing", str(path))
    if path.name.endswith("key_secret") and stat.S_IMODE(path.stat().st_mode) & 0o077:
        raise ValueError(f"{path} holds a secret key and must be mode 0600")
    try:
        return zmq.auth.load_certificate(path)
    except ValueError as exc:
        raise ValueError(f"{path} is not a CURVE certificate: {exc}") from None


def _private_dir(directory: Path, *, create: bool) -> None:
    if create:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = directory.stat()
    if not stat.S_ISDIR(st.st_mode) or stat.S_IMODE(st.st_mode) & 0o077:
        raise ValueError(f"key directory {directory} must be a directory of mode 0700")
