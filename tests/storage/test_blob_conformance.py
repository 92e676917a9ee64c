"""The ``Blob`` contract, run against every backend; plus each backend's URI errors.

``memory`` and ``file`` run everywhere; ``s3`` runs against the real SeaweedFS
server of the ``s3_server`` fixture, with a fresh bucket per test.
"""

from __future__ import annotations

import hashlib
import os
import random
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardsink._address import free_port
from shardsink.storage import Blob, DeterminateError, IndeterminateError, open_blob
from shardsink.storage.contracts import LeavesTempFiles
from shardsink.storage.file import FileBlob
from shardsink.storage.s3 import write_failure_is_determinate
from shardsink.testing.s3 import S3Server

MiB = 1024 * 1024

ALL_BACKENDS = [
    pytest.param("memory", id="memory"),
    pytest.param("file", id="file"),
    pytest.param("s3", id="s3", marks=pytest.mark.s3),
]
# The kill test needs a store shared across processes; memory:// lives and dies
# with the test process itself, so it is not among these.
CROSS_PROCESS_BACKENDS = [p for p in ALL_BACKENDS if p.values[0] != "memory"]


def _payload(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def _digest(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


def _uri_for(request, kind: str, tmp_path) -> str:
    if kind == "memory":
        return f"memory://conformance-{uuid.uuid4().hex}"
    if kind == "file":
        return f"file://{tmp_path}/blobs"
    server = request.getfixturevalue("s3_server")
    return server.blob_uri(server.new_bucket(), "store")


@pytest.fixture(params=ALL_BACKENDS)
def blob_uri(request, tmp_path) -> str:
    return _uri_for(request, request.param, tmp_path)


@pytest.fixture(params=CROSS_PROCESS_BACKENDS)
def shared_blob_uri(request, tmp_path) -> str:
    return _uri_for(request, request.param, tmp_path)


@pytest.fixture
def blob(blob_uri):
    store = open_blob(blob_uri)
    yield store
    store.close()


def test_backend_satisfies_protocol(blob):
    assert isinstance(blob, Blob)
    assert isinstance(blob.uri, str) and blob.uri


def test_get_missing_is_none(blob):
    assert blob.get("missing") is None
    assert blob.get("no/such/nested/key") is None


@pytest.mark.parametrize("size", [0, 1, 4096, 8 * MiB, 11 * MiB], ids=lambda n: f"{n}B")
def test_round_trip(blob, size):
    data = _payload(size, size)
    blob.set("rt/value", data)
    got = blob.get("rt/value")
    assert got is not None and len(got) == size
    assert got == data


def test_set_accepts_buffer_types(blob):
    blob.set("buf/ba", bytearray(b"abc"))
    blob.set("buf/mv", memoryview(b"xyz"))
    assert blob.get("buf/ba") == b"abc"
    assert blob.get("buf/mv") == b"xyz"


def test_overwrite_replaces_whole_value(blob):
    blob.set("ow", b"a" * 5000)
    blob.set("ow", b"short")
    assert blob.get("ow") == b"short"
    blob.set("ow", b"")
    assert blob.get("ow") == b""
    blob.set("ow", b"longer again")
    assert blob.get("ow") == b"longer again"
    assert list(blob.list("ow")) == ["ow"]


def test_delete_is_idempotent(blob):
    blob.set("del/x", b"1")
    blob.set("del/y", b"2")
    blob.delete("del/x")
    blob.delete("del/x")
    blob.delete("del/never-set")
    blob.delete("never/set/anywhere")
    assert blob.get("del/x") is None
    assert blob.get("del/y") == b"2"
    assert sorted(blob.list("del/")) == ["del/y"]
    blob.set("del/x", b"again")
    assert blob.get("del/x") == b"again"


def test_list_by_prefix(blob):
    keys = ["a/b/c", "a/b/d", "a/bc/e", "a/bd", "ab/x", "b", "a/b/c.d=e-f_g"]
    for k in keys:
        blob.set(k, k.encode())
    assert sorted(blob.list()) == sorted(keys)
    assert sorted(blob.list("")) == sorted(keys)
    assert sorted(blob.list("a/b/")) == ["a/b/c", "a/b/c.d=e-f_g", "a/b/d"]
    # a prefix is a string prefix, not a path: it may end inside a segment
    assert sorted(blob.list("a/b")) == ["a/b/c", "a/b/c.d=e-f_g", "a/b/d", "a/bc/e", "a/bd"]
    assert sorted(blob.list("a/bc")) == ["a/bc/e"]
    assert sorted(blob.list("a/b/c")) == ["a/b/c", "a/b/c.d=e-f_g"]
    # no over-match into sibling prefixes
    assert sorted(blob.list("a/")) == sorted(k for k in keys if k.startswith("a/"))
    assert sorted(blob.list("a")) == sorted(k for k in keys if k.startswith("a"))
    assert list(blob.list("ab/")) == ["ab/x"]
    assert list(blob.list("b")) == ["b"]
    assert list(blob.list("c")) == []
    assert list(blob.list("zz/top/")) == []


def test_list_meta_reports_sizes_and_mtimes(blob):
    sizes = {"m/empty": 0, "m/one": 1, "m/kib": 1024, "m/deep/er/key": 77}
    before = time.time()
    for key, size in sizes.items():
        blob.set(key, b"x" * size)
    metas = {m.key: m for m in blob.list_meta("m/")}
    assert {k: m.size for k, m in metas.items()} == sizes
    for m in metas.values():
        # S3 reports whole seconds; allow a little clock skew either way
        assert before - 5 <= m.modified <= time.time() + 5


def test_stat_and_open_input_of_a_missing_key_are_none_at_once(blob):
    """A missing key, a nested one under no key, and a key that is only a
    prefix of another: ``None`` from both, without waiting or retrying."""
    blob.set("pre/fix", b"x")
    started = time.monotonic()
    for key in ("missing", "no/such/nested/key", "pre", "pre/fix/under"):
        assert blob.stat(key) is None, key
        assert blob.open_input(key) is None, key
    assert time.monotonic() - started < 5


def test_stat_gives_size_and_mtime_as_list_meta_does(blob):
    sizes = {"st/empty": 0, "st/one": 1, "st/kib": 1024, "st/deep/er/key": 77}
    before = time.time()
    for key, size in sizes.items():
        blob.set(key, b"x" * size)
    listed = {m.key: m for m in blob.list_meta("st/")}
    for key, size in sizes.items():
        meta = blob.stat(key)
        assert meta is not None and (meta.key, meta.size) == (key, size)
        # S3 reports whole seconds; allow a little clock skew either way
        assert before - 5 <= meta.modified <= time.time() + 5
        assert abs(meta.modified - listed[key].modified) <= 1
    blob.set("st/one", b"longer")
    assert blob.stat("st/one").size == 6
    blob.delete("st/one")
    assert blob.stat("st/one") is None


@pytest.mark.parametrize("size", [0, 1, 4096, 11 * MiB], ids=lambda n: f"{n}B")
def test_open_input_reads_any_range(blob, size):
    data = _payload(size, size)
    blob.set("oi/value", data)
    file = blob.open_input("oi/value")
    assert file is not None
    with file:
        assert file.size() == size
        assert file.read_at(size, 0) == data
        rng = random.Random(size)
        for _ in range(20):
            start = rng.randrange(size + 1)
            length = rng.randrange(size - start + 1)
            assert file.read_at(length, start) == data[start : start + length]
        file.seek(size // 2)
        assert file.read() == data[size // 2 :]
    assert file.closed


def test_a_parquet_file_reads_a_row_group_at_a_time_through_open_input(blob):
    table = pa.table({"key": pa.array(range(100_000), pa.int64())})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=10_000)
    blob.set("oi/part.parquet", sink.getvalue().to_pybytes())
    with blob.open_input("oi/part.parquet") as file:
        parquet = pq.ParquetFile(file)
        assert parquet.metadata.num_row_groups == 10
        assert parquet.read_row_group(7).equals(table.slice(70_000, 10_000))
        assert pa.Table.from_batches(list(parquet.iter_batches(batch_size=4096))).equals(table)


def test_an_open_input_reads_the_value_it_opened_or_fails(blob_uri, blob):
    """``file://`` and ``memory://`` keep the opened value after a delete or a
    replacement; on S3 reads are ranged GETs: after a delete they fail."""
    old = _payload(1, 256 * 1024)
    blob.set("oi/k", old)
    replaced, deleted = blob.open_input("oi/k"), blob.open_input("oi/k")
    blob.set("oi/k", _payload(2, 256 * 1024))
    with replaced:
        if not blob_uri.startswith("s3://"):
            assert replaced.read_at(len(old), 0) == old
    blob.delete("oi/k")
    with deleted:
        if blob_uri.startswith("s3://"):
            with pytest.raises(OSError):
                deleted.read_at(len(old), 0)
        else:
            assert deleted.read_at(len(old), 0) == old
    assert blob.open_input("oi/k") is None


BAD_KEYS = ["", "/a", "a/", "a//b", "..", ".", "a/../b", "a/./b", "a b", "ä", "a\\b", "a\x00"]


@pytest.mark.parametrize("key", BAD_KEYS, ids=repr)
def test_invalid_keys_raise_value_error(blob, key):
    with pytest.raises(ValueError, match="invalid blob key"):
        blob.get(key)
    with pytest.raises(ValueError, match="invalid blob key"):
        blob.set(key, b"x")
    with pytest.raises(ValueError, match="invalid blob key"):
        blob.delete(key)
    with pytest.raises(ValueError, match="invalid blob key"):
        blob.stat(key)
    with pytest.raises(ValueError, match="invalid blob key"):
        blob.open_input(key)


@pytest.mark.parametrize("prefix", ["a//", "/", "//"], ids=repr)
def test_prefix_with_empty_segment_matches_nothing(blob, prefix):
    """``check_prefix`` accepts these (only trailing slashes), yet no key starts so."""
    blob.set("a/b", b"1")
    assert list(blob.list(prefix)) == []


@pytest.mark.parametrize("prefix", ["/a", "../x", "a b/", "a//b"], ids=repr)
def test_invalid_prefixes_raise_value_error(blob, prefix):
    with pytest.raises(ValueError, match="invalid blob key"):
        list(blob.list(prefix))


def test_close_is_idempotent(blob_uri):
    store = open_blob(blob_uri)
    store.set("c", b"1")
    store.close()
    store.close()
    reopened = open_blob(blob_uri)
    assert reopened.get("c") == b"1"
    reopened.close()


def test_concurrent_get_sees_whole_values(blob):
    """A reader racing an overwriting writer sees only whole values. Every value
    written is distinct and sizes vary, so a torn or mixed read would show; a
    read may also fail with ``DeterminateError`` (the contract allows it), but
    most must succeed."""
    sizes = [64 * 1024, 1 * MiB, 256 * 1024, 2 * MiB]
    blob.set("race", _payload(0, sizes[0]))
    written = {_digest(_payload(0, sizes[0]))}
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            i = 1
            while not stop.is_set():
                value = _payload(i, sizes[i % len(sizes)])
                written.add(_digest(value))
                blob.set("race", value)
                i += 1
                stop.wait(0.005)  # paced, so that reads come between writes
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=writer)
    thread.start()
    reads = failed = 0
    try:
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            try:
                got = blob.get("race")
            except DeterminateError:
                failed += 1
                continue
            assert _digest(got) in written
            reads += 1
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert not errors, errors
    assert reads >= 5 * failed and reads > 0, (reads, failed)


_KILL_CHILD = textwrap.dedent(
    """
    import os, random, sys
    from shardsink.storage import open_blob

    uri, key, parent, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    values = [random.Random(seed).randbytes(size) for seed in (101, 102)]
    blob = open_blob(uri)
    print("ready", flush=True)
    i = 0
    while os.getppid() == parent:  # never outlive the test process
        blob.set(key, values[i % 2])
        i += 1
        print("done", flush=True)
    """
)


def _wait_for_line(proc: subprocess.Popen, timeout_s: float) -> str:
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    if not ready:
        raise AssertionError(f"writer process gave no sign of life within {timeout_s} s")
    return proc.stdout.readline().strip()


def test_set_is_atomic_under_sigkill(shared_blob_uri):
    """A writer SIGKILLed at random moments while it keeps replacing a 32 MiB
    value leaves, whole (checked by content hash), either the last value it
    reported stored or the one it was storing: never a partial value, never an
    older one."""
    size = 32 * MiB
    key = "atomic/value"
    old = _payload(100, size)
    new = [_digest(_payload(101, size)), _digest(_payload(102, size))]
    store = open_blob(shared_blob_uri)
    try:
        started = time.monotonic()
        store.set(key, old)
        write_s = time.monotonic() - started
        last = _digest(old)
        rng = random.Random(20240611)
        swept = 0
        for _ in range(5):
            argv = [sys.executable, "-c", _KILL_CHILD, shared_blob_uri, key, str(os.getpid())]
            proc = subprocess.Popen([*argv, str(size)], stdout=subprocess.PIPE, text=True)
            try:
                assert _wait_for_line(proc, 60) == "ready"
                time.sleep(rng.uniform(0, 2 * write_s))  # a random moment of its writes
            finally:
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=30)
                done = proc.stdout.read().split().count("done")
                proc.stdout.close()
            assert proc.returncode == -signal.SIGKILL
            got = store.get(key)
            assert got is not None and len(got) == size
            acked = new[(done - 1) % 2] if done else last
            assert _digest(got) in (acked, new[done % 2])
            last = _digest(got)
            if isinstance(store, FileBlob):
                temps = list(store.list_temp())
                assert all(t.name.startswith(f"{key}~{proc.pid}-") for t in temps)
                for temp in temps:
                    store.delete_temp(temp.name)
                swept += len(temps)
        if isinstance(store, FileBlob):
            # a killed writer leaves its temp file: proof that kills landed mid-write
            assert swept > 0
            assert not [n for _, _, files in os.walk(store.root) for n in files if "~" in n]
    finally:
        store.close()


# ---- file backend specifics -------------------------------------------------


def test_file_temp_files_are_listed_apart_and_deleted_by_name(tmp_path):
    store = open_blob(f"file://{tmp_path}/blobs")
    assert isinstance(store, LeavesTempFiles)
    store.set("d/k", b"v")
    (tmp_path / "blobs" / "d" / "k~123-abcdef").write_bytes(b"partial")
    (tmp_path / "blobs" / "top~9-0").write_bytes(b"partial!")
    (tmp_path / "blobs" / "d" / "odd~name").write_bytes(b"not a set's")
    assert sorted(store.list()) == ["d/k"]
    temps = {t.name: t for t in store.list_temp()}
    assert sorted(temps) == ["d/k~123-abcdef", "top~9-0"]
    assert temps["top~9-0"].size == 8 and abs(temps["top~9-0"].modified - time.time()) < 60
    assert [t.name for t in store.list_temp("d/")] == ["d/k~123-abcdef"]
    assert [t.name for t in store.list_temp("to")] == ["top~9-0"]
    assert list(store.list_temp("d/x")) == []
    for bad in ("d/k", "d/odd~name", "../k~1-a", "d/k~1-a/../../x"):
        with pytest.raises(ValueError, match="not the name of a temporary file"):
            store.delete_temp(bad)
    store.delete_temp("d/k~123-abcdef")
    store.delete_temp("d/k~123-abcdef")  # idempotent
    assert [t.name for t in store.list_temp()] == ["top~9-0"]
    assert store.get("d/k") == b"v"
    store.close()


def test_file_creates_missing_root_but_not_its_parents(tmp_path):
    store = open_blob(f"file://{tmp_path}/new-root")
    assert (tmp_path / "new-root").is_dir()
    store.close()
    missing = tmp_path / "no-such-parent" / "root"
    with pytest.raises(DeterminateError, match=str(missing)):
        open_blob(f"file://{missing}")
    assert not (tmp_path / "no-such-parent").exists()


def test_file_root_that_is_a_regular_file(tmp_path):
    target = tmp_path / "plain-file"
    target.write_bytes(b"")
    with pytest.raises(DeterminateError, match=f"{target}.*not a directory"):
        open_blob(f"file://{target}")


@pytest.mark.parametrize(
    "uri",
    [
        "file://relative/dir",
        "file:relative",
        "file:///tmp/../etc",
        "file:///tmp/./x",
        "file:///tmp/x?mode=fast",
        "file:///tmp/x#frag",
    ],
)
def test_file_bad_uris(uri):
    with pytest.raises(ValueError) as info:
        open_blob(uri)
    assert uri in str(info.value)


# ---- s3 backend specifics ---------------------------------------------------

_CREDS = "access_key=k&secret_key=s3cr3t-value"


@pytest.mark.parametrize(
    ("uri", "why"),
    [
        (f"s3:///prefix?endpoint=http://127.0.0.1:9&{_CREDS}", "missing bucket"),
        (f"s3://?endpoint=http://127.0.0.1:9&{_CREDS}", "missing bucket"),
        (f"s3://Bad_Bucket?endpoint=http://127.0.0.1:9&{_CREDS}", "invalid bucket name"),
        (f"s3://bucket/p?{_CREDS}", "missing endpoint"),
        (f"s3://bucket?endpoint=ftp://127.0.0.1:9&{_CREDS}", "http:// or https://"),
        (f"s3://bucket?endpoint=127.0.0.1:9&{_CREDS}", "http:// or https://"),
        (f"s3://bucket?endpoint=http://127.0.0.1&{_CREDS}", "host:port"),
        (f"s3://bucket?endpoint=http://127.0.0.1:9/path&{_CREDS}", "host:port"),
        (f"s3://bucket?endpoint=http://127.0.0.1:9&colour=blue&{_CREDS}", "colour"),
        (f"s3://bucket?endpoint=http://h:9&endpoint=http://g:9&{_CREDS}", "repeated"),
        (f"s3://bucket/a//b?endpoint=http://127.0.0.1:9&{_CREDS}", "invalid key prefix"),
        ("ftp://x", "unsupported scheme"),
    ],
)
def test_s3_bad_uris(uri, why):
    with pytest.raises(ValueError, match=why) as info:
        open_blob(uri)
    message = str(info.value)
    assert "s3cr3t-value" not in message
    assert uri.replace("s3cr3t-value", "***") in message


def test_s3_missing_credentials(monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    uri = "s3://bucket?endpoint=http://127.0.0.1:9"
    with pytest.raises(ValueError, match="missing credentials") as info:
        open_blob(uri)
    assert uri in str(info.value)


def test_s3_refused_connection_is_determinate_and_fast():
    """Nothing listens on the port, so no request reached a server: determinate."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    with pytest.raises(DeterminateError, match=endpoint):
        open_blob(f"s3://bucket?endpoint={endpoint}&{_CREDS}")
    assert time.monotonic() - started < 10


@pytest.mark.s3
def test_s3_missing_bucket_is_determinate(s3_server):
    uri = s3_server.blob_uri("no-such-bucket-here")
    with pytest.raises(DeterminateError, match="'no-such-bucket-here' does not exist"):
        open_blob(uri)


@pytest.mark.s3
def test_s3_wrong_secret_is_determinate(s3_server):
    uri = s3_server.blob_uri(s3_server.new_bucket()).replace(s3_server.secret_key, "wrong")
    with pytest.raises(DeterminateError, match=s3_server.endpoint):
        open_blob(uri)


@pytest.mark.s3
def test_s3_sibling_prefixes_are_separate(s3_server):
    bucket = s3_server.new_bucket()
    a = open_blob(s3_server.blob_uri(bucket, "shard"))
    b = open_blob(s3_server.blob_uri(bucket, "shard2"))
    whole = open_blob(s3_server.blob_uri(bucket))
    try:
        a.set("k", b"a")
        b.set("k", b"b")
        assert list(a.list()) == ["k"]
        assert list(b.list()) == ["k"]
        assert a.get("k") == b"a"
        assert sorted(whole.list()) == ["shard/k", "shard2/k"]
    finally:
        for store in (a, b, whole):
            store.close()


@pytest.mark.s3
def test_s3_errors_once_the_server_is_gone(s3_server, tmp_path):
    """With the endpoint down, a set is determinate (the connection was refused,
    nothing was sent), reads are determinate, a delete is indeterminate; all fail
    fast and name the endpoint."""
    server = S3Server(tmp_path / "own-s3").start()
    try:
        store = open_blob(server.blob_uri(server.new_bucket()))
        store.set("k", b"v")
    finally:
        server.stop()
    started = time.monotonic()
    with pytest.raises(DeterminateError, match=server.endpoint):
        store.set("k", b"new")
    with pytest.raises(DeterminateError, match=server.endpoint):
        store.set("big", b"x" * (11 * MiB))
    with pytest.raises(DeterminateError, match=server.endpoint):
        store.get("k")
    with pytest.raises(DeterminateError, match=server.endpoint):
        store.stat("k")
    with pytest.raises(DeterminateError, match=server.endpoint):
        store.open_input("k")
    with pytest.raises(DeterminateError, match=server.endpoint):
        list(store.list())
    with pytest.raises(IndeterminateError, match=server.endpoint):
        store.delete("k")
    assert time.monotonic() - started < 15
    store.close()
    with pytest.raises(DeterminateError, match="closed"):
        store.get("k")
    with pytest.raises(DeterminateError, match="closed"):
        store.open_input("k")


@pytest.mark.parametrize(
    ("message", "determinate"),
    [
        (
            "When uploading object with key 'k' in bucket 'b': AWS Error NETWORK_CONNECTION "
            "during PutObject operation: curlCode: 7, Could not connect to server",
            True,
        ),
        (
            "AWS Error NETWORK_CONNECTION during HeadBucket operation: curlCode: 6, "
            "Could not resolve hostname",
            True,
        ),
        (
            "When initiating multiple part upload for key 'x' in bucket 'b': AWS Error "
            "NO_SUCH_BUCKET during CreateMultipartUpload operation: bucket does not exist",
            True,
        ),
        ("AWS Error SIGNATURE_DOES_NOT_MATCH during PutObject operation", True),
        ("AWS Error UNKNOWN (HTTP status 400) during PutObject operation", True),
        ("AWS Error NETWORK_CONNECTION during PutObject: curlCode: 28, Timeout was reached", False),
        ("AWS Error NETWORK_CONNECTION during UploadPart: curlCode: 56, Failure receiving", False),
        ("AWS Error UNKNOWN (HTTP status 408) during PutObject operation", False),
        ("AWS Error SLOW_DOWN (HTTP status 503) during CompleteMultipartUpload operation", False),
    ],
)
def test_s3_write_error_kinds(message, determinate):
    """Only failures that prove the request did not take effect are determinate."""
    assert write_failure_is_determinate(message) is determinate
