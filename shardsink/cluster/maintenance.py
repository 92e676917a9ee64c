"""What the consensus server's maintenance of a cluster's shard failed to
do: compactions, GC, sweeps, expiry or retention that raised (each retried
on schedule, each counted by the server: ``ShardCounters.failures``). A
user learns it from ``up``'s summary, ``status`` and the dashboard, not
from a log file."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import msgspec

from .._curve import keys_for
from ..persist import PersistError
from ..server import ServerClient
from ..storage import StorageError

#: A status asks the server at most this often: the dashboard polls every second.
CACHE_S = 5.0
#: How long one ask waits: it runs in the coordinator's loop, which must not
#: stall on a server that does not answer (the failures are then unknown).
ASK_TIMEOUT_S = 0.5


class MaintenanceFailures(msgspec.Struct, frozen=True, kw_only=True):
    """Failed runs of the shard's maintenance by kind (only kinds that
    failed), and the last error; ``known`` is false when the server did not
    answer (or named no such shard)."""

    counts: dict[str, int] = {}
    last: str = ""
    known: bool = True

    def describe(self) -> str:
        """One line for a person: ``none``, or the counts and the last error."""
        if not self.known:
            return "unknown (the consensus server did not answer)"
        if not self.counts:
            return "none"
        counts = ", ".join(f"{kind} {n}" for kind, n in sorted(self.counts.items()))
        return f"{counts} (each retried; last: {self.last})"


class MaintenanceWatch:
    """Asks the consensus server at ``address()`` (CURVE keys from
    ``data_dir``) for the failures of the maintenance of ``shards``
    (counted together; the last error of any), at most every
    :data:`CACHE_S` unless told to (``fresh``)."""

    def __init__(self, address: Callable[[], str], shards: Sequence[str], data_dir: str) -> None:
        self._address, self._shards, self._data_dir = address, set(shards), data_dir
        self._last = MaintenanceFailures(known=False)
        self._asked = -CACHE_S

    def failures(self, *, fresh: bool = False) -> MaintenanceFailures:
        now = time.monotonic()
        if fresh or now - self._asked >= CACHE_S:
            self._asked = now
            self._last = self._ask()
        return self._last

    def _ask(self) -> MaintenanceFailures:
        address = self._address()
        try:
            client = ServerClient(
                address,
                timeout_s=ASK_TIMEOUT_S,
                retry_for_s=0,
                keys=keys_for(address, self._data_dir),
            )
        except (ValueError, StorageError):  # not a server's address: an embedded store
            return MaintenanceFailures(known=False)
        try:
            reply = client.stats()
        except (StorageError, PersistError):
            return MaintenanceFailures(known=False)
        finally:
            client.close()
        failed: dict[str, int] = {}
        found, last = False, ""
        for counters in reply.shards:
            if counters.shard in self._shards:
                found = True
                for kind, n in counters.failures.items():
                    if n:
                        failed[kind] = failed.get(kind, 0) + n
                last = counters.last_failure or last
        if not found:
            return MaintenanceFailures(known=False)
        return MaintenanceFailures(counts=failed, last=last)
