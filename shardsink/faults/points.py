"""Named fault points: kill, pause or fail a process at a precise moment, by seed.

Code marks the moments that matter with ``faults.point("builder.after_upload")``.
A point is armed by a spec ``NAME:ACTION[:PROB[:TIMES]][@ROLE]``:

- ``ACTION``: ``kill`` (SIGKILL of this process), ``pause`` (sleep
  ``SHARDSINK_FAULT_PAUSE_S`` seconds, default 1), ``determinate`` (raise
  :class:`~shardsink.storage.errors.DeterminateError`), ``indeterminate``
  (raise :class:`~shardsink.storage.errors.IndeterminateError`);
- ``PROB``: chance that a hit fires (default 1);
- ``TIMES``: how often it may fire in all (default 1; 0 means no limit). With a
  fault directory the budget is shared by every process armed with it (a
  restarted process does not die at the same point again); without one it is
  per process. A cluster run always has one (:func:`run_budgets`), so there
  the budget is the run's.
- ``ROLE``: only the process of that role is armed (``worker g0/w3``,
  ``builder g1``, ``consensus``, ``up``; the role a process arms itself as).

A point may be armed with several actions; they act in the order given, so
``worker.before_finish:pause@worker g0/w3`` followed by
``worker.last_finisher:kill@worker g0/w3`` makes worker 3 of group 0 finish
last (the others are done during its pause) and kills it once it holds the
shared batch.

Whether a hit fires is drawn from a generator seeded by (seed, point, role,
incarnation), so the same seed and the same sequence of hits replay the same
faults. The incarnation counts the processes of a role armed with the same
fault directory (0 without one): a process restarted in its role draws afresh
instead of repeating the draws that ended its predecessor. Processes
inherit armed points through the environment (:func:`environ`, then
:func:`arm_from_env` at start-up). Each firing is appended to
``<fault dir>/fired.jsonl`` before it acts.

Two points mark stores rather than code: ``blob.call`` and ``consensus.call``
stand for every call of a blob or consensus store opened by URI in an armed
process. Stores are wrapped explicitly where they are opened:
:func:`open_blob` and :func:`open_consensus` open one (``shardsink.storage``)
and wrap it (:func:`wrap_store`, with the wrappers of :mod:`.stores`). They
take ``determinate`` (the call is not made) and ``indeterminate`` (the call is
made, then its result is lost) and may be armed with both at once.

Disarmed, ``point`` is one dictionary truth test and stores are not wrapped:
nothing measurable.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import msgspec

from ..storage import Blob, Consensus, DeterminateError, IndeterminateError, backend
from .stores import FaultyBlob, FaultyConsensus

#: Every fault point, with the moment it marks.
POINTS: dict[str, str] = {
    "worker.after_encode": "a worker encoded its slice of the interval",
    "worker.before_finish": "a worker is about to send the part that finishes its handle",
    "worker.after_push": "a worker pushed its part to the builder",
    "worker.before_report": "a worker finished its interval but has not reported it",
    "worker.last_finisher": "a worker received its group's shared batch as the last finisher",
    "builder.after_upload": "a builder uploaded a part to blob",
    "builder.before_handoff": "a builder finished a shared batch but has not handed it over",
    "builder.before_forward": "a group builder (coalesce host) is about to pass its finished "
    "generation to the host builder",
    "builder.host_last": "a group builder received the host batch as the last group to finish, "
    "and has not relayed it",
    "append.before_cas": "the append operator is about to compare-and-append",
    "append.after_cas": "the append operator's compare-and-append returned",
    "consensus.after_store": "the consensus server stored a version but has not replied",
    "transaction.before_store": "a transaction's shards are prepared but not stored",
    "transaction.after_store": "a transaction's shards are stored but it has not replied",
    "reader.before_fetch": "a reader selected its batches but has not fetched their parts",
    "gc.before_delete": "GC listed what to delete but has not deleted it",
    "compaction.after_write": "a compaction wrote its output but has not committed it",
    "compaction.after_commit": "a compaction committed its output; the next has not begun",
    "blob.call": "any call of a blob store (determinate or indeterminate only)",
    "consensus.call": "any call of a consensus store (determinate or indeterminate only)",
}
ACTIONS = ("kill", "pause", "determinate", "indeterminate")
STORE_POINTS = ("blob.call", "consensus.call")

S = TypeVar("S")

ENV_FAULTS = "SHARDSINK_FAULTS"
ENV_SEED = "SHARDSINK_FAULT_SEED"
ENV_DIR = "SHARDSINK_FAULT_DIR"
ENV_PAUSE = "SHARDSINK_FAULT_PAUSE_S"
#: Every variable that arms fault points in a process and its children.
ENVIRONMENT = (ENV_FAULTS, ENV_SEED, ENV_DIR, ENV_PAUSE)


class FaultSpec(msgspec.Struct, frozen=True):
    point: str
    action: str
    prob: float = 1.0
    times: int = 1
    role: str = ""

    def __str__(self) -> str:
        where = f"@{self.role}" if self.role else ""
        return f"{self.point}:{self.action}:{self.prob:g}:{self.times}{where}"


def parse(spec: str) -> FaultSpec:
    """Parse ``NAME:ACTION[:PROB[:TIMES]][@ROLE]``; ``ValueError`` naming what
    is wrong (with the known points or actions)."""
    text, _, role = spec.strip().partition("@")
    fields = text.split(":")
    if len(fields) < 2 or len(fields) > 4:
        raise ValueError(f"fault spec {spec!r}: expected NAME:ACTION[:PROB[:TIMES]][@ROLE]")
    name, action = fields[0], fields[1]
    if name not in POINTS:
        raise ValueError(f"fault spec {spec!r}: unknown point {name!r}; known: {', '.join(POINTS)}")
    if action not in ACTIONS:
        raise ValueError(
            f"fault spec {spec!r}: unknown action {action!r}; known: {', '.join(ACTIONS)}"
        )
    try:
        prob = float(fields[2]) if len(fields) > 2 else 1.0
        times = int(fields[3]) if len(fields) > 3 else 1
    except ValueError:
        raise ValueError(f"fault spec {spec!r}: PROB must be a number, TIMES an integer") from None
    if not 0.0 <= prob <= 1.0 or times < 0:
        raise ValueError(f"fault spec {spec!r}: PROB must be in [0, 1] and TIMES >= 0")
    if name in STORE_POINTS and action not in ("determinate", "indeterminate"):
        raise ValueError(
            f"fault spec {spec!r}: {name} takes determinate or indeterminate, not {action!r}"
        )
    return FaultSpec(name, action, prob, times, role.strip())


class _Armed:
    def __init__(self, spec: FaultSpec, seed: int, role: str, incarnation: int) -> None:
        self.spec = spec
        # the first incarnation keeps the seed string of runs without a fault dir
        suffix = f":{incarnation}" if incarnation else ""
        self.rng = random.Random(f"{seed}:{spec.point}:{role}{suffix}")
        self.prefix = _slot_prefix(spec)
        #: the lowest firing of the budget not known to be taken (taken is for good)
        self.next = 0


class _Process:
    """What this process was armed with beside its points: the fault
    directory (``None``: budgets and records are this process's own), its
    role, and how long a ``pause`` lasts (``None``: from the environment)."""

    def __init__(self) -> None:
        self.dir: Path | None = None
        self.role = ""
        self.pause_s: float | None = None


_ARMED: dict[str, list[_Armed]] = {}
_STATE = _Process()


def arm(
    specs: list[str] | list[FaultSpec],
    *,
    seed: int = 0,
    fault_dir: str | Path | None = None,
    role: str = "",
    pause_s: float | None = None,
) -> None:
    """Arm ``specs`` in this process, whose role is ``role`` (replacing what
    was armed); a spec for another role is left out. ``ValueError`` if a point
    is armed twice with the same action.
    ``pause_s`` (default: ``SHARDSINK_FAULT_PAUSE_S``, else 1) is how long a
    ``pause`` lasts."""
    parsed = _checked(specs)
    parsed = [s for s in parsed if s.role in ("", role)]
    directory = Path(fault_dir) if fault_dir is not None else None
    incarnation = 0
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
        if parsed:
            while not _create(directory / f"incarnation.{_file_safe(role)}.{incarnation}"):
                incarnation += 1
    _ARMED.clear()
    for spec in parsed:
        _ARMED.setdefault(spec.point, []).append(_Armed(spec, seed, role, incarnation))
    _STATE.dir = directory
    _STATE.role = role
    _STATE.pause_s = pause_s


def disarm() -> None:
    _ARMED.clear()


def environ(
    specs: list[str], *, seed: int = 0, fault_dir: str | Path | None = None
) -> dict[str, str]:
    """Environment variables that arm ``specs`` in child processes (validated now)."""
    _checked(specs)
    env = {ENV_FAULTS: ",".join(specs), ENV_SEED: str(seed)}
    if fault_dir is not None:
        env[ENV_DIR] = str(fault_dir)
    return env


def arm_from_env(role: str) -> None:
    """Arm what the environment names (a no-op when it names nothing)."""
    specs = [s for s in os.environ.get(ENV_FAULTS, "").split(",") if s.strip()]
    if specs:
        arm(
            specs,
            seed=int(os.environ.get(ENV_SEED, "0")),
            fault_dir=os.environ.get(ENV_DIR) or None,
            role=role,
        )


@contextlib.contextmanager
def run_budgets(default_dir: str | Path) -> Iterator[Path | None]:
    """While the block runs, the fault budgets of a run are the run's: yields
    the run's fault directory, or ``None`` when neither the environment nor
    this process arms anything (then nothing changes).

    The run's fault directory is the one the environment names
    (:data:`ENV_DIR`), else ``default_dir``, which is then put in this
    process's environment, so that every process started meanwhile arms
    with it. A process armed without a fault directory (``shardsink up``
    itself) takes its firings from the run's budget while the block runs, and
    from its own, where it had left it, after. On exit the environment is as
    it was; ``default_dir`` is the caller's to remove, after the block.

    The environment is the whole process's: two runs at once in one process
    would share the first one's directory, which must then outlive both."""
    armed = os.environ.get(ENV_FAULTS, "").strip() != ""
    given = os.environ.get(ENV_DIR) or None
    if not (armed or _ARMED):
        yield None
        return
    directory = Path(given) if given is not None else Path(default_dir)
    directory.mkdir(parents=True, exist_ok=True)
    if given is None:
        os.environ[ENV_DIR] = str(directory)
    joined = bool(_ARMED) and _STATE.dir is None
    cursors: dict[_Armed, int] = {}
    if joined:
        # the run's budget starts whole, whatever this process took of its own
        cursors = {a: a.next for armed_here in _ARMED.values() for a in armed_here}
        for a in cursors:
            a.next = 0
        _STATE.dir = directory
    try:
        yield directory
    finally:
        if given is None and os.environ.get(ENV_DIR) == str(directory):
            del os.environ[ENV_DIR]
        if joined and _STATE.dir == directory:  # not armed anew meanwhile
            _STATE.dir = None
            for a, n in cursors.items():
                a.next = n


def point(name: str) -> None:
    """A fault point. Does nothing unless ``name`` is armed; then may kill this
    process, pause it, or raise a storage error, as armed."""
    if _ARMED and (armed_here := _ARMED.get(name)):  # .get: a thread may disarm meanwhile
        for armed in armed_here:
            _hit(armed)


def wrap_store(name: str, store: S) -> S:
    """``store`` itself unless ``name`` (``blob.call`` for a ``Blob``,
    ``consensus.call`` for a ``Consensus``) is armed; then a seeded
    :class:`~.stores.FaultyBlob` or ``FaultyConsensus``
    injecting the armed actions at their probabilities, within their budgets,
    each firing recorded like any other."""
    if name not in STORE_POINTS:
        raise ValueError(f"{name!r} is not a store point; known: {', '.join(STORE_POINTS)}")
    if not _ARMED or name not in _ARMED:
        return store
    by_action = {armed.spec.action: armed for armed in _ARMED[name]}
    rates = {action: armed.spec.prob for action, armed in by_action.items()}

    def admit(kind: str) -> bool:
        armed = by_action[kind]
        if not _claim(armed):
            return False
        _record(armed.spec)
        return True

    wrapper = FaultyBlob if name == "blob.call" else FaultyConsensus
    return wrapper(
        store,
        seed=_ARMED[name][0].rng.getrandbits(64),
        fail_rate=rates.get("determinate", 0.0),
        indeterminate_rate=rates.get("indeterminate", 0.0),
        admit=admit,
    )


def open_blob(uri: str) -> Blob:
    """Open the ``Blob`` backend ``uri`` names
    (:func:`shardsink.storage.open_blob`), wrapped to inject faults when the
    ``blob.call`` fault point is armed (:func:`wrap_store`). Raises
    ``ValueError`` for a bad URI and a storage error if the backend cannot be
    reached."""
    return wrap_store("blob.call", backend.open_blob(uri))


def open_consensus(uri: str) -> Consensus:
    """Open the ``Consensus`` backend ``uri`` names
    (:func:`shardsink.storage.open_consensus`), wrapped to inject faults when
    the ``consensus.call`` fault point is armed (:func:`wrap_store`). Raises
    ``ValueError`` for a bad URI and a storage error if the backend cannot be
    reached."""
    return wrap_store("consensus.call", backend.open_consensus(uri))


def _checked(specs: list[str] | list[FaultSpec]) -> list[FaultSpec]:
    """``specs`` parsed; ``ValueError`` if one process would have a point
    armed twice with the same action (same role, or one of them for all)."""
    parsed = [s if isinstance(s, FaultSpec) else parse(s) for s in specs]
    for i, a in enumerate(parsed):
        for b in parsed[:i]:
            if (a.point, a.action) == (b.point, b.action) and (
                a.role == b.role or not a.role or not b.role
            ):
                raise ValueError(
                    f"{a.point} is armed twice with {a.action} for one process: {a}, {b}"
                )
    return parsed


def _hit(armed: _Armed) -> None:
    spec = armed.spec
    if armed.rng.random() >= spec.prob or not _claim(armed):
        return
    _record(spec)
    if spec.action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif spec.action == "pause":
        pause = _STATE.pause_s
        time.sleep(pause if pause is not None else float(os.environ.get(ENV_PAUSE, "1")))
    elif spec.action == "determinate":
        raise DeterminateError(f"injected fault at {spec.point} (determinate)")
    else:
        raise IndeterminateError(f"injected fault at {spec.point} (indeterminate)")


def _claim(armed: _Armed) -> bool:
    """Take one firing from the budget: shared through the fault directory
    (an exclusive create per firing), else counted in this process.

    A held firing (see :func:`hold`) stops the claim: firings are released in
    order, so the ones after it are held too. Each call costs one ``stat``
    while held and nothing once the budget is spent."""
    times = armed.spec.times
    if times == 0:
        return True
    directory = _STATE.dir
    while armed.next < times:
        n = armed.next
        if directory is not None and (directory / f"{armed.prefix}.{n}{_HELD}").exists():
            return False
        armed.next += 1
        if directory is None or _create(directory / f"{armed.prefix}.{n}"):
            return True
    return False


def _create(path: Path) -> bool:
    """Whether this call created ``path``: exclusive creation is what makes a
    claim safe between processes."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def _slot_prefix(spec: FaultSpec) -> str:
    role = _file_safe(spec.role)
    return f"{spec.point}.{spec.action}{'.' + role if role else ''}"


def slot_name(spec: FaultSpec, n: int) -> str:
    """The file in the fault directory whose exclusive creation is firing
    ``n`` of ``spec``'s budget."""
    return f"{_slot_prefix(spec)}.{n}"


_HELD = ".held"


def hold(fault_dir: str | Path, spec: FaultSpec, n: int) -> None:
    """Hold firing ``n`` of ``spec``'s budget back until :func:`release`
    (how ``shardsink chaos`` times point faults). Release in order of ``n``:
    a held firing holds back the ones after it."""
    (Path(fault_dir) / (slot_name(spec, n) + _HELD)).touch(mode=0o600)


def release(fault_dir: str | Path, spec: FaultSpec, n: int) -> None:
    """Let firing ``n`` of ``spec`` go to the next process that hits the point
    (a no-op if it was not held)."""
    (Path(fault_dir) / (slot_name(spec, n) + _HELD)).unlink(missing_ok=True)


def _file_safe(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text)


def _record(spec: FaultSpec) -> None:
    directory = _STATE.dir
    if directory is None:
        return
    line = json.dumps(
        {
            "point": spec.point,
            "action": spec.action,
            "pid": os.getpid(),
            "role": _STATE.role,
            "time": time.time(),
            "monotonic": time.monotonic(),  # which a skewed wall clock leaves alone
        }
    )
    # one write of a short line to an O_APPEND file: lines from processes never interleave
    fd = os.open(directory / "fired.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def fired(fault_dir: str | Path) -> list[dict]:
    """The firings recorded in ``fault_dir``, in order."""
    path = Path(fault_dir) / "fired.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]
