"""The history of a chaos run: every client operation of the consensus
protocol, as ``history.jsonl``, for the linearizability checker
(:mod:`shardsink.chaos.linearizability`). A process records its own when
:data:`HISTORY_ENV` names the file (:func:`from_environment`): the server's
clients (:mod:`.client`) record each compare-and-append and each read of
the upper they make.

An operation is an :class:`Op`: who did it (``process``), on which shard,
what (``append(writer, token, lower, upper)`` or ``read``), when it was
invoked and when it completed, and how it ended (``outcome``):

- ``ok``: an append committed (``Appended``), or a read returned ``upper``;
- ``already``: an append answered ``AlreadyAppended``: its token is the
  writer's last applied, so it took effect, before this call (a retry
  of an earlier one with the same token) or during it (the server retried a
  store call whose outcome it could not know, and found its token);
- ``mismatch``: an append answered ``WrongUpper`` (the upper was not
  ``lower``; nothing happened; ``actual`` is the upper it saw);
- ``fail``: a determinate error: nothing happened;
- ``info``: indeterminate (a timeout, a lost reply, a crash of the client
  or the server mid-call): it may or may not have happened, at any time
  after its invocation. Its ``complete_ns`` is when the client gave up, or
  ``None`` if it never did (the client died, or the run ended first).

Times are ``time.monotonic_ns()`` of the one machine every process of a
chaos run shares, read before the call is sent and after its answer is
back, so each operation's true interval lies within ``[invoke_ns,
complete_ns]`` and times of different processes compare.

A :class:`HistoryWriter` writes one line when an operation is invoked (the
operation as it stands if it never completes: ``info``, ``complete_ns``
null) and one when it completes, under the same ``id``; :func:`load` keeps
the completion. So a client killed mid-call (``kill-coordinator``) still
leaves its operation in the history as ``info``: an operation lost with its
client could have taken effect, and the checker would then see an effect
that nothing in the history explains.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Literal

import msgspec

from .._random_ids import random_hex

Kind = Literal["append", "read"]
Outcome = Literal["ok", "already", "mismatch", "fail", "info"]

#: The fields an operation's completion line must repeat from its invocation.
_INVOCATION = ("process", "shard", "kind", "invoke_ns", "writer", "token", "lower")


class Op(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """One client operation on one shard (see the module docstring).

    ``id`` is unique within a history file. An append carries its
    arguments ``writer``, ``token``, ``lower < upper`` and, when it is a
    ``mismatch``, the ``actual`` upper it saw; a read carries the ``upper``
    it returned when ``ok``. A ``complete_ns`` of ``None`` is only for
    ``info`` and a set one is not before ``invoke_ns``. Constructing or
    decoding an op that breaks this raises ``ValueError`` (from a decoder,
    ``msgspec.ValidationError``), naming the field.
    """

    id: str
    process: str
    shard: str
    kind: Kind
    invoke_ns: int
    complete_ns: int | None
    outcome: Outcome
    writer: str | None = None
    token: str | None = None
    lower: int | None = None
    upper: int | None = None
    actual: int | None = None

    def __post_init__(self) -> None:
        problem = _problem(self)
        if problem is not None:
            raise ValueError(f"op {self.id!r} of {self.process!r}: {problem}")


def _problem(op: Op) -> str | None:
    if op.complete_ns is None and op.outcome != "info":
        return f"complete_ns is null but the outcome is {op.outcome!r}, not 'info'"
    if op.complete_ns is not None and op.complete_ns < op.invoke_ns:
        return f"complete_ns {op.complete_ns} is before invoke_ns {op.invoke_ns}"
    if op.kind == "read":
        if op.writer is not None or op.token is not None or op.lower is not None:
            return "a read has no writer, token or lower"
        if op.outcome in ("already", "mismatch"):
            return f"a read cannot end {op.outcome!r}"
        if (op.upper is not None) != (op.outcome == "ok"):
            return "a read has an upper iff it is ok"
        return "actual is only for a mismatch" if op.actual is not None else None
    if not op.writer or not op.token or op.lower is None or op.upper is None:
        return "an append needs writer, token (non-empty), lower and upper"
    if not 0 <= op.lower < op.upper:
        return f"an append needs 0 <= lower < upper, not lower {op.lower}, upper {op.upper}"
    if (op.actual is not None) != (op.outcome == "mismatch"):
        return "an append has an actual upper iff it is a mismatch"
    return None


def describe(op: Op, origin_ns: int) -> str:
    """``op`` on one line: its times in ms since ``origin_ns`` (a history's
    first invocation), its process, its call and how it ended."""
    if op.kind == "append":
        call = f"append({op.writer}, {op.token}, {op.lower} -> {op.upper})"
    else:
        call = "read"
    result: str = op.outcome
    if op.outcome == "mismatch":
        result = f"mismatch (actual {op.actual})"
    elif op.kind == "read" and op.outcome == "ok":
        result = f"ok {op.upper}"
    end = "never" if op.complete_ns is None else f"{(op.complete_ns - origin_ns) / 1e6:.3f}"
    return f"[{(op.invoke_ns - origin_ns) / 1e6:.3f}, {end}] ms  {op.process}  {call} -> {result}"


class Handle(msgspec.Struct, frozen=True):
    """An invoked operation, to pass to :meth:`HistoryWriter.complete`;
    ``op`` is how the history has it until then (``info``, never completed)."""

    op: Op


class HistoryError(ValueError):
    """A history file that is not a history: names the file and the line."""


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(Op).decode


class HistoryWriter:
    """Appends a process's operations to a history file.

    :meth:`invoke` before the call, :meth:`complete` with its outcome after
    it; each writes one line with one ``write(2)`` to an ``O_APPEND``
    descriptor, so a line is in the kernel before the call returns (a crash
    of the process loses at most the line being written) and lines of
    several writers, in threads or processes, never interleave. Safe to use
    from several threads. Operations still open at :meth:`close` (or at a
    crash) stay recorded as ``info`` with no completion, by their
    invocation line. ``close`` is idempotent; :meth:`invoke` after it
    raises ``ValueError``, :meth:`complete` after it records nothing (the
    run has ended and the op stays open).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        # ids unique across the writers of one file: a restarted client reuses its name
        self._prefix = random_hex()[:12]
        self._count = 0
        self._open: set[str] = set()
        self._lock = threading.Lock()

    def invoke(
        self,
        *,
        process: str,
        shard: str,
        kind: Kind,
        writer: str | None = None,
        token: str | None = None,
        lower: int | None = None,
        upper: int | None = None,
    ) -> Handle:
        """Record that ``process`` is about to call ``kind`` on ``shard``
        (an append with its ``writer``, ``token``, ``lower`` and ``upper``).
        Raises ``ValueError`` for missing or inconsistent arguments."""
        with self._lock:
            if self._fd is None:
                raise ValueError(f"history {self.path} is closed")
            self._count += 1
            op = Op(
                id=f"{self._prefix}.{self._count}",
                process=process,
                shard=shard,
                kind=kind,
                invoke_ns=time.monotonic_ns(),
                complete_ns=None,
                outcome="info",
                writer=writer,
                token=token,
                lower=lower,
                upper=upper,
            )
            self._write(op)
            self._open.add(op.id)
        return Handle(op)

    def complete(
        self,
        handle: Handle,
        outcome: Outcome,
        *,
        upper: int | None = None,
        actual: int | None = None,
    ) -> Op | None:
        """Record how ``handle``'s call ended: ``upper`` is a read's result,
        ``actual`` a mismatch's. Returns the op as recorded, or ``None``
        after :meth:`close`. Raises ``ValueError`` for a handle already
        completed or a result that does not fit the outcome."""
        now = time.monotonic_ns()
        op = handle.op
        if upper is not None and op.kind != "read":
            raise ValueError(f"op {op.id!r}: an append's upper is its argument, not a result")
        done = msgspec.structs.replace(
            op,
            outcome=outcome,
            complete_ns=now,
            upper=upper if op.kind == "read" else op.upper,
            actual=actual,
        )
        with self._lock:
            if self._fd is None:
                return None
            if op.id not in self._open:
                raise ValueError(f"op {op.id!r} of {op.process!r} was completed already")
            self._open.discard(op.id)
            self._write(done)
        return done

    def _write(self, op: Op) -> None:
        assert self._fd is not None
        line = memoryview(_encode(op) + b"\n")
        while line:  # a short write is rare on a regular file, and must not cut a line
            line = line[os.write(self._fd, line) :]

    def close(self) -> None:
        """Close the file (again: nothing)."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> HistoryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load(path: str | Path) -> list[Op]:
    """The operations of the history file at ``path``, in the order they
    were invoked in the file, each as completed if its completion line is
    there, else as invoked (``info``, never completed).

    Strict: a line that is not an :class:`Op` (unknown or missing fields,
    a wrong type, an inconsistent op, a blank or cut line), a completion
    of an op never invoked, a second completion, or a completion whose
    invocation fields differ raises :class:`HistoryError` naming the file
    and the line. ``OSError`` if it cannot be read."""
    path = Path(path)
    ops: dict[str, Op] = {}
    lines: dict[str, int] = {}
    with path.open("rb") as file:
        for number, raw in enumerate(file, 1):
            try:
                op = _decode(raw)
            except msgspec.DecodeError as exc:
                raise HistoryError(f"{path}:{number}: {exc}") from None
            problem = _joined(ops.get(op.id), op, lines.get(op.id))
            if problem is not None:
                raise HistoryError(f"{path}:{number}: op {op.id!r}: {problem}")
            ops[op.id] = op
            lines.setdefault(op.id, number)
    return list(ops.values())


def _joined(before: Op | None, op: Op, line: int | None) -> str | None:
    """Why ``op`` cannot follow ``before``, the line of the same id (if any)."""
    if before is None:
        return None if op.complete_ns is None else "completes an op never invoked"
    if before.complete_ns is not None or op.complete_ns is None:
        return f"recorded twice (line {line})"
    same = all(getattr(before, f) == getattr(op, f) for f in _INVOCATION)
    if not same or (op.kind == "append" and op.upper != before.upper):
        return f"its completion does not match its invocation (line {line})"
    return None


#: The history file every client of this process records to, if set
#: (``shardsink chaos`` sets it for the processes of a run), and the name
#: its operations go under (default: the process's fault role, else its pid).
HISTORY_ENV = "SHARDSINK_HISTORY"
PROCESS_ENV = "SHARDSINK_HISTORY_PROCESS"
_FROM_ENV: dict[str, HistoryWriter] = {}
_FROM_ENV_LOCK = threading.Lock()


def from_environment() -> tuple[HistoryWriter, str] | None:
    """This process's history writer and process name, if :data:`HISTORY_ENV`
    names a file (one writer per file per process, opened on first use)."""
    path = os.environ.get(HISTORY_ENV)
    if not path:
        return None
    with _FROM_ENV_LOCK:
        writer = _FROM_ENV.get(path)
        if writer is None:
            writer = _FROM_ENV[path] = HistoryWriter(path)
    return writer, os.environ.get(PROCESS_ENV) or f"pid {os.getpid()}"


def close_from_environment(path: str | Path) -> None:
    """Close this process's writer to ``path`` opened by :func:`from_environment`
    (the run that recorded there is over); a later operation opens it again."""
    with _FROM_ENV_LOCK:
        writer = _FROM_ENV.pop(str(path), None)
    if writer is not None:
        writer.close()
