"""Choosing a storage backend from a URI.

Accepted forms (anything else is a ``ValueError`` naming the URI and these):

- blob: ``file:///abs/dir``, ``s3://bucket[/prefix]?endpoint=http://127.0.0.1:PORT``
  (plus ``region``, ``access_key``, ``secret_key``; credentials default to the
  ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` environment), ``memory://NAME``
- consensus: ``sqlite:///abs/path.db``, ``postgresql://user@host:port/db``
  (``postgres://`` too), ``memory://NAME``
"""

from __future__ import annotations

from urllib.parse import urlsplit

from .contracts import Blob, Consensus

BLOB_FORMS = (
    "file:///absolute/dir",
    "s3://bucket[/prefix]?endpoint=http://127.0.0.1:PORT",
    "memory://name",
)
CONSENSUS_FORMS = (
    "sqlite:///absolute/path.db",
    "postgresql://user@host:port/dbname",
    "memory://name",
)


def bad_uri(uri: str, kind: str, why: str) -> ValueError:
    """A ``ValueError`` naming the URI, the problem and the accepted forms."""
    forms = BLOB_FORMS if kind == "blob" else CONSENSUS_FORMS
    return ValueError(f"invalid {kind} URI {uri!r}: {why}; accepted forms: {', '.join(forms)}")


def _scheme(uri: str, kind: str) -> str:
    if not isinstance(uri, str) or "://" not in uri:
        raise bad_uri(str(uri), kind, "missing scheme")
    return urlsplit(uri).scheme.lower()


def open_blob(uri: str) -> Blob:
    """Open the ``Blob`` backend ``uri`` names (wrapped to inject faults when
    the ``blob.call`` fault point is armed). Raises ``ValueError`` for a bad
    URI and a storage error if the backend cannot be reached."""
    from .. import faults

    return faults.wrap_store("blob.call", _open_blob(uri))


def _open_blob(uri: str) -> Blob:
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
    """Open the ``Consensus`` backend ``uri`` names (wrapped to inject faults
    when the ``consensus.call`` fault point is armed). Raises ``ValueError``
    for a bad URI and a storage error if the backend cannot be reached."""
    from .. import faults

    return faults.wrap_store("consensus.call", _open_consensus(uri))


def _open_consensus(uri: str) -> Consensus:
    scheme = _scheme(uri, "consensus")
    if scheme == "sqlite":
        from .sqlite import SqliteConsensus

        return SqliteConsensus.from_uri(uri)
    if scheme in ("postgresql", "postgres"):
        from .postgres import PostgresConsensus

        return PostgresConsensus.from_uri(uri)
    if scheme == "memory":
        from .memory import MemoryConsensus

        return MemoryConsensus(urlsplit(uri).netloc or "default")
    raise bad_uri(uri, "consensus", f"unsupported scheme {scheme!r}")
