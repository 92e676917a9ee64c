"""Where ``shardsink read --output F`` and ``shardsink export --output DIR``
write, and what a command's stdout holds when it is a document
(:func:`document_stdout`).

Symlinks are followed: a link stays a link and what it points to gets the
data (a dangling link gets the file or directory it names). A regular file,
or a name with nothing there yet, is written under a temporary name in the
same directory and renamed into place, so it appears whole or not at all.
Anything else a file path can name (a FIFO, a terminal, ``/dev/null``, a pipe
through ``/dev/stdout``) is written to as it is: renaming over it would
replace the node itself with a regular file.

Every failure to use the output raises :class:`OutputError`, one line naming
the output, which the command line prints without a traceback (exit status
2, as for any bad argument).
"""

from __future__ import annotations

import contextlib
import io
import os
import secrets
import shutil
import stat
import sys
from collections.abc import Iterator
from pathlib import Path


class OutputError(ValueError):
    """The output cannot be used or written; the message is one line naming it
    and the reason. A ``ValueError``, which ``shardsink`` prints as one line."""


@contextlib.contextmanager
def file_output(path: Path) -> Iterator[io.BufferedIOBase]:
    """A binary file to write ``read --output path`` into.

    - a symlink is followed to what it names, the link left as it is;
    - a regular file or nothing (a dangling link: the file it names) is
      written under a temporary name in its directory, made durable and
      renamed over it when the block succeeds, keeping the permission bits of
      the file it replaces; if the block fails the temporary file is removed
      and the old file (or none) stays;
    - anything else but a directory (FIFO, device, pipe, socket) is opened and
      written to directly, nothing created or renamed; what the block wrote
      before it failed stays written;
    - a directory, a missing parent directory or a failure to open, write,
      flush or rename: :class:`OutputError` naming ``path``, raised from the
      call that failed (a write for ENOSPC on ``/dev/full``, or EPIPE from a
      FIFO whose reader left; but see :class:`_Sink` for stdout's pipe).
    """
    st = _stat(path)
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise OutputError(f"--output {path}: is a directory; give a file path")
    if st is not None and not stat.S_ISREG(st.st_mode):
        label = f"--output {path}"
        sink = _Sink(_open(path, os.O_WRONLY | os.O_NOCTTY, path), label)
        # Between the stat and the open a regular file may have taken the
        # node's place; writing into that in place would not be atomic.
        if not stat.S_ISREG(os.fstat(sink.fileno()).st_mode):
            with _closed_on_failure(sink):
                yield (out := io.BufferedWriter(sink))
                out.close()
            return
        sink.close()
        st = _stat(path)
    target = _regular_target(path, st)
    shown = Path(os.path.realpath(path.parent), path.name)
    label = f"--output {path}" + ("" if target == shown else f" ({target})")
    temp = target.with_name(f".{target.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    sink = _Sink(_open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, path), label)
    try:
        with _closed_on_failure(sink):
            if st is not None:
                _checked(os.fchmod, sink.fileno(), stat.S_IMODE(st.st_mode), label=label)
            yield (out := io.BufferedWriter(sink))
            out.flush()
            # Else a crash soon after the rename could leave the file empty.
            _checked(os.fsync, sink.fileno(), label=label)
            out.close()
        _checked(os.replace, temp, target, label=label)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    _sync_directory(target.parent)


@contextlib.contextmanager
def document_stdout(active: bool) -> Iterator[None]:
    """While ``active``, stdout holds the command's document alone (JSON, a
    ``read``'s rows): the real stdout is kept on a descriptor of its own,
    which ``sys.stdout`` writes to, and descriptor 1 points at stderr, so
    what children and native libraries write to their stdout (a Ray node's
    death notice, a workload's print) lands on stderr. A command that runs
    Python code of others meanwhile also points ``sys.stdout`` at stderr and
    writes its document to the stream it found there (``up --json``).
    After the block ``sys.stdout`` is what it was, and it and descriptor 1
    still go to stderr: a thread that prints later (Ray's) cannot reach the
    document either. Inactive, or when ``sys.stdout`` is not descriptor 1 (a
    test capturing it), the block runs as it is. A reader of the document
    that left before the last flush is not an error (``read | head``)."""
    try:
        active = active and sys.stdout.fileno() == 1
    except (AttributeError, ValueError, io.UnsupportedOperation):
        active = False
    if not active:
        yield
        return
    previous = sys.stdout
    previous.flush()
    real = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = io.TextIOWrapper(
        io.FileIO(real, "w", closefd=False),
        encoding=previous.encoding,
        errors=previous.errors,
        line_buffering=previous.line_buffering,
    )
    try:
        yield
    finally:
        document, sys.stdout = sys.stdout, previous
        try:
            document.flush()
        except BrokenPipeError:  # its reader had enough: what is left goes nowhere
            point_at_devnull(real)
        finally:
            document.close()
            os.close(real)  # fd 1 stays on stderr: a thread still printing misses the document


def point_at_devnull(fd: int) -> None:
    """Point ``fd`` at ``/dev/null``: what is written there later goes nowhere."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def export_target(path: Path) -> Path:
    """The directory ``export --output path`` fills: ``path`` with its
    symlinks followed (a dangling link: the directory it names, created). It
    must be an empty directory or nothing, in a directory that exists, else
    :class:`OutputError` naming ``path``."""
    st = _stat(path)
    target = Path(os.path.realpath(path))
    if st is None:
        _parent_must_exist(path, target)
    elif not stat.S_ISDIR(st.st_mode) or _checked(os.listdir, target, label=f"--output {path}"):
        raise OutputError(f"--output {path}: exists and is not an empty directory")
    return target


@contextlib.contextmanager
def directory_output(path: Path, target: Path) -> Iterator[Path]:
    """A new temporary directory beside ``target`` (what :func:`export_target`
    returned for ``path``), renamed to ``target`` when the block succeeds and
    removed with what it holds if it fails: ``target`` appears whole or not at
    all. :class:`OutputError` naming ``path`` if it cannot be made or renamed
    (the target was filled meanwhile, say)."""
    label = f"--output {path}"
    temp = target.with_name(f".{target.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    _checked(os.mkdir, temp, label=label)
    try:
        yield temp
        # rename(2) replaces an empty directory in one step: no moment passes
        # with neither the old empty one nor the new one there.
        _checked(os.replace, temp, target, label=label)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise


class _Sink(io.FileIO):
    """A file descriptor opened for writing whose write errors are
    :class:`OutputError` naming the output: they reach the command line
    through pyarrow's writers as they are, and are told apart from errors of
    reading the shard. Except a broken pipe that is the command's own stdout
    (``--output /dev/stdout | head``): that stays a ``BrokenPipeError``, which
    the command line takes as its reader having had enough, as without
    ``--output``."""

    def __init__(self, fd: int, label: str) -> None:
        super().__init__(fd, "wb", closefd=True)
        self._label = label

    def write(self, data) -> int:
        try:
            return super().write(data)
        except BrokenPipeError as exc:
            if _is_stdout(self.fileno()):
                raise
            raise OutputError(f"cannot write {self._label}: {exc.strerror or exc}") from None
        except OSError as exc:
            raise OutputError(f"cannot write {self._label}: {exc.strerror or exc}") from None


def _is_stdout(fd: int) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.fstat(sys.stdout.fileno()))
    except (AttributeError, ValueError, OSError):  # no stdout, or not a file (captured)
        return False


@contextlib.contextmanager
def _closed_on_failure(sink: _Sink) -> Iterator[None]:
    """Close ``sink`` if the block fails, so that the buffered writer over it
    then closes without writing what it still holds: that write failed
    already or is moot, and into a FIFO nobody reads it could block forever."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(OSError):
            sink.close()
        raise


def _stat(path: Path) -> os.stat_result | None:
    """What ``path`` names, symlinks (``/proc/self/fd`` ones too) followed;
    ``None`` if nothing (a dangling link, say)."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:  # a loop of links, a file where a directory should be
        raise OutputError(f"cannot write --output {path}: {exc.strerror or exc}") from None


def _regular_target(path: Path, st: os.stat_result | None) -> Path:
    """The path of the regular file ``st`` (``None``: nothing yet) that
    ``path`` names, to rename a new one over."""
    target = Path(os.path.realpath(path))
    if st is None:
        _parent_must_exist(path, target)
        return target
    # A link in /proc/*/fd (/dev/stdout) may name a deleted file, by a path
    # it no longer has.
    now = _stat(target)
    if now is None or not os.path.samestat(now, st):
        raise OutputError(f"cannot write --output {path}: its file has no path to replace")
    return target


def _parent_must_exist(path: Path, target: Path) -> None:
    if not target.parent.is_dir():
        raise OutputError(f"cannot write --output {path}: no directory {target.parent}")


def _open(name: Path, flags: int, path: Path) -> int:
    try:
        return os.open(name, flags, 0o666)
    except OSError as exc:
        raise OutputError(f"cannot write --output {path}: {exc.strerror or exc}") from None


def _checked(call, *args, label: str):
    """``call(*args)``, an ``OSError`` of it an :class:`OutputError` naming ``label``."""
    try:
        return call(*args)
    except OSError as exc:
        raise OutputError(f"cannot write {label}: {exc.strerror or exc}") from None


def _sync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable where the file system can; the
    file is in place already, so a failure here is not the command's."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def table_console():
    """The console tables go to on stdout: piped output (CI logs, tee, a
    test) gets 200 columns, room for whole store URIs and every column of a
    wide table, where rich would give 80 and cut each cell to an ellipsis."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=200)
