"""In-memory backends of both contracts, for unit tests of logic.

``memory://NAME`` opens a store shared by every opener of the same name within
this process (so a test can open a "second client"); nothing survives the
process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence

import pyarrow as pa

from .contracts import (
    BlobMeta,
    CasRequest,
    CasResult,
    Committed,
    Mismatch,
    VersionedData,
    check_cas_args,
    check_cas_batch,
    check_key,
    check_prefix,
    check_truncate_args,
)

_REGISTRY_LOCK = threading.Lock()
_BLOBS: dict[str, tuple[threading.Lock, dict[str, tuple[bytes, float]]]] = {}
_LOGS: dict[str, tuple[threading.RLock, dict[str, list[VersionedData]]]] = {}


def _check_open(store: MemoryBlob | MemoryConsensus) -> None:
    if store._closed:
        raise ValueError(f"{store.uri} is closed")


class MemoryBlob:
    """A ``Blob`` held in this process's memory."""

    def __init__(self, name: str = "default") -> None:
        self.uri = f"memory://{name}"
        with _REGISTRY_LOCK:
            self._lock, self._data = _BLOBS.setdefault(name, (threading.Lock(), {}))
        self._closed = False

    def get(self, key: str) -> bytes | None:
        _check_open(self)
        check_key(key)
        with self._lock:
            entry = self._data.get(key)
        return None if entry is None else entry[0]

    def set(self, key: str, data: bytes) -> None:
        _check_open(self)
        check_key(key)
        with self._lock:
            self._data[key] = (bytes(data), time.time())

    def delete(self, key: str) -> None:
        _check_open(self)
        check_key(key)
        with self._lock:
            self._data.pop(key, None)

    def list_meta(self, prefix: str = "") -> Iterator[BlobMeta]:
        _check_open(self)
        check_prefix(prefix)
        with self._lock:
            items = [(k, v) for k, v in self._data.items() if k.startswith(prefix)]
        for key, (data, modified) in items:
            yield BlobMeta(key, len(data), modified)

    def list(self, prefix: str = "") -> Iterator[str]:
        return (m.key for m in self.list_meta(prefix))

    def stat(self, key: str) -> BlobMeta | None:
        _check_open(self)
        check_key(key)
        with self._lock:
            entry = self._data.get(key)
        return None if entry is None else BlobMeta(key, len(entry[0]), entry[1])

    def open_input(self, key: str) -> pa.NativeFile | None:
        """A reader over the value ``key`` holds now (the bytes themselves,
        not a copy: they are immutable)."""
        data = self.get(key)
        return None if data is None else pa.BufferReader(pa.py_buffer(data))

    def close(self) -> None:
        self._closed = True


class MemoryConsensus:
    """A ``Consensus`` held in this process's memory."""

    def __init__(self, name: str = "default") -> None:
        self.uri = f"memory://{name}"
        with _REGISTRY_LOCK:
            self._lock, self._logs = _LOGS.setdefault(name, (threading.RLock(), {}))
        self._closed = False

    def head(self, shard: str) -> VersionedData | None:
        _check_open(self)
        with self._lock:
            log = self._logs.get(shard)
            return log[-1] if log else None

    def compare_and_set(self, shard: str, expected: int | None, new: VersionedData) -> CasResult:
        _check_open(self)
        check_cas_args(expected, new)
        with self._lock:  # reentrant: compare_and_set_many holds it for its whole batch
            log = self._logs.setdefault(shard, [])
            current = log[-1] if log else None
            if (current.seqno if current else None) != expected:
                return Mismatch(current)
            log.append(new)
            return Committed(new.seqno)

    def compare_and_set_many(self, requests: Sequence[CasRequest]) -> list[CasResult]:
        _check_open(self)
        check_cas_batch(requests)
        with self._lock:
            return [self.compare_and_set(r.shard, r.expected, r.new) for r in requests]

    def compare_and_set_all(self, requests: Sequence[CasRequest]) -> list[CasResult]:
        _check_open(self)
        check_cas_batch(requests)
        with self._lock:
            heads = {r.shard: self.head(r.shard) for r in requests}
            if any((heads[r.shard].seqno if heads[r.shard] else None) != r.expected
                   for r in requests):  # fmt: skip
                return [Mismatch(heads[r.shard]) for r in requests]
            return [self.compare_and_set(r.shard, r.expected, r.new) for r in requests]

    def scan(self, shard: str, from_seqno: int, limit: int) -> list[VersionedData]:
        _check_open(self)
        if limit < 0:
            raise ValueError(f"scan: limit must be >= 0, got {limit}")
        with self._lock:
            log = self._logs.get(shard, [])
            return [v for v in log if v.seqno >= from_seqno][:limit]

    def truncate(self, shard: str, below_seqno: int) -> int:
        _check_open(self)
        with self._lock:
            log = self._logs.get(shard, [])
            check_truncate_args(shard, log[-1] if log else None, below_seqno)
            keep = [v for v in log if v.seqno >= below_seqno]
            self._logs[shard] = keep
            return len(log) - len(keep)

    def list_shards(self) -> list[str]:
        _check_open(self)
        with self._lock:
            return sorted(s for s, log in self._logs.items() if log)

    def close(self) -> None:
        self._closed = True
