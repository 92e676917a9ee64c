"""The built-in workloads of docs/architecture.md section 9 (trickle, churn,
hydrate), and the exact collections they produce: one :class:`Workload`
shape, a workload of the protocol (:class:`~.loading.AnyWorkload`) like any other.

Interval ``i`` covers ``[i*T, (i+1)*T)`` and every update in it has
``ts = i*T``. Keys are ``int64``; the value of key ``k`` is ``format(k, "032x")``.
Row ``k`` belongs to global worker ``k % (G*W)``; worker ``w`` of group ``g`` is
global worker ``g*W + w``.

- ``trickle`` (R): interval ``i`` inserts keys ``i*R .. i*R+R-1`` (``diff = +1``).
- ``churn`` (R): as trickle, and interval ``i >= 2`` also retracts (``diff = -1``)
  the rows inserted by interval ``i-2``.
- ``hydrate`` (S, R): interval 0 inserts ``0 .. S-1``; interval ``i >= 1``
  inserts ``S+(i-1)*R .. S+i*R-1``.

Everything here is pure and vectorized (numpy), so a 2-million-row hydrate
interval is built in tens of milliseconds.
"""

from __future__ import annotations

import msgspec
import numpy as np
import pyarrow as pa

from ..config import WORKLOADS, ClusterConfig
from ..persist import DEFAULT_SCHEMA, full_schema

#: The shard schema of every workload: the default key int64 / val string.
SCHEMA = full_schema()
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_SHIFTS = np.arange(60, -4, -4, dtype=np.uint64)  # 16 nibbles, most significant first
_CHUNK = 1 << 16


class Workload(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One workload's shape. ``snapshot_rows`` is used by ``hydrate`` only."""

    name: str
    rows_per_interval: int
    snapshot_rows: int = 0
    interval_ms: int = 1000

    def __post_init__(self) -> None:
        if self.name not in WORKLOADS:
            raise ValueError(
                f"unknown workload {self.name!r}; choose one of {', '.join(WORKLOADS)}"
            )
        if self.rows_per_interval < 0:
            raise ValueError(f"rows_per_interval must be >= 0, got {self.rows_per_interval}")
        if self.snapshot_rows < 0:
            raise ValueError(f"snapshot_rows must be >= 0, got {self.snapshot_rows}")
        if self.interval_ms <= 0:
            raise ValueError(f"interval_ms must be > 0, got {self.interval_ms}")

    @classmethod
    def of(cls, config: ClusterConfig) -> Workload:
        """The built-in workload ``config`` names, its shape from ``config``'s
        fields and its ``workload_args`` (``rows_per_interval``,
        ``snapshot_rows``), ``ValueError`` for any other argument."""
        args = dict(config.workload_args)
        unknown = sorted(set(args) - {"rows_per_interval", "snapshot_rows"})
        if unknown:
            raise ValueError(
                f"workload {config.workload} takes rows_per_interval and snapshot_rows, "
                f"not {', '.join(unknown)}"
            )
        return cls(
            config.workload,
            args.get("rows_per_interval", config.rows_per_interval),
            args.get("snapshot_rows", config.snapshot_rows),
            config.interval_ms,
        )

    @property
    def schema(self) -> pa.Schema:
        """Key ``int64``, val ``string``."""
        return DEFAULT_SCHEMA

    def inserted_range(self, interval: int) -> tuple[int, int]:
        """The keys ``[lo, hi)`` that interval ``interval`` inserts."""
        r, s = self.rows_per_interval, self.snapshot_rows
        if self.name == "hydrate":
            return (0, s) if interval == 0 else (s + (interval - 1) * r, s + interval * r)
        return interval * r, (interval + 1) * r

    def retracted_range(self, interval: int) -> tuple[int, int]:
        """The keys ``[lo, hi)`` that interval ``interval`` retracts (empty unless churn)."""
        if self.name != "churn" or interval < 2:
            return 0, 0
        return self.inserted_range(interval - 2)

    def updates(self, interval: int, worker: int = 0, n_workers: int = 1) -> pa.Table:
        """The updates global worker ``worker`` of ``n_workers`` writes in ``interval``."""
        if not 0 <= worker < n_workers:
            raise ValueError(f"worker {worker} is not in [0, {n_workers})")
        ts = interval * self.interval_ms
        ins = _owned_keys(*self.inserted_range(interval), worker, n_workers)
        ret = _owned_keys(*self.retracted_range(interval), worker, n_workers)
        keys = np.concatenate([ins, ret])
        diffs = np.concatenate(
            [np.ones(len(ins), dtype=np.int64), np.full(len(ret), -1, dtype=np.int64)]
        )
        return _table(keys, ts, diffs)

    def expected(self, intervals: int, as_of: int | None = None) -> pa.Table:
        """The consolidated collection after intervals ``0 .. intervals-1``, with
        ``ts = as_of`` (default: the last time of the last interval), sorted by key."""
        if intervals < 0:
            raise ValueError(f"intervals must be >= 0, got {intervals}")
        if as_of is None:
            as_of = max(intervals * self.interval_ms - 1, 0)
        if intervals == 0:
            return _table(np.empty(0, dtype=np.int64), as_of, np.empty(0, dtype=np.int64))
        lo = self.inserted_range(0)[0]
        if self.name == "churn":
            lo = self.inserted_range(max(intervals - 2, 0))[0]
        hi = self.inserted_range(intervals - 1)[1]
        keys = np.arange(lo, hi, dtype=np.int64)
        return _table(keys, as_of, np.ones(len(keys), dtype=np.int64))


def _owned_keys(lo: int, hi: int, worker: int, n_workers: int) -> np.ndarray:
    first = lo + (worker - lo) % n_workers
    return np.arange(first, hi, n_workers, dtype=np.int64)


def values(keys: np.ndarray) -> pa.StringArray:
    """``format(k, "032x")`` for every (non-negative) key, built without a Python loop.

    Keys are converted ``_CHUNK`` at a time: the nibble array is 128 bytes per
    key, so all at once it would be 4x the size of the strings it makes."""
    n = len(keys)
    chars = np.empty((n, 32), dtype=np.uint8)
    chars[:, :16] = ord("0")
    for start in range(0, n, _CHUNK):
        chunk = keys[start : start + _CHUNK].astype(np.uint64)
        chars[start : start + _CHUNK, 16:] = _HEX[(chunk[:, None] >> _SHIFTS) & np.uint64(0xF)]
    offsets = np.arange(0, 32 * (n + 1), 32, dtype=np.int32)
    return pa.StringArray.from_buffers(
        n, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(chars))
    )


def _table(keys: np.ndarray, ts: int, diffs: np.ndarray) -> pa.Table:
    return pa.Table.from_arrays(
        [
            pa.array(keys, pa.int64()),
            values(keys),
            pa.array(np.full(len(keys), ts, dtype=np.uint64), pa.uint64()),
            pa.array(diffs, pa.int64()),
        ],
        schema=SCHEMA,
    )
