"""Seeded fault injection around any ``Blob`` or ``Consensus``: the store
wrappers behind the ``blob.call`` and ``consensus.call`` fault points
(:func:`~.points.wrap_store`).

Each call of a wrapped store draws one number from a ``random.Random(seed)``:

- below ``fail_rate``: a *determinate* fault. The call is not passed on and
  :class:`DeterminateError` is raised: it did not happen.
- below ``fail_rate + indeterminate_rate``: an *indeterminate* fault. The call
  runs on the inner store, then :class:`IndeterminateError` is raised, as for a
  timeout that struck after the store acted. The result is lost.
- otherwise the call passes through.

The same seed and the same sequence of calls give the same faults, so a failure
replays. ``injected`` counts the faults by kind. ``close()`` is never faulted.
An ``admit(kind)`` hook, if given, may let a drawn fault pass (a budget) and
sees every fault injected (a record).
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Generic, TypeVar

import pyarrow as pa

from ..storage import (
    Blob,
    BlobMeta,
    CasRequest,
    CasResult,
    Consensus,
    DeterminateError,
    IndeterminateError,
    LeavesTempFiles,
    TempMeta,
    VersionedData,
    temp_files,
)

T = TypeVar("T")
S = TypeVar("S", Blob, Consensus)


class _Faulty(Generic[S]):
    """The shared mechanism: the seeded draw, the counts and the wrapped call.

    ``ValueError`` unless both rates are >= 0 and sum to at most 1."""

    def __init__(
        self,
        inner: S,
        seed: int,
        fail_rate: float = 0.0,
        indeterminate_rate: float = 0.0,
        admit: Callable[[str], bool] | None = None,
    ) -> None:
        if min(fail_rate, indeterminate_rate) < 0 or fail_rate + indeterminate_rate > 1:
            raise ValueError(
                "fault rates must be >= 0 and sum to at most 1, got "
                f"fail_rate={fail_rate}, indeterminate_rate={indeterminate_rate}"
            )
        self.inner = inner
        self.uri = inner.uri
        self.seed = seed
        self.fail_rate = fail_rate
        self.indeterminate_rate = indeterminate_rate
        self.injected: Counter[str] = Counter()
        self._admit = admit or (lambda kind: True)
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def _call(self, op: str, fn: Callable[[], T]) -> T:
        with self._lock:
            draw = self._rng.random()
        if draw < self.fail_rate + self.indeterminate_rate:
            kind = "determinate" if draw < self.fail_rate else "indeterminate"
            if not self._admit(kind):
                return fn()
        if draw < self.fail_rate:
            with self._lock:
                self.injected["determinate"] += 1
            raise DeterminateError(f"injected fault: {op} on {self.uri} was not performed")
        result = fn()
        if draw < self.fail_rate + self.indeterminate_rate:
            with self._lock:
                self.injected["indeterminate"] += 1
            raise IndeterminateError(f"injected fault: timeout after {op} on {self.uri}")
        return result

    def close(self) -> None:
        self.inner.close()


class FaultyBlob(_Faulty[Blob]):
    """A ``Blob`` that injects faults into the calls to ``inner`` (see the module)."""

    def get(self, key: str) -> bytes | None:
        return self._call("get", lambda: self.inner.get(key))

    def set(self, key: str, data: bytes) -> None:
        self._call("set", lambda: self.inner.set(key, data))

    def delete(self, key: str) -> None:
        self._call("delete", lambda: self.inner.delete(key))

    def list(self, prefix: str = "") -> Iterator[str]:
        return iter(self._call("list", lambda: list(self.inner.list(prefix))))

    def list_meta(self, prefix: str = "") -> Iterator[BlobMeta]:
        return iter(self._call("list_meta", lambda: list(self.inner.list_meta(prefix))))

    def stat(self, key: str) -> BlobMeta | None:
        return self._call("stat", lambda: self.inner.stat(key))

    def open_input(self, key: str) -> pa.NativeFile | None:
        """The inner store's file, faulted as the open: a determinate fault
        opens nothing, an indeterminate one closes what it opened. Its reads
        pass through."""
        opened: list[pa.NativeFile | None] = []

        def open_input() -> pa.NativeFile | None:
            opened.append(self.inner.open_input(key))
            return opened[-1]

        try:
            return self._call("open_input", open_input)
        except IndeterminateError:
            if opened and opened[-1] is not None:
                opened[-1].close()  # the result is lost: nobody else will close it
            raise

    # Temporary files pass through, so the leaked-blob sweep of a process with
    # faults armed still finds a killed writer's (none if ``inner`` leaves none).
    def list_temp(self, prefix: str = "") -> Iterator[TempMeta]:
        return iter(self._call("list_temp", lambda: temp_files(self.inner, prefix)))

    def delete_temp(self, name: str) -> None:
        if not isinstance(self.inner, LeavesTempFiles):
            raise ValueError(f"{name!r} is not a temporary file: this store leaves none")
        inner = self.inner
        self._call("delete_temp", lambda: inner.delete_temp(name))


class FaultyConsensus(_Faulty[Consensus]):
    """A ``Consensus`` that injects faults into the calls to ``inner`` (see the module)."""

    def head(self, shard: str) -> VersionedData | None:
        return self._call("head", lambda: self.inner.head(shard))

    def compare_and_set(self, shard: str, expected: int | None, new: VersionedData) -> CasResult:
        return self._call(
            "compare_and_set", lambda: self.inner.compare_and_set(shard, expected, new)
        )

    def compare_and_set_many(self, requests: Sequence[CasRequest]) -> list[CasResult]:
        return self._call("compare_and_set_many", lambda: self.inner.compare_and_set_many(requests))

    def compare_and_set_all(self, requests: Sequence[CasRequest]) -> list[CasResult]:
        return self._call("compare_and_set_all", lambda: self.inner.compare_and_set_all(requests))

    def scan(self, shard: str, from_seqno: int, limit: int) -> list[VersionedData]:
        return self._call("scan", lambda: self.inner.scan(shard, from_seqno, limit))

    def truncate(self, shard: str, below_seqno: int) -> int:
        return self._call("truncate", lambda: self.inner.truncate(shard, below_seqno))

    def list_shards(self) -> list[str]:
        return self._call("list_shards", self.inner.list_shards)
