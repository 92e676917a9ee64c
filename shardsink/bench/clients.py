"""Racing client processes for benchmarks: start together, report as JSON.

A client is a fresh interpreter (no fork of the driver, no shared
multiprocessing state) running ``ENTRY(argv)``: it sets itself up, calls
:func:`ready` (which prints ``ready`` and waits for ``go`` on stdin), runs for
its measured time, and prints one JSON object as its last line. Clients'
stderr is the driver's, so their errors are shown.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

# Client start-up (interpreter, imports, connecting) is not measured, but
# bounded: this, and a sixteenth of it per client (64 started in more than 60 s
# on a loaded 2-core machine).
START_TIMEOUT_S = 60.0
FINISH_GRACE_S = 30.0


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
    argvs: list[list[str]],
    seconds: float,
    what: str,
    env: dict[str, str] | None = None,
    on_go: Callable[[], None] | None = None,
) -> list[dict]:
    """Start one client per ``argvs`` entry running ``entry`` (``module:function``),
    with ``env`` added to its environment (where store URIs go: an argv shows
    in ``ps``), release them together once all are ready, and return their
    reports. ``on_go``, if given, is called just before they are released
    (where a caller samples what the measured time is to cover).

    Raises ``RuntimeError`` naming ``what`` if a client fails to start, to
    finish within ``seconds`` plus a grace, or to report; every client is
    killed and reaped on the way out."""
    module, function = entry.split(":")
    code = f"import sys; from {module} import {function} as f; f(sys.argv[1:])"
    with contextlib.ExitStack() as stack:
        procs = [
            stack.enter_context(
                subprocess.Popen(
                    [sys.executable, "-c", code, *argv],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    bufsize=0,
                    env={**os.environ, **(env or {})},
                )
            )
            for argv in argvs
        ]
        try:
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


def add_race_arguments(parser: argparse.ArgumentParser) -> None:
    """``--store`` (repeatable), ``--clients``, ``--seconds`` and ``--json``."""
    parser.add_argument(
        "--store",
        action="append",
        required=True,
        metavar="URI",
        help="consensus store (sqlite:///abs/path.db or postgresql://...); repeat to compare",
    )
    parser.add_argument(
        "--clients", type=counts, default=[1, 4], help="client counts (default 1,4)"
    )
    parser.add_argument(
        "--seconds", type=float, default=5.0, help="measured seconds per run (default 5)"
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the figures here")


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


def counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers like 1,4, got {text!r}")
    return counts
