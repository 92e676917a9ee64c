"""The workload protocol, and finding the workload a cluster runs.

A workload is any object with a ``schema`` (one shard) or ``shards``
(several) and an ``updates`` method (:class:`AnyWorkload`);
``ClusterConfig.workload`` names one:

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

The functions here see every workload as shards by name
(:func:`shard_schemas`, :func:`shard_updates`): a workload with ``schema``
writes one shard, the one ``ClusterConfig.shard`` names; one with ``shards``
writes each shard it names, every interval to all of them at once.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import msgspec
import pyarrow as pa

from ..config import WORKLOADS, ClusterConfig
from ..persist import check_shard_name, parts as P, values

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
      ``diff: int64``. Or, for a workload of several shards, ``shards``
      instead: a dict of shard name -> such a schema (at least one; names as
      :func:`~shardsink.persist.state.check_shard_name` takes them).
    - ``updates(interval, worker, workers)``: a ``pyarrow.Table`` (or record
      batch) with columns ``key``, ``val`` and optionally ``diff`` (``int64``;
      missing means +1): the updates global worker ``worker`` of ``workers``
      writes in interval ``interval``; with ``shards``, a dict of shard name
      -> such a table (a shard missing from it gets no rows from this call).
      The cluster sets every ``ts`` to the interval's time and consolidates.
      It must return the same rows for the same arguments, in any process:
      an interval is redone after a failure, by a restarted worker.
    - optional ``expected(intervals)``: the consolidated collection after
      intervals ``0 .. intervals-1`` (``key``, ``val``, ``diff``), with
      ``shards`` a dict of them by shard (a shard missing from it: empty),
      for an exact check; without it a run is verified by digest
      (:mod:`shardsink.persist.digest`).
    - optional ``check(snapshots)``: the workload's own invariant over the
      snapshots read back as of one time (a dict of shard name ->
      consolidated table, ``key, val, ts, diff``): ``None`` if it holds, else
      a string saying what is wrong. With several shards it is where an
      invariant across them lives (every order line's order exists).
    """

    def updates(self, interval: int, worker: int, workers: int) -> Any: ...


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
    if not isinstance(workload, AnyWorkload) or not (
        is_sharded(workload) or isinstance(getattr(workload, "schema", None), pa.Schema)
    ):
        raise ValueError(
            f"workload {config.workload!r} is not a workload: it needs a pyarrow.Schema "
            "'schema' (or a dict 'shards' of them) and an 'updates(interval, worker, workers)' "
            "method"
        )
    return workload


def is_sharded(workload: object) -> bool:
    """Whether ``workload`` declares ``shards`` rather than one ``schema``."""
    return getattr(workload, "shards", None) is not None


def prepare(config: ClusterConfig) -> tuple[ClusterConfig, AnyWorkload, dict[str, pa.Schema]]:
    """What a cluster starts from: ``config`` with its workload's file made
    absolute (:func:`resolve`: every process of the run finds it from
    there), the workload and its shard schemas by name
    (:func:`shard_schemas`). Worker 0's first interval is made too, so a
    workload that writes the wrong columns or shards is refused here, in one
    ``ValueError``, not by workers restarted over it."""
    config = msgspec.structs.replace(config, workload=resolve(config.workload))
    workload = of(config)
    schemas = shard_schemas(workload, config.workload, config.shard)
    shard_updates(workload, schemas, 0, 0, config.n_workers, 0)
    return config, workload, schemas


def shard_schemas(
    workload: AnyWorkload, spec: str = "", default: str = "default"
) -> dict[str, pa.Schema]:
    """The shard schemas of ``workload`` by shard name, in its order: those
    of its ``shards``, or of its one ``schema`` as shard ``default``.
    ``ValueError`` as :func:`shard_schema`'s, or for ``shards`` that is not
    a non-empty dict of valid shard names and schemas."""
    if not is_sharded(workload):
        return {default: shard_schema(workload, spec)}
    declared = workload.shards  # type: ignore[attr-defined]
    if not isinstance(declared, Mapping) or not declared:
        raise ValueError(
            f"workload {spec!r}: its shards must be a non-empty dict of shard name -> "
            f"pyarrow.Schema, not {declared!r}"
        )
    schemas = {}
    for name, schema in declared.items():
        try:
            check_shard_name(name)
        except ValueError as exc:
            raise ValueError(f"workload {spec!r}: {exc}") from None
        if not isinstance(schema, pa.Schema):
            raise ValueError(
                f"workload {spec!r}: shard {name!r} has a {type(schema).__name__}, not a "
                "pyarrow.Schema"
            )
        schemas[name] = _full_schema(schema, f"{spec}, shard {name}")
    return schemas


def shard_schema(workload: AnyWorkload, spec: str = "", shard: str | None = None) -> pa.Schema:
    """The shard schema (``key``, ``val``, ``ts``, ``diff``) of ``workload``'s
    one ``schema``, or of its shard ``shard`` if it declares ``shards``.
    ``ValueError`` naming the workload and the field unless ``key`` and
    ``val`` are its fields and can be sorted and hashed, or naming the
    workload's shards for a ``shard`` it does not write."""
    if not is_sharded(workload):
        return _full_schema(workload.schema, spec)  # type: ignore[attr-defined]
    schemas = shard_schemas(workload, spec)
    if shard not in schemas:
        which = "which one?" if shard is None else f"not {shard!r}"
        raise ValueError(f"workload {spec!r} writes shards {', '.join(schemas)}: {which}")
    return schemas[shard]


def _full_schema(schema: pa.Schema, spec: str) -> pa.Schema:
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
    ``ValueError`` naming what is wrong with them. A workload of one shard
    (``schema``); :func:`shard_updates` takes any."""
    (table,) = shard_updates(workload, {"": schema}, interval, worker, workers, ts).values()
    return table


def shard_updates(
    workload: AnyWorkload,
    schemas: Mapping[str, pa.Schema],
    interval: int,
    worker: int,
    workers: int,
    ts: int,
) -> dict[str, pa.Table]:
    """:func:`updates` of every shard of ``schemas`` (:func:`shard_schemas`),
    by name, in its order: an empty table for a shard the workload gave no
    rows. ``ValueError`` as :func:`updates`', or for a workload of
    ``shards`` that does not return a dict of tables by shard name or names
    a shard it does not declare."""
    call = f"updates({interval}, {worker}, {workers})"
    returned = _call(workload.updates, call, interval, worker, workers)
    tables = _by_shard(workload, schemas, returned, call)
    return {
        name: P.consolidate(_conform(tables[name], schema, ts, _named(call, name, workload)))
        if name in tables else schema.empty_table()
        for name, schema in schemas.items()
    }  # fmt: skip


def expected(
    workload: AnyWorkload, schema: pa.Schema, intervals: int, as_of: int, shard: str = ""
) -> pa.Table | None:
    """``workload``'s expected collection after ``intervals`` intervals, at
    ``ts = as_of``, consolidated: of its shard ``shard`` if it declares
    ``shards`` (empty if its ``expected`` leaves that shard out); ``None``
    if it has no ``expected``."""
    tables = expected_shards(workload, {shard: schema}, intervals, as_of)
    return None if tables is None else tables[shard]


def expected_shards(
    workload: AnyWorkload, schemas: Mapping[str, pa.Schema], intervals: int, as_of: int
) -> dict[str, pa.Table] | None:
    """:func:`expected` of every shard of ``schemas`` (name -> schema), from
    one call of the workload's ``expected``; ``None`` if it has none."""
    method = getattr(workload, "expected", None)
    if method is None:
        return None
    call = f"expected({intervals})"
    tables = _by_shard(workload, schemas, _call(method, call, intervals), call)
    return {
        name: schema.empty_table()
        if name not in tables
        else P.consolidate(_conform(tables[name], schema, as_of, _named(call, name, workload)))
        for name, schema in schemas.items()
    }


def check(workload: AnyWorkload, snapshots: Mapping[str, pa.Table]) -> str | None:
    """What ``workload``'s ``check`` finds wrong with ``snapshots`` (by shard
    name); ``None`` if it holds or the workload has no ``check``.
    ``ValueError`` naming the call if it raises or returns neither ``None``
    nor a string."""
    method = getattr(workload, "check", None)
    if method is None:
        return None
    call = f"check({', '.join(snapshots)})"
    found = _call(method, call, dict(snapshots))
    if found is not None and not isinstance(found, str):
        raise ValueError(f"workload {call} returned {type(found).__name__}, not None or a str")
    return found


def _call(method: Any, call: str, *args: Any) -> Any:
    """``method(*args)``, ``call`` naming it in the one-line ``ValueError``
    that whatever it raises becomes."""
    try:
        return method(*args)
    except Exception as exc:  # the user's code: whatever it raises is named, in one line
        raise ValueError(f"workload {call} raised {type(exc).__name__}: {exc}") from exc


def _by_shard(
    workload: AnyWorkload, schemas: Mapping[str, pa.Schema], returned: Any, call: str
) -> Mapping[str, Any]:
    """What ``call`` returned, by shard name: a workload of one ``schema``
    returned the table of the one shard of ``schemas``; one of ``shards`` a
    dict, whose names must be shards it declares."""
    if not is_sharded(workload):
        (name,) = schemas
        return {name: returned}
    if not isinstance(returned, Mapping):
        raise ValueError(
            f"workload {call} returned {type(returned).__name__}, not a dict of tables by shard"
        )
    declared = workload.shards  # type: ignore[attr-defined]
    unknown = [name for name in returned if name not in declared]
    if unknown:
        raise ValueError(
            f"workload {call} returned shards {', '.join(map(repr, unknown))} it does not "
            f"declare (its shards: {', '.join(declared)})"
        )
    return returned


def _named(call: str, shard: str, workload: AnyWorkload) -> str:
    """``call`` naming the shard its table is for, if the workload has several."""
    return f"{call}[{shard!r}]" if is_sharded(workload) else call


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
