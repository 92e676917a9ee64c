"""Choosing a storage backend from a URI (the forms: :mod:`.uri`)."""

from __future__ import annotations

from urllib.parse import urlsplit

from .._extras import require
from .contracts import Blob, Consensus
from .uri import bad_uri


def _scheme(uri: str, kind: str) -> str:
    if not isinstance(uri, str) or "://" not in uri:
        raise bad_uri(str(uri), kind, "missing scheme")
    return urlsplit(uri).scheme.lower()


def open_blob(uri: str) -> Blob:
    """Open the ``Blob`` backend ``uri`` names. Raises ``ValueError`` for a
    bad URI and a storage error if the backend cannot be reached. (Opened
    through :func:`shardsink.faults.open_blob`, it is wrapped to inject faults
    when the ``blob.call`` fault point is armed.)"""
    scheme = _scheme(uri, "blob")
    if scheme == "file":
        from .file import FileBlob

        return FileBlob.from_uri(uri)
    if scheme == "s3":
        from .s3 import S3Blob

        return S3Blob.from_uri(uri)
    if scheme == "memory":
        from .memory import MemoryBlob

        return MemoryBlob(urlsplit(uri).netloc or "default")
    raise bad_uri(uri, "blob", f"unsupported scheme {scheme!r}")


def open_consensus(uri: str) -> Consensus:
    """Open the ``Consensus`` backend ``uri`` names. Raises ``ValueError`` for
    a bad URI or a backend whose extra is not installed (``postgres``), and a
    storage error if the backend cannot be reached. (Opened through
    :func:`shardsink.faults.open_consensus`, it is wrapped to inject faults
    when the ``consensus.call`` fault point is armed.)"""
    scheme = _scheme(uri, "consensus")
    if scheme == "sqlite":
        from .sqlite import SqliteConsensus

        return SqliteConsensus.from_uri(uri)
    if scheme in ("postgresql", "postgres"):
        require(f"a {scheme}:// consensus store", "postgres", "psycopg")
        from .postgres import PostgresConsensus

        return PostgresConsensus.from_uri(uri)
    if scheme == "memory":
        from .memory import MemoryConsensus

        return MemoryConsensus(urlsplit(uri).netloc or "default")
    raise bad_uri(uri, "consensus", f"unsupported scheme {scheme!r}")
