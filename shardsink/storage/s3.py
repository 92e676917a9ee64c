"""``Blob`` on an S3-protocol object store, through ``pyarrow.fs.S3FileSystem``.

URI: ``s3://bucket[/prefix]?endpoint=http://HOST:PORT[&region=R][&access_key=A&secret_key=S]``.
Keys live under ``prefix/`` in the bucket. Credentials come from the URI or from
``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``; nothing else is consulted (no
``~/.aws``, no instance metadata), so opening never stalls on a credential probe.

Atomicity of ``set``: S3 makes an object visible only when its PUT (or the
completion of its multipart upload) succeeds, so a writer that dies mid-upload
leaves the old value. On the client side, pyarrow's output stream *completes*
the upload when it is closed or destroyed, even after a failed write; a failure
inside ``write`` after parts were sent could thus publish a truncated object.
Two write clients avoid that window for the failures that happen in practice:

- values below pyarrow's multipart threshold go through a client with
  ``allow_delayed_open``: ``write`` only buffers, ``close`` sends one PUT;
- larger values go through a client that creates the multipart upload when the
  stream is opened and uploads parts in the background, so a failed request
  surfaces in ``close`` and the upload is never completed.

What remains is an allocation failure inside ``write`` (out of memory).

Error kinds: the write clients make a single attempt per request (the SDK's
retries would hide an earlier attempt that timed out after taking effect), so
the error of that one attempt decides: no connection made, or rejected by the
server (4xx), is determinate; anything else is indeterminate. ``delete`` is a
HEAD, a DELETE and possibly a directory-marker PUT inside pyarrow, so any
failure of it is indeterminate (retrying a delete is always safe). Reads use a
separate client that retries, and their failures are determinate.

Atomicity of ``get``: pyarrow reads with a HEAD then a ranged GET sized by it,
which can return a prefix of a value that replaced the key in between. ``get``
therefore re-checks ETag and size after reading and retries if they changed.
This cannot see a key overwritten twice within one read, back to the very
value it held at the first HEAD (same ETag); shardsink writes each key once.
``open_input`` is that HEAD alone, and each read of the file it returns one
ranged GET: nothing re-checks them, so it is for keys written once (see
:class:`~.contracts.Blob`). ``stat`` is the HEAD alone too.

pyarrow registers ``ensure_s3_finalized`` with ``atexit`` itself; ``close`` drops
this object's clients so none outlives that finalization.
"""

from __future__ import annotations

import os
import random
import re
import time
from collections.abc import Iterator
from datetime import datetime
from urllib.parse import parse_qs, quote, urlencode, urlsplit

import pyarrow as pa
from pyarrow import fs as pafs

from .contracts import BlobMeta, check_key, check_prefix
from .errors import DeterminateError, IndeterminateError
from .uri import bad_uri

_QUERY_PARAMS = ("endpoint", "region", "access_key", "secret_key")
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_IPV4_RE = re.compile(r"^\d+\.\d+\.\d+\.\d+$")
# pyarrow sends a value of up to this many bytes as one PUT (kMultiPartUploadThresholdSize).
_SINGLE_PUT_MAX = 10 * 1024 * 1024 - 1
_CONNECT_TIMEOUT_S = 3.0
_REQUEST_TIMEOUT_S = 30.0
_GET_ATTEMPTS = 5
# Errors of a single attempt that provably did not take effect: no connection
# was made (curl 6: unknown host, 7: refused) or the server rejected the
# request (4xx, except 408 request timeout).
_NOT_PERFORMED = re.compile(
    r"curlCode: (6|7),|NO_SUCH_BUCKET|ACCESS_DENIED|SIGNATURE_DOES_NOT_MATCH|"
    r"INVALID_ACCESS_KEY_ID|INVALID_BUCKET_NAME|HTTP status 4(0[0-7]|09|[1-9]\d)"
)


def write_failure_is_determinate(message: str) -> bool:
    """Whether a failed single-attempt write, given pyarrow's error text, surely
    did not take effect."""
    return _NOT_PERFORMED.search(message) is not None


def _is_key(key: str) -> bool:
    try:
        check_key(key)
    except ValueError:
        return False
    return True


class S3Blob:
    """A ``Blob`` stored as objects of one bucket, under an optional key prefix.

    Errors: ``ValueError`` for an invalid key; :class:`DeterminateError` for a
    failed read and for a ``set`` the server rejected or never received
    (refused connection, missing bucket, bad credentials);
    :class:`IndeterminateError` for a ``set`` that may have reached the server
    (timeout, connection lost, server error) and for any failed ``delete``.

    ``uri`` names the bucket, prefix, endpoint and region but not the credentials.
    """

    def __init__(
        self,
        *,
        bucket: str,
        prefix: str,
        endpoint: str,
        region: str,
        access_key: str,
        secret_key: str,
    ) -> None:
        """Connect to ``endpoint`` (``http(s)://host:port``) and check that ``bucket``
        exists; raises :class:`DeterminateError` naming the endpoint or bucket if not."""
        self.bucket = bucket
        self.prefix = prefix
        self.endpoint = endpoint
        query = {"endpoint": endpoint, "region": region}
        path = f"/{quote(prefix)}" if prefix else ""
        self.uri = f"s3://{bucket}{path}?{urlencode(query, safe=':/')}"
        scheme, _, host_port = endpoint.partition("://")
        common = dict(
            access_key=access_key,
            secret_key=secret_key,
            region=region,
            scheme=scheme,
            endpoint_override=host_port,
            connect_timeout=_CONNECT_TIMEOUT_S,
            request_timeout=_REQUEST_TIMEOUT_S,
        )
        retry = pafs.AwsStandardS3RetryStrategy
        self._reader: pafs.S3FileSystem | None = pafs.S3FileSystem(
            retry_strategy=retry(max_attempts=3), **common
        )
        self._small: pafs.S3FileSystem | None = pafs.S3FileSystem(
            allow_delayed_open=True, retry_strategy=retry(max_attempts=1), **common
        )
        self._large: pafs.S3FileSystem | None = pafs.S3FileSystem(
            allow_delayed_open=False, retry_strategy=retry(max_attempts=1), **common
        )
        try:
            info = self._reader.get_file_info(bucket)
        except OSError as exc:
            self.close()
            raise DeterminateError(
                f"{self.uri}: cannot check bucket {bucket!r} at S3 endpoint {endpoint}: {exc}"
            ) from exc
        if info.type != pafs.FileType.Directory:
            self.close()
            raise DeterminateError(
                f"{self.uri}: bucket {bucket!r} does not exist at S3 endpoint {endpoint}"
            )

    @classmethod
    def from_uri(cls, uri: str) -> S3Blob:
        """Open ``s3://bucket[/prefix]?endpoint=http(s)://host:port[&region=..]
        [&access_key=..&secret_key=..]``.

        Raises ``ValueError`` (naming the URI, with any secret masked) for a
        missing or invalid bucket, prefix or endpoint, an unknown or repeated
        query parameter, or missing credentials; :class:`DeterminateError` if
        the endpoint cannot be reached or the bucket does not exist.
        """
        parts = urlsplit(uri)
        bucket = parts.netloc
        if not bucket:
            raise bad_uri(uri, "blob", "missing bucket name (s3://bucket/...)")
        if not _BUCKET_RE.match(bucket) or ".." in bucket or _IPV4_RE.match(bucket):
            raise bad_uri(
                uri,
                "blob",
                f"invalid bucket name {bucket!r}: 3-63 characters of a-z, 0-9, '.', '-', "
                "starting and ending with a letter or digit",
            )
        if parts.fragment:
            raise bad_uri(uri, "blob", "s3 URIs take no fragment")
        prefix = parts.path.strip("/")
        if prefix:
            try:
                check_key(prefix)
            except ValueError:
                raise bad_uri(
                    uri, "blob", f"invalid key prefix {prefix!r} (same rules as blob keys)"
                ) from None
            prefix += "/"
        params = parse_qs(parts.query, keep_blank_values=True)
        unknown = sorted(set(params) - set(_QUERY_PARAMS))
        if unknown:
            raise bad_uri(
                uri,
                "blob",
                f"unknown query parameter(s) {', '.join(unknown)} "
                f"(accepted: {', '.join(_QUERY_PARAMS)})",
            )
        repeated = sorted(k for k, v in params.items() if len(v) > 1)
        if repeated:
            raise bad_uri(uri, "blob", f"repeated query parameter(s) {', '.join(repeated)}")
        one = {k: v[0] for k, v in params.items()}
        endpoint = cls._check_endpoint(uri, one.get("endpoint", ""))
        access_key = one.get("access_key") or os.environ.get("AWS_ACCESS_KEY_ID", "")
        secret_key = one.get("secret_key") or os.environ.get("AWS_SECRET_ACCESS_KEY", "")
        if not access_key or not secret_key:
            raise bad_uri(
                uri,
                "blob",
                "missing credentials: give access_key and secret_key in the URI or set "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
            )
        return cls(
            bucket=bucket,
            prefix=prefix,
            endpoint=endpoint,
            region=one.get("region") or "us-east-1",
            access_key=access_key,
            secret_key=secret_key,
        )

    @staticmethod
    def _check_endpoint(uri: str, endpoint: str) -> str:
        if not endpoint:
            raise bad_uri(uri, "blob", "missing endpoint=http(s)://host:port")
        ep = urlsplit(endpoint)
        if ep.scheme not in ("http", "https"):
            raise bad_uri(uri, "blob", f"endpoint {endpoint!r} must start with http:// or https://")
        try:
            port = ep.port
        except ValueError:
            port = None
        if not ep.hostname or port is None or ep.path not in ("", "/") or ep.query:
            raise bad_uri(
                uri, "blob", f"endpoint {endpoint!r} must be exactly {ep.scheme}://host:port"
            )
        return f"{ep.scheme}://{ep.netloc}"

    def _client(self, name: str) -> pafs.S3FileSystem:
        fs = getattr(self, name)
        if fs is None:
            raise DeterminateError(f"{self.uri}: blob store is closed")
        return fs

    def _path(self, key: str) -> str:
        return f"{self.bucket}/{self.prefix}{check_key(key)}"

    def get(self, key: str) -> bytes | None:
        """The value under ``key``, or ``None``."""
        path = self._path(key)
        fs = self._client("_reader")
        try:
            for attempt in range(_GET_ATTEMPTS):
                with fs.open_input_file(path) as f:
                    etag = f.metadata().get("ETag")
                    data = f.read()
                with fs.open_input_file(path) as f:
                    if f.metadata().get("ETag") == etag and f.size() == len(data):
                        return data
                time.sleep(random.uniform(0, 0.01 * 2**attempt))
        except FileNotFoundError:
            return None
        except OSError as exc:
            if "NO_SUCH_KEY" in str(exc):  # deleted between the HEAD and the GET
                return None
            raise DeterminateError(
                f"{self.uri}: cannot read key {key!r} at {self.endpoint}: {exc}"
            ) from exc
        raise DeterminateError(
            f"{self.uri}: key {key!r} was replaced during each of {_GET_ATTEMPTS} reads"
        )

    def open_input(self, key: str) -> pa.NativeFile | None:
        """``key``'s object as a random-access file whose reads are ranged
        GETs (one HEAD to open it), or ``None`` if there is none."""
        path = self._path(key)
        try:
            return self._client("_reader").open_input_file(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise DeterminateError(
                f"{self.uri}: cannot open key {key!r} at {self.endpoint}: {exc}"
            ) from exc

    def stat(self, key: str) -> BlobMeta | None:
        """``key``'s size and Last-Modified (whole seconds) from one HEAD, or
        ``None`` if there is none."""
        file = self.open_input(key)
        if file is None:
            return None
        with file:
            size, modified = file.size(), file.metadata().get("Last-Modified")
        if modified is not None:
            return BlobMeta(key, size, datetime.fromisoformat(modified.decode()).timestamp())
        # a server that sends no Last-Modified on a HEAD: the listing's mtime
        try:
            info = self._client("_reader").get_file_info(self._path(key))
        except OSError as exc:
            raise DeterminateError(
                f"{self.uri}: cannot stat key {key!r} at {self.endpoint}: {exc}"
            ) from exc
        if info.type != pafs.FileType.File:
            return None
        return BlobMeta(key, info.size, info.mtime.timestamp())

    def set(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key``; the object appears whole or not at all."""
        path = self._path(key)
        fs = self._client("_large" if len(data) > _SINGLE_PUT_MAX else "_small")
        try:
            stream = fs.open_output_stream(path)
            stream.write(data)
            stream.close()
        except OSError as exc:
            msg = f"{self.uri}: cannot set key {key!r} at {self.endpoint}: {exc}"
            if write_failure_is_determinate(str(exc)):
                raise DeterminateError(msg) from exc
            raise IndeterminateError(f"{msg} (outcome unknown)") from exc

    def delete(self, key: str) -> None:
        """Remove ``key``; no error if it is absent."""
        path = self._path(key)
        try:
            self._client("_small").delete_file(path)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise IndeterminateError(
                f"{self.uri}: cannot delete key {key!r} at {self.endpoint} (outcome unknown): {exc}"
            ) from exc

    def list_meta(self, prefix: str = "") -> Iterator[BlobMeta]:
        """Every key starting with ``prefix``, with its size and mtime (S3's
        Last-Modified, whole seconds)."""
        check_prefix(prefix)
        full = self.prefix + prefix
        base = f"{self.bucket}/{full.rpartition('/')[0]}".rstrip("/")
        selector = pafs.FileSelector(base, recursive=True, allow_not_found=True)
        try:
            infos = self._client("_reader").get_file_info(selector)
        except OSError as exc:
            raise DeterminateError(
                f"{self.uri}: cannot list prefix {prefix!r} at {self.endpoint}: {exc}"
            ) from exc
        strip = len(self.bucket) + 1 + len(self.prefix)
        want = f"{self.bucket}/{full}"
        for info in infos:
            if info.type != pafs.FileType.File or not info.path.startswith(want):
                continue
            key = info.path[strip:]
            if _is_key(key):  # objects written by other tools may not be valid keys
                yield BlobMeta(key, info.size, info.mtime.timestamp())

    def list(self, prefix: str = "") -> Iterator[str]:
        """Every key starting with ``prefix``."""
        return (m.key for m in self.list_meta(prefix))

    def close(self) -> None:
        """Drop the clients; idempotent. Later calls raise :class:`DeterminateError`."""
        self._reader = self._small = self._large = None
