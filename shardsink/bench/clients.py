"""Racing client processes for benchmarks: start together, report as JSON.

A client is a fresh interpreter (no fork of the driver, no shared
multiprocessing state) running ``ENTRY(payload)``, where ``payload`` is a
msgspec Struct the driver wrote as JSON on the first line of the client's
stdin, decoded strictly as the type of ``ENTRY``'s one parameter (:func:`serve`).
The client sets itself up, calls :func:`ready` (which prints ``ready`` and
waits for ``go`` on stdin), runs for its measured time, and prints one JSON
object as its last line (:func:`report`). Store URIs come in the
environment, as shardsink's processes take them, off every command line
(``ps`` shows those). Clients' stderr is the driver's, so their errors are
shown.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import time
import typing
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

import msgspec

from ..process import resolve

# Client start-up (interpreter, imports, connecting) is not measured, but
# bounded: this, and a sixteenth of it per client (64 started in more than 60 s
# on a loaded 2-core machine).
START_TIMEOUT_S = 60.0
FINISH_GRACE_S = 30.0


def serve(entry: str) -> None:
    """In a client: call ``entry`` (``module:function``) with the payload on
    stdin's first line, decoded as the type the function's one parameter is
    annotated with. ``msgspec.DecodeError`` (a ``ValidationError`` naming
    the field) if the line is not that type's JSON, strictly: no unknown
    field, no value of another type coerced."""
    func = resolve(entry)
    (kind,) = (hint for name, hint in typing.get_type_hints(func).items() if name != "return")
    func(msgspec.json.decode(sys.stdin.readline(), type=kind, strict=True))


def ready() -> bool:
    """In a client: announce readiness and wait for the start signal.
    ``False`` if the driver went away instead."""
    print("ready", flush=True)
    return sys.stdin.readline().strip() == "go"


def report(counts: dict) -> None:
    """In a client: hand the measured counts to the driver."""
    print(json.dumps(counts), flush=True)


def race(
    entry: str,
    payloads: Sequence[msgspec.Struct],
    seconds: float,
    what: str,
    env: dict[str, str] | None = None,
    on_go: Callable[[], None] | None = None,
) -> list[dict]:
    """Start one client per payload running ``entry`` (``module:function``,
    taking that payload's type, see :func:`serve`), with ``env`` added to its
    environment (where store URIs go), release them together once all are
    ready, and return their reports in the order of ``payloads``. ``on_go``,
    if given, is called just before they are released (where a caller
    samples what the measured time is to cover).

    Raises ``RuntimeError`` naming ``what`` if a client fails to start (a
    payload its function does not take among the reasons), to finish within
    ``seconds`` plus a grace, or to report; every client is killed and
    reaped on the way out."""
    code = f"from {__name__} import serve; serve({entry!r})"
    with contextlib.ExitStack() as stack:
        procs = [
            stack.enter_context(
                subprocess.Popen(
                    [sys.executable, "-c", code],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    bufsize=0,
                    env={**os.environ, **(env or {})},
                )
            )
            for _ in payloads
        ]
        try:
            for proc, payload in zip(procs, payloads, strict=True):
                proc.stdin.write(msgspec.json.encode(payload) + b"\n")
            return _drive(procs, seconds, what, on_go)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()


def _drive(
    procs: list[subprocess.Popen[bytes]],
    seconds: float,
    what: str,
    on_go: Callable[[], None] | None,
) -> list[dict]:
    timeout_s = START_TIMEOUT_S * (1 + len(procs) / 16)
    deadline = time.monotonic() + timeout_s
    for c, proc in enumerate(procs):
        readable, _, _ = select.select([proc.stdout], [], [], max(0, deadline - time.monotonic()))
        if not readable or proc.stdout.readline() != b"ready\n":
            raise RuntimeError(
                f"bench client {c} did not get ready for {what} within {timeout_s:.0f}s "
                f"(exit code {proc.poll()}); see its error above"
            )
    if on_go is not None:
        on_go()
    for proc in procs:
        proc.stdin.write(b"go\n")
    reports = []
    for c, proc in enumerate(procs):
        try:
            out, _ = proc.communicate(timeout=seconds + FINISH_GRACE_S)
        except subprocess.TimeoutExpired:
            raise RuntimeError(
                f"bench client {c} of {what} did not finish within {seconds + FINISH_GRACE_S:g}s"
            ) from None
        if proc.returncode != 0:
            raise RuntimeError(
                f"bench client {c} of {what} failed with exit code {proc.returncode}; "
                "see its error above"
            )
        reports.append(json.loads(out.splitlines()[-1]))
    return reports


def quantile_ms(sorted_us: list[int], q: float) -> float:
    """The ``q`` quantile of sorted microsecond latencies, in milliseconds."""
    if not sorted_us:
        return float("nan")
    return sorted_us[min(len(sorted_us) - 1, int(q * len(sorted_us)))] / 1000


def check_stores(stores: list[str], seconds: float) -> None:
    """``ValueError`` for a non-positive duration or a store client processes
    cannot share; opens each store once, so a bad URI fails before anything
    starts (and its tables exist before clients race to create them)."""
    from ..faults import open_consensus

    if seconds <= 0:
        raise ValueError(f"--seconds must be positive, got {seconds}")
    for uri in stores:
        if urlsplit(uri).scheme.lower() == "memory":
            raise ValueError(
                f"{uri}: a memory:// store is private to one process, so client processes "
                "cannot race on it; use sqlite:///... or postgresql://..."
            )
        open_consensus(uri).close()
