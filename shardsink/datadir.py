"""A data directory: the layout of its embedded stores and the lock of its one writer.

``DATA_DIR`` (created mode 0700) holds

- ``blob/``: the file blob store, ``file://DATA_DIR/blob``;
- ``consensus.db``: the SQLite consensus store, ``sqlite:///DATA_DIR/consensus.db``;
- ``shardsink.lock``: held with ``flock`` by the one process that serves or
  writes the stores (a cluster coordinator, a consensus server, or a ``shard``
  command), and recording it as a JSON :class:`Holder`.

A consensus server answers from its cache as if it were the only writer, so
while one serves the data dir nothing else may write its store: a command
that would finds the server's address in the lock file and goes through it
(:func:`acquire_or_server`). The kernel drops the ``flock`` when its holder
dies, so a record left in a lock nobody holds is stale: the next holder
reports it (a warning) and replaces it. A holder clears the record when it
lets go, so a stale record always means a holder died holding it.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from ._pids import process_start

log = logging.getLogger(__name__)

LOCK_NAME = "shardsink.lock"
#: The data dir commands use when ``--data-dir`` is not given.
DATA_DIR_ENV = "SHARDSINK_DATA_DIR"
#: Kinds of holder.
COORDINATOR = "coordinator"
CONSENSUS_SERVER = "consensus-server"
SHARD_COMMAND = "shard-command"
#: How long a taker waits for a holder that will soon let go or say where its
#: server is (a ``shard`` command, a coordinator starting its consensus process).
WAIT_S = 30.0
_POLL_S = 0.05


def blob_uri(data_dir: str | os.PathLike) -> str:
    """The data dir's blob store."""
    return f"file://{Path(os.path.abspath(data_dir)) / 'blob'}"


def consensus_uri(data_dir: str | os.PathLike) -> str:
    """The data dir's consensus store."""
    return f"sqlite://{Path(os.path.abspath(data_dir)) / 'consensus.db'}"


def create(data_dir: str | os.PathLike) -> Path:
    """Make ``data_dir`` (absolute path returned) with mode 0700 if it does not
    exist; missing parents get the default mode, an existing directory keeps
    its own. ``ValueError``, one line naming the directory, the cause and the
    fix, if it exists and is not a directory or not one this process can make
    files in, or cannot be made (a file on its path, a read-only file system,
    a parent it may not write, a virtual file system such as ``/proc``)."""
    path = Path(os.path.abspath(data_dir))
    try:
        path.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        if not path.is_dir():
            raise ValueError(f"data dir {path} exists and is not a directory; {_FIX}") from None
        _check_writable(path)
    except OSError as exc:
        raise unusable(path, exc) from None
    else:
        path.chmod(0o700)  # whatever the umask
    return path


def _check_writable(path: Path) -> None:
    """:func:`unusable` unless a file can be made in the existing directory
    ``path``: tried, since permission bits, capabilities and a read-only
    mount each decide it and ``os.access`` sees only some of them."""
    probe = path / f".shardsink-probe-{os.getpid()}"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.unlink(probe)
    except OSError as exc:
        raise unusable(path, exc) from None


#: What every refusal of a data dir suggests.
_FIX = "give --data-dir a directory you can write, or one that can be made"


def unusable(data_dir: Path, exc: OSError) -> ValueError:
    """The one-line ``ValueError`` for a data dir that ``exc`` (from making
    it or a file in it) says cannot be used: the cause in words, and the fix."""
    blocker = next((p for p in data_dir.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        why = f"{blocker} is a file, not a directory"
    elif exc.errno == errno.EROFS:
        why = "it is on a read-only file system"
    elif exc.errno in (errno.EACCES, errno.EPERM):
        parent = next((p for p in data_dir.parents if p.exists()), data_dir.parent)
        target = data_dir if data_dir.is_dir() else parent
        why = f"{target} does not let this user (uid {os.getuid()}) create files in it"
    elif exc.errno == errno.ENOENT:
        why = "its file system makes no directories there (a virtual one, such as /proc?)"
    else:
        why = exc.strerror or str(exc)
    return ValueError(f"cannot use data dir {data_dir}: {why}; {_FIX}")


class Holder(msgspec.Struct, frozen=True, kw_only=True):
    """Who holds a data dir's lock: its ``pid`` and ``start`` (clock ticks since
    boot, as :func:`~shardsink._pids.process_start` gives it, so a reused
    pid is not mistaken for the holder), its ``kind`` (:data:`COORDINATOR`,
    :data:`CONSENSUS_SERVER`, :data:`SHARD_COMMAND`) and ``address``, where the
    consensus server serving the data dir answers (``None`` until it does, and
    for a ``shard`` command), and, for a coordinator, ``control``, the address
    of its control socket (:mod:`shardsink.cluster.control`; ``None`` until it
    serves one).

    Fields added later have defaults, and decoding ignores fields it does not
    know, so a record written by another version of shardsink still reads."""

    pid: int
    start: int
    kind: str
    address: str | None = None
    control: str | None = None

    def alive(self) -> bool:
        """Whether the holder's process still runs (a zombie does not)."""
        return process_start(self.pid) == self.start

    def describe(self) -> str:
        """E.g. ``coordinator pid 12 (consensus server at ipc:///...)``."""
        what = f"{self.kind.replace('-', ' ')} pid {self.pid}"
        return what + (f" (consensus server at {self.address})" if self.address else "")


class DataDirBusy(ValueError):
    """Someone else holds the data dir's lock; ``holder`` is its record (``None``
    if it has not written one)."""

    def __init__(self, data_dir: Path, holder: Holder | None, waited_s: float) -> None:
        self.holder = holder
        who = holder.describe() if holder else "a process that has not said who it is"
        message = f"data dir {data_dir} is in use by {who}"
        if holder is not None and holder.address:
            message += f"; go through its consensus server: --consensus {holder.address}"
        elif waited_s > 0:
            message += f" (waited {waited_s:g} s)"
        super().__init__(message)


class DataDirLock:
    """The held lock of a data dir (see :func:`acquire`). ``close()`` (or leaving
    the ``with`` block) clears the record and lets go; it is idempotent."""

    def __init__(self, fd: int, data_dir: Path, holder: Holder) -> None:
        self.data_dir = data_dir
        self._fd: int | None = fd
        self._holder = holder
        self._write()

    @property
    def holder(self) -> Holder:
        return self._holder

    def update(self, *, address: str | None = None, control: str | None = None) -> None:
        """Record where this holder's consensus server (``address``) and control
        socket (``control``) answer; a field not given keeps its value."""
        given = {"address": address, "control": control}
        self._holder = msgspec.structs.replace(
            self._holder, **{k: v for k, v in given.items() if v is not None}
        )
        self._write()

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.ftruncate(fd, 0)  # a record left behind would read as stale
            finally:
                os.close(fd)  # lets go of the flock

    def __enter__(self) -> DataDirLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write(self) -> None:
        if self._fd is None:
            raise ValueError(f"the lock of data dir {self.data_dir} was let go")
        data = msgspec.json.encode(self._holder) + b"\n"
        # write, then cut: a reader never finds the file empty while it is held
        os.pwrite(self._fd, data, 0)
        os.ftruncate(self._fd, len(data))


def acquire(data_dir: str | os.PathLike, kind: str, *, wait_s: float = WAIT_S) -> DataDirLock:
    """Hold the lock of ``data_dir`` (which must exist) as ``kind``.

    A ``shard`` command holding it is waited for, up to ``wait_s`` seconds;
    any other holder is :class:`DataDirBusy` at once, naming it (and, when it
    runs a consensus server, its address). A stale record is logged and
    replaced."""
    taken = _take(Path(data_dir), kind, wait_s, lambda h: h.kind != SHARD_COMMAND)
    if isinstance(taken, Holder):
        raise DataDirBusy(Path(data_dir), taken, 0.0)
    return taken


def acquire_or_server(
    data_dir: str | os.PathLike, *, wait_s: float = WAIT_S
) -> DataDirLock | Holder:
    """For a ``shard`` command about to use the data dir's state: the
    :class:`Holder` whose consensus server serves ``data_dir`` (go through its
    ``address``), or the lock, held as :data:`SHARD_COMMAND` while the command
    writes the stores itself.

    A holder without a server address yet (a coordinator starting its
    consensus process, another ``shard`` command) is waited for up to
    ``wait_s`` seconds; then :class:`DataDirBusy`."""
    return _take(Path(data_dir), SHARD_COMMAND, wait_s, lambda h: h.address is not None)


def recorded_holder(data_dir: str | os.PathLike) -> Holder | None:
    """The record in the lock file of ``data_dir``, stale or not (``None`` if
    there is none); :meth:`Holder.alive` tells which. Takes no lock."""
    try:
        fd = os.open(Path(data_dir) / LOCK_NAME, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        return _read(fd)
    finally:
        os.close(fd)


def _take(
    data_dir: Path, kind: str, wait_s: float, final: Callable[[Holder], bool]
) -> DataDirLock | Holder:
    """The lock, or the first holder for which ``final`` is true; a holder
    for which it is false, or that has not written its record yet, is waited
    for up to ``wait_s`` seconds, then :class:`DataDirBusy`."""
    path = data_dir / LOCK_NAME
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except FileNotFoundError:
            raise ValueError(f"data dir {data_dir} does not exist") from None
        except OSError as exc:  # read-only, not ours to write
            raise unusable(Path(os.path.abspath(data_dir)), exc) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(fd)
            os.close(fd)
            if holder is not None and final(holder):
                return holder
            if time.monotonic() >= deadline:
                raise DataDirBusy(data_dir, holder, wait_s) from None
            time.sleep(_POLL_S)
            continue
        except BaseException:
            os.close(fd)
            raise
        try:
            if os.fstat(fd).st_size:
                stale = _read(fd)
                who = stale.describe() if stale else "an unreadable record"
                log.warning("data dir %s: replacing the stale lock of %s, gone", data_dir, who)
            pid = os.getpid()
            start = process_start(pid)
            assert start is not None  # this process runs
            return DataDirLock(fd, data_dir, Holder(pid=pid, start=start, kind=kind))
        except BaseException:
            os.close(fd)
            raise


def _read(fd: int) -> Holder | None:
    """The record in the lock file; ``None`` if it is empty or not (yet) one."""
    data = os.pread(fd, 1 << 16, 0)
    try:
        return msgspec.json.decode(data, type=Holder) if data.strip() else None
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
