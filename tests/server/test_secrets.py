"""A password given in a store URI shows in no command line, log line, error
or output: not of the stores, not of a cluster and its consensus process
(restarted included), not of the shard commands."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from shardsink import open_shard
from shardsink.persist import ShardNotFound
from shardsink.storage import DeterminateError, open_consensus
from shardsink.storage.uri import BLOB_ENV, STORE_ENV, redact
from tests.helpers.wait import wait_until

ROOT = Path(__file__).resolve().parents[2]
PW = "Zq7-s3cr3t"


@pytest.mark.parametrize(
    ("uri", "shown"),
    [
        (f"postgresql://u:{PW}@h:5432/db", "postgresql://u:***@h:5432/db"),
        (f"postgres://u:{PW}%40x@h/db", "postgres://u:***@h/db"),
        (f"postgresql://u:{PW}@x@h/db", "postgresql://u:***@h/db"),
        (f"postgresql://u@h/db?password={PW}&sslmode=off", "postgresql://u@h/db?password=***&sslmode=off"),
        (f"postgresql://h/db?sslpassword={PW}#f", "postgresql://h/db?sslpassword=***#f"),
        (f"host=h password='{PW} x' user=u", "host=h password=*** user=u"),
        (
            f"s3://b/p?endpoint=http://127.0.0.1:9000&access_key=a&secret_key={PW}",
            "s3://b/p?endpoint=http://127.0.0.1:9000&access_key=a&secret_key=***",
        ),
        (f"error on 'postgresql://u:{PW}@h/db': x", "error on 'postgresql://u:***@h/db': x"),
        ("postgresql://u@h:5432/db?connect_timeout=2", "postgresql://u@h:5432/db?connect_timeout=2"),
        ("sqlite:///tmp/c.db", "sqlite:///tmp/c.db"),
        ("file:///tmp/blob", "file:///tmp/blob"),
    ],
)  # fmt: skip
def test_redact_masks_every_secret_and_nothing_else(uri: str, shown: str) -> None:
    assert redact(uri) == shown


def test_redact_given_the_uri_masks_its_secret_quoted_anywhere() -> None:
    uri = f"postgresql://u:{PW}%zz@h/db"
    assert redact(f'invalid percent-encoded token: "{PW}%zz"', uri=uri) == (
        'invalid percent-encoded token: "***"'
    )


@pytest.mark.postgres
def test_postgres_password_is_in_no_uri_or_error(postgres_server, tmp_path) -> None:
    url, password = postgres_server.new_user()
    blob = f"file://{tmp_path}/blob"
    store = open_consensus(url)
    try:
        assert password not in store.uri and store.uri.startswith("postgresql://")
    finally:
        store.close()
    errors = []
    with pytest.raises(ShardNotFound) as missing:
        open_shard("missing", blob=blob, consensus=url, create=False)
    errors.append(missing.value)
    port = str(postgres_server.port)
    bad = [
        url.replace(f":{port}/", ":notaport/"),  # libpq quotes the bad value
        url.replace(f":{password}@", f":{password}%zz@"),  # libpq quotes the bad token
        url.replace("postgresql://", "postgresq://"),  # an unknown scheme
    ]
    for uri in bad:
        with pytest.raises((ValueError, DeterminateError)) as refused:
            open_consensus(uri)
        errors.append(refused.value)
    with pytest.raises(DeterminateError, match="password authentication failed") as denied:
        open_consensus(url.replace(f":{password}@", f":{password}x@"))
    errors.append(denied.value)
    for error in errors:
        assert password not in str(error), error


def _sh(*args: str, env: dict[str, str] | None = None, timeout: float = 120):
    return subprocess.run(
        [sys.executable, "-m", "shardsink.cli", *args],
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


class _CommandLines:
    """The command lines ``root``'s descendants show, polled (``root``'s own
    is ``typed``, what the user typed). A child caught between its fork and
    its exec still shows ``typed``: that one counts only if the process never
    shows another, its own."""

    def __init__(self, root: psutil.Process, typed: list[str]) -> None:
        self.root = root
        self.typed = tuple(typed)
        self.by_pid: dict[int, set[tuple[str, ...]]] = {}

    def poll(self) -> None:
        for process in self.root.children(recursive=True):
            try:
                cmdline = tuple(process.cmdline())
            except psutil.Error:  # exited between the listing and the look
                continue
            self.by_pid.setdefault(process.pid, set()).add(cmdline)

    def lines(self) -> set[str]:
        out = set()
        for cmdlines in self.by_pid.values():
            own = cmdlines - {self.typed} or cmdlines
            out.update(" ".join(cmdline) for cmdline in own)
        return out


def _consensus_child(root: psutil.Process) -> psutil.Process | None:
    for process in root.children(recursive=True):
        try:
            if process.name() == "shardsink consensus":
                return process
        except psutil.Error:
            continue
    return None


def _appends(events: Path) -> int:
    return len(events.read_text().splitlines()) if events.exists() else 0


@pytest.mark.postgres
def test_a_cluster_on_a_password_store_shows_it_nowhere(postgres_server, tmp_path, popen) -> None:
    """``shardsink up`` on a password-protected PostgreSQL store, its consensus
    process killed once (so it is restarted and the restart logged): the
    password is in no process's command line at any look, in no log of the
    run, and in no output of ``up``, ``shard inspect`` or a failed command."""
    url, password = postgres_server.new_user()
    blob = f"file://{tmp_path}/blob"
    events = tmp_path / "events.jsonl"
    argv = [
        sys.executable, "-m", "shardsink.cli", "up", "--consensus", url, "--blob", blob,
        "--data-dir", str(tmp_path / "d"), "--groups", "1", "--workers", "1",
        "--interval-ms", "100", "--pace", "realtime",
        "--intervals", "40", "--events", str(events), "--json", "-v",
    ]  # fmt: skip
    up = popen(
        argv,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    root = psutil.Process(up.pid)
    command_lines = _CommandLines(root, argv)
    logs: dict[str, str] = {}
    killed: list[int] = []

    def ended() -> bool:
        """Whether ``up`` ended; while it runs, a look at its processes and logs."""
        if up.poll() is not None:
            return True
        command_lines.poll()
        child = _consensus_child(root)
        if child is not None:
            try:  # its log, under the data dir
                log_path = os.readlink(f"/proc/{child.pid}/fd/2")
                logs[log_path] = Path(log_path).read_text()
            except OSError:
                pass
            if not killed and _appends(events) >= 5:
                os.kill(child.pid, signal.SIGKILL)  # a grandchild this test started
                killed.append(child.pid)
        return False

    wait_until(ended, 120, "the end of shardsink up", every_s=0.05)  # a look every 50 ms
    out, err = up.communicate(timeout=60)
    assert up.returncode == 0, err
    assert killed and logs, "the consensus process was never seen"
    seen = command_lines.lines()
    summary = json.loads(out)
    assert summary["consensus_restarts"] >= 1 and summary["verified"] is True
    assert "restarting it on postgresql://" in err  # the restart is logged, redacted
    assert any("shardsink consensus" in line or "consensus serve" in line for line in seen)
    inspect = _sh("shard", "inspect", "--consensus", url, "--blob", blob, "--json")
    assert inspect.returncode == 0, inspect.stderr
    # the URIs may also come from the environment, off the command line
    from_env = _sh("shard", "inspect", "--json", env={STORE_ENV: url, BLOB_ENV: blob})
    assert from_env.returncode == 0, from_env.stderr
    assert json.loads(from_env.stdout)["seqno"] == json.loads(inspect.stdout)["seqno"]
    assert json.loads(inspect.stdout)["upper"] == 40 * 100
    missing = _sh("shard", "inspect", "--consensus", url, "--blob", blob, "--shard", "nope")
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    kept = sorted((tmp_path / "d" / "logs").rglob("*.log"))  # every process's, kept by the run
    assert any(path.name == "consensus.log" for path in kept), kept
    shown = {
        "command lines": "\n".join(seen),
        "stdout": out,
        "stderr": err,
        "events": events.read_text(),
        **logs,
        **{str(path): path.read_text() for path in kept},
        "inspect": inspect.stdout + inspect.stderr,
        "inspect error": missing.stderr,
    }
    leaked = [name for name, text in shown.items() if password in text]
    assert not leaked, f"the password shows in: {leaked}"


@pytest.mark.postgres
@pytest.mark.parametrize("bench", ["consensus", "appends"])
def test_bench_clients_get_the_password_in_no_argv(postgres_server, tmp_path, popen, bench) -> None:
    """The benchmarks' racing client processes take the store URI from their
    environment, and their tables show it redacted."""
    url, password = postgres_server.new_user()
    argv = [
        sys.executable, "-m", "shardsink.cli", "bench", bench, "--store", url,
        "--clients", "2", "--seconds", "0.5", "--json", str(tmp_path / "out.json"),
    ]  # fmt: skip
    proc = popen(
        argv,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    command_lines = _CommandLines(psutil.Process(proc.pid), argv)

    def ended() -> bool:
        if proc.poll() is not None:
            return True
        command_lines.poll()  # a look every 20 ms while it runs: its clients live 0.5 s
        return False

    wait_until(ended, 120, f"the end of bench {bench}", every_s=0.02)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    seen = command_lines.lines()
    assert any(" -c " in line for line in seen), seen  # the clients were seen
    shown = {"command lines": "\n".join(seen), "stdout": out, "stderr": err}
    shown["json"] = (tmp_path / "out.json").read_text()
    leaked = [name for name, text in shown.items() if password in text]
    assert not leaked, f"the password shows in: {leaked}"
