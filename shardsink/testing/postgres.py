"""A throwaway PostgreSQL server on loopback, for tests and benchmarks.

``PostgresServer(base_dir).start()`` runs ``initdb`` and then ``postgres``
directly (not ``pg_ctl``, so we hold the server's pid), listening on
``127.0.0.1`` at a free port with no Unix socket. The superuser is trusted;
any other role logs in with its password (:meth:`PostgresServer.new_user`), so
tests can check what becomes of a password given in a URI.

``listen`` and ``clients`` put it on another address: an emulated host's
(``10.77.k.i``), answering roles with a password from the host's subnet
(``10.77.k.0/24``), the superuser still from its own address only. The
server is started by the process that constructs it, so to run it on an
emulated host that process runs there: ``python -m shardsink.cli.servers
postgres --listen ADDR --clients CIDR --new-user DIR`` (what
``scripts/start-postgres`` runs) prints the URL once the server takes
connections and serves until SIGTERM.
``stop()`` shuts it down by pid; the server also dies if the process that
started it dies (``PR_SET_PDEATHSIG``), so a crashed test run never leaks it.

PostgreSQL refuses to run as root. Under root the server runs as the
``postgres`` system user if there is one (Debian's ``apt-get install
postgresql`` creates it), else as ``nobody``; its data directory then lives in
a private directory under the system temp dir, because ``base_dir`` usually
sits below a root-only directory (pytest's ``/tmp/pytest-of-root`` is 0700).
The server log is always ``base_dir/postgres.log``.

fsync stays on: tests of this project check durability semantics, so the server
behaves like a production one. Only ``initdb`` runs with ``--no-sync``: a crash
during setup loses a cluster nobody needs again.
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from .._address import free_port
from ..process import dies_with_this_process

SUPERUSER = "postgres"
LOOPBACK = "127.0.0.1"
_BIND_RETRIES = 3


def hba(listen: str, clients: str) -> str:
    """pg_hba.conf, TCP only: the superuser trusted from the server's own
    address ``listen``, every other role with its password from ``clients``
    (a CIDR)."""
    return f"host all {SUPERUSER} {listen}/32 trust\nhost all all {clients} scram-sha-256\n"


def find_bindir() -> Path:
    """The directory holding ``initdb`` and ``postgres``.

    Tries ``pg_config --bindir``, the newest ``/usr/lib/postgresql/*/bin``, then
    ``PATH``; raises ``FileNotFoundError`` listing what was tried."""
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run(
            [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=False
        )
        if out.returncode == 0:
            candidates.append(Path(out.stdout.strip()))
    candidates += [
        Path(p)
        for p in sorted(
            glob.glob("/usr/lib/postgresql/*/bin"),
            key=lambda p: int(Path(p).parent.name) if Path(p).parent.name.isdigit() else 0,
            reverse=True,
        )
    ]
    on_path = shutil.which("postgres")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    for bindir in candidates:
        if (bindir / "initdb").is_file() and (bindir / "postgres").is_file():
            return bindir
    raise FileNotFoundError(
        "PostgreSQL server binaries (initdb, postgres) not found; tried "
        f"{[str(c) for c in candidates] or 'nothing'} from `pg_config --bindir`, "
        "/usr/lib/postgresql/*/bin and PATH; install e.g. `apt-get install postgresql`"
    )


class PostgresServer:
    """A PostgreSQL server owned by this process. See the module docstring.

    ``start()`` raises ``RuntimeError`` (with the log's tail) if the server does
    not accept connections within ``start_timeout`` seconds, and
    ``FileNotFoundError`` if the binaries are missing. Start it from the main
    thread: ``PR_SET_PDEATHSIG`` fires when the starting *thread* exits.
    """

    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        start_timeout: float = 60.0,
        *,
        listen: str = LOOPBACK,
        clients: str | None = None,
    ) -> None:
        self.base_dir = Path(base_dir).resolve()
        self.start_timeout = start_timeout
        #: the IPv4 address it listens on, and the CIDR password roles may come from
        self.listen = listen
        self.clients = clients or f"{listen}/32"
        self.port: int | None = None
        self.url: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._private_dir: Path | None = None
        self._db_counter = itertools.count()

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run_as(self) -> pwd.struct_passwd | None:
        if os.geteuid() != 0:
            return None
        for name in ("postgres", "nobody"):
            try:
                return pwd.getpwnam(name)
            except KeyError:
                continue
        raise RuntimeError("running as root and neither a 'postgres' nor 'nobody' user exists")

    def _spawn_kwargs(self, user: pwd.struct_passwd | None) -> dict[str, object]:
        kwargs: dict[str, object] = {
            # SIGQUIT: PostgreSQL's immediate shutdown, which also ends its backends
            "preexec_fn": dies_with_this_process(signal.SIGQUIT),
            "start_new_session": True,
            "stdin": subprocess.DEVNULL,
            "env": {**os.environ, "LC_ALL": "C", "LANG": "C"},
        }
        if user is not None:
            kwargs.update(user=user.pw_uid, group=user.pw_gid, extra_groups=[])
        return kwargs

    def start(self) -> PostgresServer:
        """initdb, start the server and wait until it accepts connections."""
        if self._proc is not None:
            return self
        bindir = find_bindir()
        user = self._run_as()
        self.base_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.base_dir / "postgres.log"
        try:
            if user is None:
                root = self.base_dir
            else:
                self._private_dir = Path(tempfile.mkdtemp(prefix="shardsink-pg-"))
                os.chown(self._private_dir, user.pw_uid, user.pw_gid)
                root = self._private_dir
            data = str(root / "data")
            initdb = [str(bindir / "initdb"), "-D", data, "--auth=trust", "-U", SUPERUSER]
            initdb += ["--encoding=UTF8", "--no-locale", "--no-sync"]
            with open(log_path, "ab") as log:
                subprocess.run(
                    initdb,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    timeout=self.start_timeout,
                    check=True,
                    **self._spawn_kwargs(user),
                )
            # rewritten in place, so the file keeps the owner initdb gave it
            with open(Path(data) / "pg_hba.conf", "w") as conf:
                conf.write(hba(self.listen, self.clients))
            for _ in range(_BIND_RETRIES):
                if self._launch(bindir, data, user, log_path):
                    return self
        except BaseException:
            self.stop()
            raise
        raise RuntimeError(
            f"postgres lost the race for a free port {_BIND_RETRIES} times; see {log_path}"
        )

    def _launch(
        self, bindir: Path, data: str, user: pwd.struct_passwd | None, log_path: Path
    ) -> bool:
        """Start postgres on a free port and wait until it accepts connections.

        False if another process took the port first (the caller retries with
        another); ``RuntimeError`` for any other failure or the timeout."""
        import psycopg

        self.port = free_port()
        self.url = f"postgresql://{SUPERUSER}@{self.listen}:{self.port}/postgres"
        settings = {
            "listen_addresses": self.listen,
            "port": self.port,
            # TCP only: no socket path length limit, no clash with a system server.
            "unix_socket_directories": "",
            "shared_buffers": "32MB",
        }
        argv = [str(bindir / "postgres"), "-D", data]
        for name, value in settings.items():
            argv += ["-c", f"{name}={value}"]
        log_start = log_path.stat().st_size
        with open(log_path, "ab") as log:
            self._proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, **self._spawn_kwargs(user)
            )
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                self._proc = None
                with open(log_path, "rb") as log:
                    log.seek(log_start)
                    output = log.read().decode(errors="replace")
                if "could not bind" in output:
                    return False
                raise RuntimeError(f"postgres exited during start-up; its log:\n{output[-3000:]}")
            try:
                with psycopg.connect(self.url, connect_timeout=2, autocommit=True) as conn:
                    conn.execute("SELECT 1")
                return True
            except psycopg.OperationalError:
                time.sleep(0.1)
        raise RuntimeError(
            f"postgres did not accept connections at {self.url} within "
            f"{self.start_timeout:.0f}s; see {log_path}"
        )

    def new_database(self) -> str:
        """Create a fresh, empty database and return its URL."""
        import psycopg

        if self.url is None or self._proc is None:
            raise RuntimeError("PostgresServer.new_database: the server is not running")
        name = f"t{os.getpid()}_{next(self._db_counter)}"
        with psycopg.connect(self.url, connect_timeout=5, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url.rsplit("/", 1)[0] + f"/{name}"

    def new_user(self) -> tuple[str, str]:
        """A fresh role that logs in with a random password, owning a fresh
        database: the database's URL (the password in it) and the password."""
        import psycopg
        from psycopg import sql

        if self.url is None or self._proc is None:
            raise RuntimeError("PostgresServer.new_user: the server is not running")
        name = f"u{os.getpid()}_{next(self._db_counter)}"
        password = secrets.token_hex(16)
        with psycopg.connect(self.url, connect_timeout=5, autocommit=True) as conn:
            conn.execute(
                sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                    sql.Identifier(name), sql.Literal(password)
                )
            )
            conn.execute(
                sql.SQL("CREATE DATABASE {} OWNER {}").format(
                    sql.Identifier(name), sql.Identifier(name)
                )
            )
        return f"postgresql://{name}:{password}@{self.listen}:{self.port}/{name}", password

    def pids(self) -> list[int]:
        """The postmaster's pid (its backends are its children), if running."""
        return [self._proc.pid] if self._proc is not None else []

    def stop(self, timeout: float = 30.0) -> None:
        """Fast shutdown (SIGINT), then SIGKILL after ``timeout`` seconds. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        if self._private_dir is not None:
            shutil.rmtree(self._private_dir, ignore_errors=True)
            self._private_dir = None
