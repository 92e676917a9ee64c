"""``synth``: a configurable generator of updates, in the manner of YCSB.

Each interval runs ``rows_per_interval`` operations across the cluster: a
share ``update`` of them update a key (retract its value, insert a new
one), a share ``delete`` delete one (retract it), the rest insert new keys.
Interval 0 also loads ``records`` keys. Keys are ids ``0, 1, ...`` in the
order they were inserted, written as ``int64`` or as ``"user%012d"``
strings (``key``); updates and deletes pick existing ids by
``distribution``: ``sequential`` (in turn), ``uniform``, ``zipfian``
(YCSB's scrambled zipfian, exponent ``theta``: a few hot keys spread over
the key space) or ``latest`` (zipfian over recency: the newest hottest).
The value is ``columns`` (name -> ``string``, ``int64``, ``int32`` or
``float64``; a struct of them, or the one column itself), strings
``value_bytes`` long, a function of the key, the interval it was last
written in and the column. A key belongs to one worker, drawn once from its
hash with shares ``1 / (w + 1) ** worker_skew`` (0: even).

Deterministic per ``(seed, interval, worker)``: interval ``i``'s
operations are drawn from a generator seeded by ``(seed, i)``, and which
value a key holds follows from the operations before, which a workload
object replays (once: it keeps the state of its last interval, so a run in
order costs each interval once; an interval asked again, as a redone one
is, is replayed from the start). It has no ``expected``: runs of it are
verified by digest.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..persist import mix

Distribution = Literal["sequential", "uniform", "zipfian", "latest"]
_TYPES = {"string": pa.string(), "int64": pa.int64(), "int32": pa.int32(), "float64": pa.float64()}
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_SHIFTS = np.arange(60, -4, -4, dtype=np.uint64)


class Synth:
    """The ``synth`` workload (see the module doc); ``ValueError`` naming a
    bad argument."""

    def __init__(
        self,
        rows_per_interval: int = 1000,
        records: int = 0,
        key: Literal["int64", "string"] = "int64",
        columns: dict[str, str] | None = None,
        value_bytes: int = 100,
        distribution: Distribution = "zipfian",
        theta: float = 0.99,
        update: float = 0.0,
        delete: float = 0.0,
        worker_skew: float = 0.0,
        seed: int = 0,
    ) -> None:
        columns = {"field0": "string"} if columns is None else dict(columns)
        _check(rows_per_interval, records, key, columns, value_bytes, distribution, theta)
        if not (update >= 0 and delete >= 0 and update + delete <= 1):
            raise ValueError(f"update {update} and delete {delete} must be >= 0, sum <= 1")
        if worker_skew < 0:
            raise ValueError(f"worker_skew must be >= 0, got {worker_skew}")
        self.rows, self.records, self.key_type = rows_per_interval, records, key
        self.columns, self.value_bytes = columns, value_bytes
        self.distribution, self.theta = distribution, theta
        self.update, self.delete, self.skew, self.seed = update, delete, worker_skew, seed
        self.inserts = rows_per_interval - round(rows_per_interval * (update + delete))
        fields = [pa.field(n, _TYPES[t]) for n, t in columns.items()]
        val = fields[0].type if len(fields) == 1 else pa.struct(fields)
        key_type = pa.int64() if key == "int64" else pa.string()
        self.schema = pa.schema([("key", key_type), ("val", val)])
        self._reset()

    def updates(self, interval: int, worker: int, workers: int) -> pa.Table:
        keys, versions, diffs = self._interval(interval)
        mine = self._owner(keys, workers) == worker
        return self._table(keys[mine], versions[mine], diffs[mine])

    # --- the state: which version of each key is live ---------------------------

    def _reset(self) -> None:
        self._next = 0  # the interval the state is before
        self._written = np.empty(0, dtype=np.int64)  # per key id: its version (interval)
        self._alive = np.empty(0, dtype=bool)
        self._last: tuple[int, tuple[np.ndarray, ...]] | None = None
        self._zeta = (0, 0.0)

    def _interval(self, interval: int) -> tuple[np.ndarray, ...]:
        if self._last is not None and self._last[0] == interval:
            return self._last[1]
        if interval < self._next:
            self._reset()
        while self._next <= interval:
            self._last = (self._next, self._step(self._next))
            self._next += 1
        assert self._last is not None
        return self._last[1]

    def _base(self, interval: int) -> int:
        """Key ids inserted before ``interval``."""
        return 0 if interval == 0 else self.records + interval * self.inserts

    def _step(self, i: int) -> tuple[np.ndarray, ...]:
        """Interval ``i``'s updates (key ids, versions, diffs), state advanced."""
        n = self._base(i)
        new = np.arange(n, self._base(i + 1), dtype=np.int64)
        self._grow(self._base(i + 1))
        ops = self.rows - self.inserts if n else 0
        rng = np.random.default_rng([self.seed, i])
        kinds = rng.random(ops) * max(self.update + self.delete, 1e-300) < self.update
        picked = self._pick(rng, n, ops, i)
        # the last operation on a key decides it; the ones before cancel out at one ts
        touched, last = np.unique(picked[::-1], return_index=True)
        updated = kinds[::-1][last]
        was = self._alive[touched]
        out_keys = [touched[was], touched[updated], new]
        out_versions = [
            self._written[touched[was]],
            np.full(updated.sum(), i),
            np.full(len(new), i),
        ]
        out_diffs = [np.full(was.sum(), -1), np.ones(updated.sum()), np.ones(len(new))]
        self._alive[touched] = updated
        self._written[touched[updated]] = i
        self._alive[new], self._written[new] = True, i
        return tuple(
            np.concatenate(parts).astype(np.int64) for parts in (out_keys, out_versions, out_diffs)
        )

    def _grow(self, size: int) -> None:
        if len(self._alive) < size:
            extra = max(size, 2 * len(self._alive)) - len(self._alive)
            self._alive = np.concatenate([self._alive, np.zeros(extra, dtype=bool)])
            self._written = np.concatenate([self._written, np.zeros(extra, dtype=np.int64)])

    def _pick(self, rng: np.random.Generator, n: int, count: int, i: int) -> np.ndarray:
        """``count`` key ids of ``[0, n)`` by the distribution."""
        if count == 0:
            return np.empty(0, dtype=np.int64)
        if self.distribution == "sequential":
            return (i * count + np.arange(count, dtype=np.int64)) % n
        if self.distribution == "uniform":
            return rng.integers(0, n, count, dtype=np.int64)
        ranks = self._zipf_ranks(rng.random(count), n)
        if self.distribution == "latest":
            return n - 1 - ranks
        return (mix(ranks.astype(np.uint64)) % np.uint64(n)).astype(np.int64)

    def _zipf_ranks(self, u: np.ndarray, n: int) -> np.ndarray:
        """YCSB's zipfian ranks of ``[0, n)`` for uniform ``u`` (Gray et al.)."""
        theta = self.theta
        done, zeta = self._zeta
        if n > done:  # zeta(n) grows with the key space: add the new terms
            zeta += float(np.sum(1.0 / np.arange(done + 1, n + 1, dtype=np.float64) ** theta))
            self._zeta = (n, zeta)
        zeta2 = 1 + 0.5**theta
        alpha = 1 / (1 - theta)
        eta = (1 - (2 / n) ** (1 - theta)) / (1 - zeta2 / zeta) if n > 2 else 0.0
        uz = u * zeta
        ranks = (n * (eta * u - eta + 1) ** alpha).astype(np.int64)
        ranks = np.where(uz < 1 + 0.5**theta, 1, ranks)
        ranks = np.where(uz < 1, 0, ranks)
        return np.clip(ranks, 0, n - 1)

    def _owner(self, keys: np.ndarray, workers: int) -> np.ndarray:
        shares = 1.0 / np.arange(1, workers + 1, dtype=np.float64) ** self.skew
        bounds = np.cumsum(shares) / shares.sum()
        u = (mix(keys.astype(np.uint64) ^ np.uint64(0xA5A5A5A5)) >> np.uint64(11)) / 2.0**53
        return np.minimum(np.searchsorted(bounds, u, side="right"), workers - 1)

    # --- rows ---------------------------------------------------------------------

    def _table(self, keys: np.ndarray, versions: np.ndarray, diffs: np.ndarray) -> pa.Table:
        if self.key_type == "int64":
            key = pa.array(keys, pa.int64())
        else:
            digits = pc.utf8_lpad(pc.cast(pa.array(keys), pa.string()), 12, "0")
            key = pc.binary_join_element_wise("user", digits, "")
        columns = [
            self._column(kind, keys, versions, j) for j, kind in enumerate(self.columns.values())
        ]
        if len(columns) == 1:
            val = columns[0]
        else:
            fields = [pa.field(n, _TYPES[t]) for n, t in self.columns.items()]
            val = pa.StructArray.from_arrays(columns, fields=fields)
        return pa.table({"key": key, "val": val, "diff": pa.array(diffs, pa.int64())})

    def _column(self, kind: str, keys: np.ndarray, versions: np.ndarray, j: int) -> pa.Array:
        with np.errstate(over="ignore"):
            h = mix(
                keys.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
                + versions.astype(np.uint64) * np.uint64(0xC2B2AE3D27D4EB4F)
                + np.uint64(j * 0x165667B19E3779F9 + self.seed)
            )
        if kind == "int64":
            return pa.array(h.view(np.int64))
        if kind == "int32":
            return pa.array((h >> np.uint64(33)).astype(np.int32))
        if kind == "float64":
            return pa.array((h >> np.uint64(11)) / 2.0**53 * 1000.0)
        return _strings(h, self.value_bytes)


def _strings(h: np.ndarray, size: int) -> pa.StringArray:
    """Each ``h``'s 16 hex digits repeated to ``size`` characters."""
    n = len(h)
    hexes = _HEX[(h[:, None] >> _SHIFTS) & np.uint64(0xF)]
    chars = np.tile(hexes, (1, math.ceil(size / 16)))[:, :size] if n else np.empty((0, size))
    offsets = np.arange(0, size * (n + 1), size, dtype=np.int32)
    data = np.ascontiguousarray(chars, dtype=np.uint8)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data))


def _check(rows, records, key, columns, value_bytes, distribution, theta) -> None:
    if rows < 0 or records < 0:
        raise ValueError(f"rows_per_interval {rows} and records {records} must be >= 0")
    if key not in ("int64", "string"):
        raise ValueError(f"key must be int64 or string, not {key!r}")
    if not columns:
        raise ValueError("columns must name at least one column")
    bad = {n: t for n, t in columns.items() if t not in _TYPES}
    if bad:
        raise ValueError(f"columns {bad}: each type one of {', '.join(_TYPES)}")
    if value_bytes < 1:
        raise ValueError(f"value_bytes must be >= 1, got {value_bytes}")
    if distribution not in ("sequential", "uniform", "zipfian", "latest"):
        raise ValueError(
            f"distribution must be sequential, uniform, zipfian or latest, not {distribution!r}"
        )
    if not 0 < theta < 1:
        raise ValueError(f"theta must be in (0, 1), got {theta}")
