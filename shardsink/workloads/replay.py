"""``replay``: a Parquet dataset written again, as a workload.

``path`` is a Parquet file, a directory of them or a glob; ``key`` names
its key column and ``val`` the value's (one column, or several made a
struct), ``diff`` an ``int64`` column of diffs if it has one (else each row
is +1). The rows are cut into intervals by ``time`` (a numeric or temporal
column, in intervals ``width`` of its units wide, from its smallest value)
or, without it, ``rows_per_interval`` rows at a time in the dataset's
order; within an interval a row goes to the worker its key hashes to. It
has ``expected``: the dataset's rows of the intervals so far, consolidated.
Every process of the cluster reads the dataset whole when it loads the
workload, so it suits datasets that fit in memory a few times over.
"""

from __future__ import annotations

import glob
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds

from ..persist import row_hashes


class Replay:
    """The ``replay`` workload (see the module doc); ``ValueError`` naming a
    missing file or column."""

    def __init__(
        self,
        path: str,
        key: str = "key",
        val: str | list[str] = "val",
        diff: str | None = None,
        time: str | None = None,
        width: int = 1000,
        rows_per_interval: int = 1000,
    ) -> None:
        table = _read(path)
        names = [val] if isinstance(val, str) else list(val)
        missing = [c for c in [key, *names, diff, time] if c and c not in table.column_names]
        if missing:
            raise ValueError(
                f"replay {path!r} has no column {missing[0]!r}; it has {table.column_names}"
            )
        if width < 1 or rows_per_interval < 1:
            raise ValueError(
                f"width {width} and rows_per_interval {rows_per_interval} must be >= 1"
            )
        columns = {"key": table[key]}
        if isinstance(val, str):
            columns["val"] = table[val]
        else:
            chunks = [table[n].combine_chunks() for n in names]
            columns["val"] = pa.StructArray.from_arrays(chunks, names=names)
        columns["diff"] = (
            table[diff].cast(pa.int64())
            if diff
            else pa.repeat(pa.scalar(1, pa.int64()), len(table))
        )
        rows = pa.table(columns)
        if time is None:
            interval = np.arange(len(rows), dtype=np.int64) // rows_per_interval
        else:
            stamps = _stamps(table[time])
            interval = (stamps - stamps.min()) // width if len(stamps) else stamps
        order = np.argsort(interval, kind="stable")
        self._rows = rows.take(order)
        self._interval = interval[order]
        self._hash = row_hashes(self._rows, ("key",))
        self.schema = pa.schema([("key", rows["key"].type), ("val", rows["val"].type)])

    @property
    def intervals(self) -> int:
        """How many intervals the dataset makes; later ones are empty."""
        return int(self._interval[-1]) + 1 if len(self._interval) else 0

    def updates(self, interval: int, worker: int, workers: int) -> pa.Table:
        lo, hi = np.searchsorted(self._interval, [interval, interval + 1])
        mine = self._hash[lo:hi] % np.uint64(workers) == np.uint64(worker)
        return self._rows.slice(lo, hi - lo).filter(pa.array(mine))

    def expected(self, intervals: int) -> pa.Table:
        hi = int(np.searchsorted(self._interval, intervals))
        return self._rows.slice(0, hi)


def _read(path: str) -> pa.Table:
    files = sorted(glob.glob(path)) if any(c in path for c in "*?[") else [path]
    if not files or not all(Path(f).exists() for f in files):
        raise ValueError(f"replay: no Parquet dataset at {path!r}")
    try:
        return ds.dataset(files if len(files) > 1 else files[0], format="parquet").to_table()
    except (pa.ArrowInvalid, OSError) as exc:
        raise ValueError(f"replay {path!r}: not a Parquet dataset: {exc}") from None


def _stamps(column: pa.ChunkedArray) -> np.ndarray:
    """A time column as ``int64`` in its own units (a date's days)."""
    if pa.types.is_date32(column.type):
        column = column.cast(pa.int32())
    return column.cast(pa.int64()).to_numpy().astype(np.int64)
