"""``python -m shardsink.cli.servers postgres|s3 ...``: a throwaway store
server in the foreground.

What ``scripts/start-postgres`` and ``scripts/start-s3`` run, and what an
emulated host runs for its stores (:mod:`shardsink.testing.emulated`): the
servers of :mod:`shardsink.testing` (:class:`~shardsink.testing.PostgresServer`,
:class:`~shardsink.testing.S3Server`), for tests and benchmarks, so not a
``shardsink`` command. Each prints where its server is once it serves, and
serves until Ctrl-C or SIGTERM, which stop the server; the server also stops
if this process dies.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import tempfile
import time

from ..options import Parser
from ..testing import postgres, s3


def main(argv: list[str] | None = None) -> int:
    """Run the server ``argv`` names (``postgres ...`` or ``s3 ...``; default
    ``sys.argv[1:]``) until stopped; the exit code. Bad arguments exit 2
    (``SystemExit``), saying what is wrong."""
    parser = Parser(prog="python -m shardsink.cli.servers", description=__doc__.split("\n\n")[0])
    servers = parser.add_subparsers(dest="server", metavar="SERVER", required=True)
    pg = servers.add_parser(
        "postgres",
        help="a PostgreSQL server (scripts/start-postgres)",
        description=_postgres.__doc__,
    )
    pg.add_argument("dir", nargs="?", metavar="DIR", help="keep the log here")
    pg.add_argument(
        "--listen", default=postgres.LOOPBACK, metavar="ADDR", help="default %(default)s"
    )
    pg.add_argument(
        "--clients", metavar="CIDR", help="where password roles may connect from (default ADDR/32)"
    )
    pg.add_argument("--new-user", action="store_true", help="print a password role's URL")
    pg.set_defaults(func=_postgres)
    weed = servers.add_parser(
        "s3", help="an S3 server, SeaweedFS (scripts/start-s3)", description=_s3.__doc__
    )
    weed.add_argument("data_dir", nargs="?", help="keep the data here (default: a temp dir)")
    weed.add_argument("--listen", default=s3.LOOPBACK, metavar="ADDR", help="default %(default)s")
    weed.set_defaults(func=_s3)
    args = parser.parse_args(argv)
    return args.func(args)


def _postgres(args: argparse.Namespace) -> int:
    """Run a throwaway PostgreSQL server in the foreground
    (``scripts/start-postgres``): print its URL (with ``--new-user``, a fresh
    password role's database's) once it takes connections, then serve until
    Ctrl-C or SIGTERM, which stop it; it also stops if this process dies.
    Without ``DIR`` its log goes with a temporary directory removed on exit."""
    _stop_once()
    with contextlib.ExitStack() as stack, contextlib.suppress(KeyboardInterrupt):
        base_dir = args.dir or stack.enter_context(
            tempfile.TemporaryDirectory(prefix="shardsink-pg-")  # data and log alike
        )
        server = postgres.PostgresServer(base_dir, listen=args.listen, clients=args.clients)
        stack.enter_context(server)
        print(server.new_user()[0] if args.new_user else server.url, flush=True)
        print(f"log: {server.base_dir}/postgres.log; Ctrl-C stops the server", file=sys.stderr)
        signal.pause()
    return 0


def _stop_once() -> None:
    """SIGTERM takes the same way out as Ctrl-C, so the server is always
    stopped; SIGINT is set too because a shell starts background jobs with
    it ignored."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _interrupt_once)


def _interrupt_once(signum: int, frame: object) -> None:
    """Ctrl-C or SIGTERM: stop (``KeyboardInterrupt``), and ignore both from
    now on: a second one cut the server's stop short, leaving its private
    data directory behind (a process group stopped with SIGTERM, then
    SIGTERM again, as :func:`shardsink.netns.processes.stop` does: how an
    emulated host's stores are stopped)."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    raise KeyboardInterrupt


def _s3(args: argparse.Namespace) -> int:
    """Run an S3 server (SeaweedFS) in the foreground (``scripts/start-s3``):
    print the endpoint, the credentials and a blob URI for a fresh bucket
    once it serves, then serve until Ctrl-C or SIGTERM, which stop it (it
    also stops if this process dies); exit 1 if the server exits on its own.
    Without ``DATA_DIR`` the data lives in a temporary directory removed at
    exit."""
    _stop_once()
    try:
        if args.data_dir:
            return _serve_s3(args.data_dir, args.listen)
        with tempfile.TemporaryDirectory(prefix="shardsink-s3-") as tmp:
            return _serve_s3(tmp, args.listen)
    except KeyboardInterrupt:
        return 0


def _serve_s3(data_dir: str, listen: str) -> int:
    with s3.S3Server(data_dir, listen=listen) as server:
        bucket = server.new_bucket()
        print(f"endpoint:   {server.endpoint}")
        print(f"access key: {server.access_key}")
        print(f"secret key: {server.secret_key}")
        print(f"blob URI:   {server.blob_uri(bucket)}")
        print(f"data dir:   {data_dir}  (Ctrl-C stops)", flush=True)
        while server.pids():
            time.sleep(0.5)
        print("the S3 server exited on its own", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
