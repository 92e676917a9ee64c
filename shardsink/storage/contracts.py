"""The two storage contracts everything durable goes through.

``Blob`` stores immutable byte values under string keys; ``Consensus`` stores,
per shard, a linearizable log of versions advanced only by compare-and-set.
Backends live one per module next to this file; the conformance suite in
``tests/storage/`` runs every backend against the invariants stated here.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import msgspec

if TYPE_CHECKING:
    import pyarrow as pa

_KEY_RE = re.compile(r"^[A-Za-z0-9_.=-]+(/[A-Za-z0-9_.=-]+)*$")


def check_key(key: str) -> str:
    """Return ``key`` if it is a valid blob key, else raise ``ValueError``.

    Keys are ``/``-separated segments of ``[A-Za-z0-9_.=-]``; no empty segment,
    no ``.`` or ``..`` segment, no leading or trailing ``/``. Every backend maps
    them to paths or object names without escaping.
    """
    if (
        not isinstance(key, str)
        or not _KEY_RE.match(key)
        or any(seg in (".", "..") for seg in key.split("/"))
    ):
        raise ValueError(
            f"invalid blob key {key!r}: expected '/'-separated segments of "
            "[A-Za-z0-9_.=-], without empty, '.' or '..' segments"
        )
    return key


def check_prefix(prefix: str) -> str:
    """Return ``prefix`` if it is a valid key prefix (possibly empty or ending in ``/``)."""
    if prefix == "":
        return prefix
    check_key(prefix.rstrip("/") or "x")
    return prefix


class BlobMeta(msgspec.Struct, frozen=True):
    """One blob, as ``list_meta`` lists it and ``stat`` finds it: its key, its
    size in bytes and its modification time (seconds since the epoch)."""

    key: str
    size: int
    modified: float


class TempMeta(msgspec.Struct, frozen=True):
    """A temporary file a ``set`` staged its value in and never renamed into
    place: its name (``KEY~SUFFIX``, never a valid key), its size in bytes
    and its modification time (seconds since the epoch)."""

    name: str
    size: int
    modified: float


@runtime_checkable
class Blob(Protocol):
    """A durable key-value store of immutable byte values.

    Invariants every backend keeps:

    - ``set`` is atomic: a concurrent or later ``get`` sees the old value, or no
      value, or the whole new value, never a part of it, even if the writing
      process dies in the middle.
    - ``set`` returns only once the value is durable (fsync'd / acknowledged).
    - ``delete`` is idempotent: deleting a missing key is not an error.
    - ``list_meta(prefix)`` yields every key that starts with ``prefix`` and was
      durably set before the call began and not deleted since (keys set or
      deleted concurrently may or may not appear). Order is unspecified.
    - ``stat(key)`` and ``open_input(key)`` see what ``get`` would: a key set
      before the call began is found, a missing one is ``None`` (at once,
      never after a wait or retries). ``stat`` is one request (a HEAD on S3)
      and reads no data.
    - ``open_input(key)`` returns a random-access file (``pyarrow.NativeFile``:
      ``size``, ``read_at``, ``seek``/``read``) the caller closes, so a
      reader may take a large value a range at a time instead of holding all
      of it. For a key written once (shardsink writes each part key once) its
      reads return bytes of that value or raise ``OSError``. On ``file://``
      and ``memory://`` the opened value stays readable after the key is
      deleted or replaced; on S3 each read is a ranged GET, so after a
      delete reads fail (``OSError``) and after a replacement they may return
      the new value's bytes: ``get`` is the atomic read of a value that may
      be replaced.

    Errors: :class:`~shardsink.storage.errors.DeterminateError` or
    :class:`~shardsink.storage.errors.IndeterminateError`; an invalid key is a
    ``ValueError``. ``close()`` is idempotent.
    """

    uri: str

    def get(self, key: str) -> bytes | None:
        """The value under ``key``, or ``None`` if there is none."""
        ...

    def set(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key`` atomically and durably, replacing any value."""
        ...

    def delete(self, key: str) -> None:
        """Remove ``key``; no error if it is absent."""
        ...

    def list(self, prefix: str = "") -> Iterator[str]:
        """Keys starting with ``prefix``."""
        ...

    def list_meta(self, prefix: str = "") -> Iterator[BlobMeta]:
        """Keys starting with ``prefix`` with their size and modification time."""
        ...

    def stat(self, key: str) -> BlobMeta | None:
        """The size and modification time of the value under ``key``, or
        ``None`` if there is none."""
        ...

    def open_input(self, key: str) -> pa.NativeFile | None:
        """The value under ``key`` as a random-access file (the caller closes
        it), or ``None`` if there is none."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class LeavesTempFiles(Protocol):
    """What a ``Blob`` also implements if its ``set`` stages the value in a
    temporary file that a writer killed mid-``set`` leaves behind (``file://``;
    an S3 PUT leaves no object). Such files are not keys: ``list_meta`` never
    yields them and ``get`` never sees them; these two find and remove them.

    - ``list_temp(prefix)`` yields every temporary file whose key starts with
      ``prefix``, like ``list_meta``.
    - ``delete_temp(name)`` removes the file a ``list_temp`` named; idempotent.
      ``ValueError`` for a name that is not a temporary file's. Removing one
      a live ``set`` still writes makes that ``set`` fail (determinately), so
      callers remove only files older than any ``set`` can take.
    """

    def list_temp(self, prefix: str = "") -> Iterator[TempMeta]: ...

    def delete_temp(self, name: str) -> None: ...


def temp_files(blob: Blob, prefix: str = "") -> list[TempMeta]:
    """The temporary files under ``prefix`` of a ``blob`` that leaves them
    (:class:`LeavesTempFiles`); none for one that does not."""
    return list(blob.list_temp(prefix)) if isinstance(blob, LeavesTempFiles) else []


class VersionedData(msgspec.Struct, frozen=True):
    """One version of a shard's state: its sequence number and opaque bytes."""

    seqno: int
    data: bytes


class Committed(msgspec.Struct, frozen=True, tag="committed"):
    """``compare_and_set`` stored the new version."""

    seqno: int


class Mismatch(msgspec.Struct, frozen=True, tag="mismatch"):
    """``compare_and_set`` did not store anything: the head was not ``expected``.

    ``current`` is the head at the time of the check (``None`` if the shard has
    no version)."""

    current: VersionedData | None


CasResult = Committed | Mismatch


class CasRequest(msgspec.Struct, frozen=True):
    """One compare-and-set of a :meth:`Consensus.compare_and_set_many` batch:
    commit ``new`` to ``shard`` iff its head seqno is ``expected``."""

    shard: str
    expected: int | None
    new: VersionedData


@runtime_checkable
class Consensus(Protocol):
    """A per-shard linearizable log of versions, advanced by compare-and-set.

    Invariants every backend keeps:

    - Versions of a shard have strictly increasing seqnos, and each committed
      version's seqno is exactly one more than the one before (no gaps).
    - ``compare_and_set(shard, expected, new)`` commits ``new`` iff the shard's
      head seqno is ``expected`` (``None``: the shard has no version at all).
      ``new.seqno`` must be ``expected + 1`` (or any ``>= 0`` when ``expected``
      is ``None``), else ``ValueError``. Among concurrent callers with the same
      ``expected`` exactly one commits; the others get :class:`Mismatch` as a
      return value, never an exception.
    - ``scan(shard, from_seqno, limit)`` returns at most ``limit`` versions with
      ``seqno >= from_seqno`` in ascending order.
    - ``truncate(shard, below)`` deletes versions with ``seqno < below`` and
      returns how many; it never deletes the head: ``below > head.seqno`` is a
      ``ValueError`` (as is truncating a shard with no version).
    - ``head`` is linearizable: it reflects every compare-and-set that committed
      before it began.
    - ``compare_and_set_many(requests)`` is a group commit: each request's
      result is what ``compare_and_set`` would have returned for it alone
      (a request whose head moved gets its own :class:`Mismatch`; the others
      still commit), in the order of ``requests``; the versions it commits
      are stored in one transaction (one durable write: one fsync on SQLite,
      one statement on PostgreSQL), so they are all durable or, on an
      error, none is (after an :class:`IndeterminateError` either all that
      would have committed did, or none). Payloads are stored as given,
      never merged. At most one request per shard, else ``ValueError``, as
      for arguments ``compare_and_set`` refuses (checked before anything is
      written); an empty batch is ``[]``.
    - ``compare_and_set_all(requests)`` is a transaction across shards: it
      commits every request or none. If every request's head is its
      ``expected``, all commit (one durable write) and each result is
      :class:`Committed`; otherwise nothing is stored and *every* result is
      a :class:`Mismatch` carrying that shard's head, the ones that matched
      too, so the caller learns every shard's head in one answer. After an
      :class:`IndeterminateError`, either all committed or none did, never
      some. Concurrent callers over overlapping shards never both commit a
      request with the same ``expected``, and never deadlock. Arguments are
      checked as for ``compare_and_set_many``.

    Errors: :class:`~shardsink.storage.errors.DeterminateError` or
    :class:`~shardsink.storage.errors.IndeterminateError` (a commit whose outcome
    is unknown). ``close()`` is idempotent.
    """

    uri: str

    def head(self, shard: str) -> VersionedData | None: ...

    def compare_and_set(
        self, shard: str, expected: int | None, new: VersionedData
    ) -> CasResult: ...

    def compare_and_set_many(self, requests: Sequence[CasRequest]) -> list[CasResult]: ...

    def compare_and_set_all(self, requests: Sequence[CasRequest]) -> list[CasResult]: ...

    def scan(self, shard: str, from_seqno: int, limit: int) -> list[VersionedData]: ...

    def truncate(self, shard: str, below_seqno: int) -> int: ...

    def list_shards(self) -> list[str]: ...

    def close(self) -> None: ...


def check_cas_args(expected: int | None, new: VersionedData) -> None:
    """Raise ``ValueError`` if ``new.seqno`` does not follow ``expected``."""
    if expected is None:
        if new.seqno < 0:
            raise ValueError(f"first version of a shard needs seqno >= 0, got {new.seqno}")
    elif new.seqno != expected + 1:
        raise ValueError(
            f"compare_and_set: new seqno {new.seqno} must be expected + 1 = {expected + 1}"
        )


def check_cas_batch(requests: Sequence[CasRequest]) -> None:
    """Raise ``ValueError`` if a shard appears twice in ``requests`` or a
    request's seqnos are what :func:`check_cas_args` refuses."""
    seen: set[str] = set()
    for request in requests:
        if request.shard in seen:
            raise ValueError(
                f"compare_and_set_many: shard {request.shard!r} appears twice; a batch holds "
                "at most one compare-and-set per shard"
            )
        seen.add(request.shard)
        check_cas_args(request.expected, request.new)


def check_truncate_args(shard: str, head: VersionedData | None, below_seqno: int) -> None:
    """Raise ``ValueError`` if truncating below ``below_seqno`` would drop the head."""
    if head is None:
        raise ValueError(f"truncate: shard {shard!r} has no version")
    if below_seqno > head.seqno:
        raise ValueError(
            f"truncate: below_seqno {below_seqno} is past the head seqno {head.seqno} "
            f"of shard {shard!r}; the head is never truncated"
        )
