"""Suite-wide fixtures: leak checks after every test, and real services.

Every test is followed by a check that it left no process and no
``/dev/shm`` segment of shardsink behind. A process counts as the test's if
it descends from the test run or carries the test's mark in its environment
(``SHARDSINK_TEST_MARK``, set for each test and inherited by everything it
starts), so a grandchild orphaned by a dead ``shardsink up`` is still seen.
Servers started by session fixtures (and their descendants) are registered
in ``_SERVICE_PIDS`` and exempt.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

import psutil
import pytest

from shardsink.process import marked
from tests.helpers.wait import wait_until

SHM_DIR = Path("/dev/shm")
MARK = "SHARDSINK_TEST_MARK"
SHM_PREFIX = "shardsink"
_SERVICE_PIDS: set[int] = set()
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


#: What libfaketime leaves in /dev/shm per process that used it unless told
#: not to (FAKETIME_DISABLE_SHM): an emulated host's clock must leave none.
FAKETIME_PREFIXES = ("faketime_shm_", "sem.faketime_sem_")


def _shm_segments() -> set[str]:
    """shardsink segments, except those of live processes outside this test
    run (a cluster or another test run on the same machine is not our leak),
    and libfaketime's (:data:`FAKETIME_PREFIXES`)."""
    try:
        names = {p.name for p in SHM_DIR.iterdir()}
    except FileNotFoundError:
        return set()
    ours = {os.getpid(), *(c.pid for c in psutil.Process().children(recursive=True))}
    shardsink = {n for n in names if n.startswith(SHM_PREFIX)}
    faketime = {n for n in names if n.startswith(FAKETIME_PREFIXES)}
    return faketime | {n for n in shardsink if _creator(n) in ours or not _alive(_creator(n))}


def _creator(name: str) -> int | None:
    """The creator pid a segment name carries (``shardsink.<cluster>.<pid>...``)."""
    parts = name.split(".")
    return int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else None


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _own_processes(mark: str) -> dict[int, str]:
    """Live processes of this test: descendants of the run, or marked with ``mark``."""
    candidates = {c.pid for c in psutil.Process().children(recursive=True)}
    candidates.update(marked(MARK, mark))
    candidates.discard(os.getpid())  # the test run itself carries the mark
    out: dict[int, str] = {}
    for pid in candidates:
        try:
            process = psutil.Process(pid)
            if pid in _SERVICE_PIDS or any(p.pid in _SERVICE_PIDS for p in process.parents()):
                continue
            if process.status() == psutil.STATUS_ZOMBIE:
                continue
            out[pid] = " ".join(process.cmdline()) or process.name()
        except psutil.NoSuchProcess:
            continue
    return out


@pytest.fixture(autouse=True)
def no_leaks(request, monkeypatch):
    """Fail a test that leaves a process or a shardsink shm segment behind."""
    mark = _mark(request)
    monkeypatch.setenv(MARK, mark)
    shm_before = _shm_segments()
    yield
    left: list = []

    def clean() -> bool:
        left[:] = [_own_processes(mark), _shm_segments() - shm_before]
        return not any(left)

    with contextlib.suppress(AssertionError):  # 5 s for them to end; what stays is dealt with below
        wait_until(clean, 5.0, "the end of the test's processes and segments", every_s=0.05)
    procs, shm = left
    if procs:  # clean up so one leak does not fail every later test
        killed = []
        for pid in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                killed.append(psutil.Process(pid))
                killed[-1].kill()
        psutil.wait_procs(killed, timeout=5)
        # segments of a live orphan were not counted; with it dead they are ours
        shm = _shm_segments() - shm_before
    for name in shm:
        with contextlib.suppress(FileNotFoundError):
            (SHM_DIR / name).unlink()
    assert not procs, f"test left processes running: {procs}"
    assert not shm, f"test left shared-memory segments: {sorted(shm)}"


@pytest.fixture
def popen():
    """``subprocess.Popen`` for this test: at teardown whatever is still
    running is killed, everything is reaped (bounded) and its pipes closed."""
    started: list[subprocess.Popen] = []

    def start(argv: list[str], **kwargs) -> subprocess.Popen:
        started.append(subprocess.Popen(argv, **kwargs))
        return started[-1]

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def own_processes(request):
    """What the leak check will see of this test's processes, as a function."""
    return lambda: _own_processes(_mark(request))


def _mark(request) -> str:
    return f"{os.getpid()}:{request.node.nodeid}"


def _service(request, factory, what: str):
    try:
        server = factory()
    except Exception as exc:  # any failure to start: fail in CI, skip elsewhere
        if IN_CI:
            pytest.fail(f"could not start {what} (CI=true, so this fails): {exc}")
        pytest.skip(f"could not start {what}: {exc}")
    _SERVICE_PIDS.update(server.pids())
    request.addfinalizer(server.stop)
    return server


@pytest.fixture(scope="session")
def postgres_server(request, tmp_path_factory):
    """A real PostgreSQL server on loopback for the whole session."""
    from shardsink.testing.postgres import PostgresServer

    return _service(
        request,
        lambda: PostgresServer(tmp_path_factory.mktemp("pg")).start(),
        "PostgreSQL",
    )


@pytest.fixture(scope="session")
def s3_server(request, tmp_path_factory):
    """A real S3-protocol server on loopback for the whole session."""
    from shardsink.testing.s3 import S3Server

    return _service(
        request,
        lambda: S3Server(tmp_path_factory.mktemp("s3")).start(),
        "S3 server",
    )


@pytest.fixture(scope="session")
def _ray_session(request):
    from shardsink.testing.ray import RayTestCluster

    return _service(request, lambda: RayTestCluster(nodes=3).start(), "Ray cluster")


@pytest.fixture
def ray_cluster(_ray_session):
    """A real Ray cluster of three nodes on loopback, one for the whole
    session (about 1.4 GiB). A test that removes a node adds one back; the
    nodes it adds are the session's too (exempt from the leak check)."""
    yield _ray_session
    _SERVICE_PIDS.update(_ray_session.pids())


_SERVICE_OUTCOMES: dict[str, dict[str, int]] = {"postgres": {}, "s3": {}}


def pytest_collection_modifyitems(items) -> None:
    """Tests on the Ray cluster run last: joining it as a driver starts Ray's
    threads in this process for good, after which forking is unsafe and a
    zygote execs instead (the zygote tests would see ``spawn``)."""
    items.sort(key=lambda item: "ray_cluster" in getattr(item, "fixturenames", ()))


def pytest_runtest_logreport(report) -> None:
    """Count outcomes of the tests that need a real service."""
    if report.when != "call" and not (report.when == "setup" and report.outcome != "passed"):
        return
    for service, counts in _SERVICE_OUTCOMES.items():
        if service in report.keywords:
            counts[report.outcome] = counts.get(report.outcome, 0) + 1


def pytest_terminal_summary(terminalreporter) -> None:
    """Say plainly whether the PostgreSQL and S3 cases ran or were skipped."""
    for service, counts in _SERVICE_OUTCOMES.items():
        shown = ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items())) or "none"
        terminalreporter.write_line(f"{service} cases (real server): {shown}")
