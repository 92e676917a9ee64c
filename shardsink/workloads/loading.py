"""The workload protocol, and finding the workload a cluster runs.

A workload is any object with a ``schema`` and an ``updates`` method
(:class:`AnyWorkload`); ``ClusterConfig.workload`` names one:

- a built-in: ``trickle``, ``churn``, ``hydrate`` (:mod:`.builtin`),
  ``synth`` (:mod:`.synth`) or ``replay`` (:mod:`.replay`);
- ``PATH.py:NAME``, ``NAME`` in the Python file at ``PATH`` (made absolute
  where the cluster starts, so every process finds the same file);
- ``package.module:NAME``, ``NAME`` in an importable module.

``NAME`` is a class, instantiated with ``ClusterConfig.workload_args`` (the
``[workload]`` table of ``--config``) as keyword arguments, or an instance
(then the table must be empty). A class also gets the cluster's
``rows_per_interval``, ``snapshot_rows``, ``interval_ms`` and ``seed`` for
any of those its ``__init__`` takes by name and the table does not set.
Every process of a cluster loads the workload itself from the config (a
workload never crosses a socket), so the same arguments must make the same
workload.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import msgspec
import pyarrow as pa

from ..config import WORKLOADS, ClusterConfig
from ..persist import parts as P
from ..persist import values

#: Built-in names besides ``WORKLOADS`` (the key-range ones), as specs.
BUILTIN_SPECS = {
    "synth": "shardsink.workloads.synth:Synth",
    "replay": "shardsink.workloads.replay:Replay",
}
#: Cluster settings a workload class gets by name unless its table sets them.
OFFERED = ("rows_per_interval", "snapshot_rows", "interval_ms", "seed")


@runtime_checkable
class AnyWorkload(Protocol):
    """What a cluster's workers write.

    - ``schema``: a ``pyarrow.Schema`` of exactly the fields ``key`` and
      ``val``, of any types Arrow can sort and group (a struct for several
      columns); the shard's schema is it plus ``ts: uint64`` and
      ``diff: int64``.
    - ``updates(interval, worker, workers)``: a ``pyarrow.Table`` (or record
      batch) with columns ``key``, ``val`` and optionally ``diff`` (``int64``;
      missing means +1): the updates global worker ``worker`` of ``workers``
      writes in interval ``interval``. The cluster sets every ``ts`` to the
      interval's time and consolidates. It must return the same rows for the
      same arguments, in any process: an interval is redone after a failure,
      by a restarted worker.
    - optional ``expected(intervals)``: the consolidated collection after
      intervals ``0 .. intervals-1`` (``key``, ``val``, ``diff``), for an
      exact check; without it a run is verified by digest
      (:mod:`shardsink.persist.digest`).
    """

    @property
    def schema(self) -> pa.Schema: ...

    def updates(self, interval: int, worker: int, workers: int) -> pa.Table: ...


def resolve(spec: str) -> str:
    """``spec`` with a ``PATH.py`` made absolute (from this process's
    directory); ``ValueError`` if the file does not exist."""
    module, sep, name = spec.rpartition(":")
    if not sep or not _is_path(module):
        return spec
    path = Path(module).expanduser()
    if not path.is_file():
        raise ValueError(f"workload {spec!r}: no file {module}")
    return f"{path.resolve()}:{name}"


def of(config: ClusterConfig) -> AnyWorkload:
    """The workload ``config`` runs (see the module doc); ``ValueError`` in
    one line naming the spec and what is wrong."""
    if config.workload in WORKLOADS:
        from .builtin import Workload

        return Workload.of(config)
    spec = BUILTIN_SPECS.get(config.workload, config.workload)
    target = _find(spec)
    if isinstance(target, type):
        args = dict(config.workload_args)
        params = inspect.signature(target).parameters
        for name in OFFERED:
            if name in params and name not in args:
                args[name] = getattr(config, name)
        try:
            workload = target(**args)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"workload {config.workload!r}: {exc}") from None
    elif config.workload_args:
        raise ValueError(
            f"workload {config.workload!r} is an instance: it takes no [workload] table "
            f"(got {', '.join(config.workload_args)})"
        )
    else:
        workload = target
    if not isinstance(workload, AnyWorkload) or not isinstance(workload.schema, pa.Schema):
        raise ValueError(
            f"workload {config.workload!r} is not a workload: it needs a pyarrow.Schema "
            "'schema' and an 'updates(interval, worker, workers)' method"
        )
    return workload


def prepare(config: ClusterConfig) -> tuple[ClusterConfig, AnyWorkload, pa.Schema]:
    """What a cluster starts from: ``config`` with its workload's file made
    absolute (:func:`resolve`: every process of the run finds it from
    there), the workload and its shard schema. Worker 0's first interval is
    made too, so a workload that writes the wrong columns is refused here,
    in one ``ValueError``, not by workers restarted over it."""
    config = msgspec.structs.replace(config, workload=resolve(config.workload))
    workload = of(config)
    schema = shard_schema(workload, config.workload)
    updates(workload, schema, 0, 0, config.n_workers, 0)
    return config, workload, schema


def shard_schema(workload: AnyWorkload, spec: str = "") -> pa.Schema:
    """The shard schema of ``workload`` (``key``, ``val``, ``ts``, ``diff``);
    ``ValueError`` naming the workload and the field unless ``key`` and
    ``val`` are its fields and can be sorted and hashed."""
    schema = workload.schema
    if tuple(schema.names) != ("key", "val"):
        raise ValueError(
            f"workload {spec!r}: its schema must have exactly the fields key and val "
            f"(a struct for several columns), not {', '.join(schema.names)}"
        )
    try:
        values.check(schema)
    except ValueError as exc:
        raise ValueError(f"workload {spec!r}: {exc}") from None
    return P.full_schema(schema)


def updates(
    workload: AnyWorkload, schema: pa.Schema, interval: int, worker: int, workers: int, ts: int
) -> pa.Table:
    """``workload``'s updates for global worker ``worker`` in ``interval``,
    with ``ts`` set, cast to the shard ``schema`` and consolidated;
    ``ValueError`` naming what is wrong with them."""
    call = f"updates({interval}, {worker}, {workers})"
    try:
        table = workload.updates(interval, worker, workers)
    except Exception as exc:  # the user's code: whatever it raises is named, in one line
        raise ValueError(f"workload {call} raised {type(exc).__name__}: {exc}") from exc
    return P.consolidate(_conform(table, schema, ts, call))


def expected(
    workload: AnyWorkload, schema: pa.Schema, intervals: int, as_of: int
) -> pa.Table | None:
    """``workload``'s expected collection after ``intervals`` intervals, at
    ``ts = as_of``, consolidated; ``None`` if it has no ``expected``."""
    method = getattr(workload, "expected", None)
    if method is None:
        return None
    table = method(intervals)
    return P.consolidate(_conform(table, schema, as_of, f"expected({intervals})"))


def _conform(table: Any, schema: pa.Schema, ts: int, call: str) -> pa.Table:
    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    if not isinstance(table, pa.Table):
        raise ValueError(f"workload {call} returned {type(table).__name__}, not a pyarrow.Table")
    for name in ("key", "val"):
        if name not in table.column_names:
            raise ValueError(f"workload {call} returned no column {name!r}")
    n = table.num_rows
    diff = table["diff"] if "diff" in table.column_names else pa.repeat(pa.scalar(1, pa.int64()), n)
    columns = {
        "key": table["key"],
        "val": table["val"],
        "ts": pa.repeat(pa.scalar(ts, pa.uint64()), n),
        "diff": diff,
    }
    try:
        return P.conform(pa.table(columns), schema)
    except (ValueError, pa.ArrowInvalid) as exc:
        raise ValueError(f"workload {call}: {exc}") from None


def _is_path(module: str) -> bool:
    return module.endswith(".py") or "/" in module


def _find(spec: str) -> Any:
    module, sep, name = spec.rpartition(":")
    if not sep or not module or not name:
        raise ValueError(
            f"unknown workload {spec!r}: a built-in ({', '.join([*WORKLOADS, *BUILTIN_SPECS])}), "
            "PATH.py:NAME or package.module:NAME"
        )
    try:
        loaded = _load_file(module) if _is_path(module) else importlib.import_module(module)
    except Exception as exc:  # the user's module: any error it raises importing is theirs
        why = f"{type(exc).__name__}: {exc}"
        raise ValueError(f"workload {spec!r}: cannot import {module}: {why}") from None
    try:
        return getattr(loaded, name)
    except AttributeError:
        raise ValueError(f"workload {spec!r}: {module} has no {name}") from None


def _load_file(path: str):
    """The module of the Python file ``path``, imported once per process
    under a name made from its path."""
    resolved = Path(path).expanduser().resolve()
    name = f"shardsink_workload_{hashlib.sha1(str(resolved).encode()).hexdigest()[:12]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, resolved)
    if spec is None or spec.loader is None:
        raise ValueError(f"{path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
