"""The one HTTP server of shardsink: Prometheus metrics and the live dashboard.

:class:`HttpServer` answers GET requests for a fixed set of paths from a
daemon thread (stdlib ``ThreadingHTTPServer``), each path answered by a
function called per request. It binds loopback only, like every socket of a
cluster (:mod:`shardsink._address`). Nothing a client sends is evaluated:
the path picks a function or gets a 404, the query string is ignored.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from ._address import _is_loopback, check_address

#: A page: called per request, returns its content type and body.
Page = Callable[[], tuple[str, bytes]]

#: Where a server listens when only a port is given.
LOOPBACK = "127.0.0.1"
#: Loopback, a free port: where a page is served when no address is given.
FREE_PORT = f"{LOOPBACK}:0"


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``:PORT`` or ``PORT`` as ``(host, port)``; the host
    defaults to loopback and must be a loopback address, the port 0 (any
    free one) to 65535. ``ValueError`` naming ``text`` otherwise."""
    host, _, port = text.rpartition(":")
    host = host or LOOPBACK
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"invalid listen address {text!r}: give HOST:PORT, e.g. 127.0.0.1:8787")
    if not _is_loopback(host.strip("[]")):
        # the pages have no login: anyone who reaches the port reads them
        raise ValueError(
            f"refusing to serve HTTP on {text}: the page has no login, so only loopback "
            f"addresses may be bound (127.0.0.1, ::1, localhost); from another machine, "
            f"tunnel to it: ssh -L {port}:127.0.0.1:{port} THIS_HOST"
        )
    check_address(f"tcp://{host}:{port}", for_bind=True)
    return host, int(port)


class HttpServer:
    """Serve ``pages`` (path to :data:`Page`) on ``host:port`` (0: a free
    port) from a daemon thread named ``name``. :attr:`base` is its
    ``http://host:port``. A page that raises answers 500 and the server goes
    on. ``ValueError`` naming the address if it cannot be bound or is not
    loopback. ``close()`` stops and joins the thread; idempotent."""

    def __init__(self, pages: dict[str, Page], host: str, port: int, name: str) -> None:
        check_address(f"tcp://{host}:{port}", for_bind=True)

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                page = pages.get(urlsplit(self.path).path)
                if page is None:
                    self.send_error(HTTPStatus.NOT_FOUND)
                    return
                try:
                    content_type, body = page()
                except Exception as exc:
                    self.send_error(HTTPStatus.INTERNAL_SERVER_ERROR, explain=repr(exc))
                    return
                self.send_response(HTTPStatus.OK)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                """Requests are not logged: a polling page would flood the log."""

        try:
            self._server: ThreadingHTTPServer | None = ThreadingHTTPServer((host, port), Handler)
        except OSError as exc:
            raise ValueError(f"cannot serve HTTP on {host}:{port}: {exc}") from None
        self._server.daemon_threads = True
        self.base = f"http://{host}:{self._server.server_port}"
        self._thread = threading.Thread(target=self._server.serve_forever, name=name, daemon=True)
        self._thread.start()

    def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
            self._thread.join(5)
