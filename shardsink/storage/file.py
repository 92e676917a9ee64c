"""``Blob`` on a local directory: ``file:///absolute/dir``.

Each key is a file at ``DIR/<key>`` (its ``/``-separated segments become nested
directories). ``set`` writes a temporary file next to the target, fsyncs it,
renames it over the target and fsyncs the directory, so a reader sees the old
file or the whole new one, and the new one survives a machine crash once
``set`` returns.

Temporary files are named ``KEY~PID-HEX``: ``~`` is a character no key may
contain, so they never collide with a key and ``list_meta`` never yields them.
A writer that dies mid-``set`` leaves one behind; :meth:`FileBlob.list_temp`
finds them and :meth:`FileBlob.delete_temp` removes them (the leaked-blob sweep
uses both, see :class:`~.contracts.LeavesTempFiles`).

Files are created 0600 and directories 0700 (the root too, if this creates
it), like the shared-memory segments: a part is the shard's data, readable by
its owner only.

Empty directories left by ``delete`` are kept: removing them would race with a
concurrent ``set`` creating its temporary file in the same directory, and there
is at most one per distinct key prefix.

Limitation of the mapping: a key cannot be both a value and a prefix of
another key (``a`` and ``a/b``); the second ``set`` raises ``DeterminateError``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import stat
from collections.abc import Callable, Iterator
from typing import TypeVar
from urllib.parse import unquote, urlsplit

import pyarrow as pa

from .contracts import BlobMeta, TempMeta, check_key, check_prefix
from .errors import DeterminateError, IndeterminateError
from .uri import bad_uri

_M = TypeVar("_M", BlobMeta, TempMeta)

_TEMP_MARK = "~"
_TEMP_SUFFIX_RE = re.compile(r"[0-9]+-[0-9a-f]+")
_ABSENT = (errno.ENOENT, errno.ENOTDIR, errno.EISDIR)
_FILE_MODE = 0o600
_DIR_MODE = 0o700


def _is_key(name: str) -> bool:
    try:
        check_key(name)
    except ValueError:
        return False
    return True


def _temp_key(name: str) -> str | None:
    """The key whose ``set`` made the temporary file ``name`` (``KEY~PID-HEX``),
    or ``None`` if ``name`` is not one."""
    key, mark, suffix = name.partition(_TEMP_MARK)
    if mark and _is_key(key) and _TEMP_SUFFIX_RE.fullmatch(suffix):
        return key
    return None


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FileBlob:
    """A ``Blob`` stored as files under one root directory.

    Errors: ``ValueError`` for an invalid key; :class:`DeterminateError` when an
    operation failed before changing anything (including every failed read);
    :class:`IndeterminateError` when ``set`` or ``delete`` changed the directory
    but could not make the change durable (the directory fsync failed).
    """

    def __init__(self, root: str) -> None:
        """Use the existing, writable directory ``root`` (an absolute path)."""
        self.root = root
        self.uri = f"file://{root}"

    @classmethod
    def from_uri(cls, uri: str) -> FileBlob:
        """Open ``file:///absolute/dir``.

        The directory is created if missing, but only the last component: its
        parent must exist, so a mistyped path does not silently grow a new tree.

        Raises ``ValueError`` for a malformed URI (relative path, a host, a
        query or fragment, ``.``/``..`` segments) and :class:`DeterminateError`
        naming the path if it is not a directory, cannot be created or is not
        writable.
        """
        parts = urlsplit(uri)
        if parts.netloc:
            raise bad_uri(uri, "blob", f"file URIs take no host, got {parts.netloc!r}")
        if parts.query or parts.fragment or uri.endswith(("?", "#")):
            raise bad_uri(uri, "blob", "file URIs take no query or fragment")
        path = unquote(parts.path)
        if not path.startswith("/"):
            raise bad_uri(uri, "blob", "the directory must be an absolute path (file:///dir)")
        segments = [s for s in path.split("/") if s]
        if any(s in (".", "..") for s in segments):
            raise bad_uri(uri, "blob", "the path must not contain '.' or '..' segments")
        root = "/" + "/".join(segments)
        cls._ensure_root(root)
        return cls(root)

    @staticmethod
    def _ensure_root(root: str) -> None:
        try:
            os.mkdir(root, _DIR_MODE)
        except FileExistsError:
            pass
        except FileNotFoundError:
            raise DeterminateError(
                f"blob directory {root!r}: its parent {os.path.dirname(root)!r} does not "
                "exist (only the last component is created)"
            ) from None
        except OSError as exc:
            raise DeterminateError(f"blob directory {root!r}: cannot create: {exc}") from exc
        else:
            try:
                _fsync_dir(os.path.dirname(root))
            except OSError as exc:
                raise DeterminateError(f"blob directory {root!r}: cannot sync: {exc}") from exc
        try:
            mode = os.stat(root).st_mode
        except OSError as exc:
            raise DeterminateError(f"blob directory {root!r}: {exc}") from exc
        if not stat.S_ISDIR(mode):
            raise DeterminateError(f"blob directory {root!r} exists and is not a directory")
        if not os.access(root, os.W_OK | os.X_OK):
            raise DeterminateError(f"blob directory {root!r} is not writable")

    def _path(self, key: str) -> str:
        return os.path.join(self.root, *check_key(key).split("/"))

    def get(self, key: str) -> bytes | None:
        """The value under ``key``, or ``None``."""
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as exc:
            if exc.errno in _ABSENT:
                return None
            raise DeterminateError(f"{self.uri}: cannot read key {key!r}: {exc}") from exc

    def stat(self, key: str) -> BlobMeta | None:
        """The size and mtime of ``key``'s file, or ``None``."""
        path = self._path(key)
        try:
            st = os.stat(path)
        except OSError as exc:
            if exc.errno in _ABSENT:
                return None
            raise DeterminateError(f"{self.uri}: cannot stat key {key!r}: {exc}") from exc
        if not stat.S_ISREG(st.st_mode):  # a key that is only a prefix of others
            return None
        return BlobMeta(key, st.st_size, st.st_mtime)

    def open_input(self, key: str) -> pa.NativeFile | None:
        """``key``'s file opened for positional reads (``pyarrow.OSFile``), or
        ``None``. An open file keeps reading the value it opened: ``set``
        renames a new file over the key and ``delete`` unlinks it, neither
        touches the open one."""
        path = self._path(key)
        try:
            file = pa.OSFile(path, "r")
        except OSError as exc:
            if exc.errno in _ABSENT or os.path.isdir(path):
                return None
            raise DeterminateError(f"{self.uri}: cannot open key {key!r}: {exc}") from exc
        # Arrow opens without O_CLOEXEC; Python's own files are not inherited either
        os.set_inheritable(file.fileno(), False)
        return file

    def set(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key`` atomically and durably."""
        path = self._path(key)
        parent = os.path.dirname(path)
        temp = f"{path}{_TEMP_MARK}{os.getpid()}-{secrets.token_hex(6)}"
        try:
            self._make_parents(parent)
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, _FILE_MODE)
            try:
                view = memoryview(data).cast("B")
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise DeterminateError(f"{self.uri}: cannot set key {key!r}: {exc}") from exc
        try:
            _fsync_dir(parent)
        except OSError as exc:
            raise IndeterminateError(
                f"{self.uri}: key {key!r} was replaced but the directory sync failed: {exc}"
            ) from exc

    def _make_parents(self, parent: str) -> None:
        """Create the directories between the root and ``parent``, each made
        durable by syncing the directory that holds it."""
        missing = []
        d = parent
        while d != self.root and not os.path.isdir(d):
            missing.append(d)
            d = os.path.dirname(d)
        for d in reversed(missing):
            with contextlib.suppress(FileExistsError):
                os.mkdir(d, _DIR_MODE)
            # also when another writer created it: its sync may not have happened yet
            _fsync_dir(os.path.dirname(d))

    def delete(self, key: str) -> None:
        """Remove ``key`` durably; no error if it is absent."""
        self._unlink(self._path(key), f"key {key!r}")

    def delete_temp(self, name: str) -> None:
        """Remove the temporary file ``name`` (as :meth:`list_temp` names it)
        durably; no error if it is absent. ``ValueError`` if ``name`` is not
        ``KEY~PID-HEX``."""
        key = _temp_key(name)
        if key is None:
            raise ValueError(f"{name!r} is not the name of a temporary file (KEY~PID-HEX)")
        self._unlink(self._path(key) + name[len(key) :], f"temporary file {name!r}")

    def _unlink(self, path: str, what: str) -> None:
        try:
            os.unlink(path)
        except OSError as exc:
            if exc.errno in _ABSENT:
                return
            raise DeterminateError(f"{self.uri}: cannot delete {what}: {exc}") from exc
        try:
            _fsync_dir(os.path.dirname(path))
        except OSError as exc:
            raise IndeterminateError(
                f"{self.uri}: {what} was removed but the directory sync failed: {exc}"
            ) from exc

    def list_meta(self, prefix: str = "") -> Iterator[BlobMeta]:
        """Every key starting with ``prefix``, with its size and mtime."""
        return self._list(prefix, BlobMeta, _is_key)

    def list(self, prefix: str = "") -> Iterator[str]:
        """Every key starting with ``prefix``."""
        return (m.key for m in self.list_meta(prefix))

    def list_temp(self, prefix: str = "") -> Iterator[TempMeta]:
        """Every temporary file left by a ``set`` of a key starting with
        ``prefix``, with its size and mtime (see :class:`~.contracts.LeavesTempFiles`)."""
        return self._list(prefix, TempMeta, lambda name: _temp_key(name) is not None)

    def _list(self, prefix: str, meta: type[_M], wanted: Callable[[str], bool]) -> Iterator[_M]:
        """``meta(name, size, mtime)`` of every file under ``prefix`` whose
        own name is ``wanted``, found through directories that are key segments."""
        check_prefix(prefix)
        if prefix.startswith("/") or "//" in prefix:  # check_prefix lets "/", "a//" pass
            return
        head, _, name_prefix = prefix.rpartition("/")
        start = os.path.join(self.root, *head.split("/")) if head else self.root
        key_base = f"{head}/" if head else ""
        try:
            yield from self._walk(start, key_base, name_prefix, meta, wanted)
        except OSError as exc:
            raise DeterminateError(f"{self.uri}: cannot list prefix {prefix!r}: {exc}") from exc

    def _walk(
        self,
        directory: str,
        key_base: str,
        name_prefix: str,
        meta: type[_M],
        wanted: Callable[[str], bool],
    ) -> Iterator[_M]:
        try:
            entries = list(os.scandir(directory))
        except OSError as exc:
            if exc.errno in _ABSENT:  # never created, or removed while listing
                return
            raise
        for entry in entries:
            name = entry.name
            if not name.startswith(name_prefix):
                continue
            try:
                if entry.is_dir(follow_symlinks=False):
                    if _is_key(name):
                        yield from self._walk(entry.path, f"{key_base}{name}/", "", meta, wanted)
                elif entry.is_file(follow_symlinks=False) and wanted(name):
                    st = entry.stat(follow_symlinks=False)
                    yield meta(f"{key_base}{name}", st.st_size, st.st_mtime)
            except FileNotFoundError:  # deleted while listing
                continue

    def close(self) -> None:
        """Nothing to release; idempotent."""
