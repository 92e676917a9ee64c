"""The tools emulated hosts need, found or refused in one line, and running them.

Every check raises :class:`MissingCapability` with one line naming what is
missing and the package that brings it (Debian's or PyPI's); every command
run through :func:`run` raises :class:`CommandFailed` with the command and
the first line of its error output. :func:`each` is how a teardown tries
every step. Nothing here touches the network.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

#: The library inside PyPI's libfaketime package. Debian 12's (faketime
#: 0.9.10) is not used: with the monotonic clock left alone it fails Python
#: 3.11's time.sleep with EINVAL (it rewrites clock_nanosleep's absolute
#: monotonic deadline as if it were faked; fixed after 0.9.10); the PyPI
#: package's library sleeps right (both tried with a 0.1 s sleep under each).
LIBFAKETIME_IN_PACKAGE = "vendor/libfaketime/src/libfaketime.so.1"

#: Every external command the package runs, and the Debian package that brings it.
DEBIAN_PACKAGES = {"ip": "iproute2", "iptables": "iptables", "iptables-restore": "iptables"}


T = TypeVar("T")


class NetnsError(RuntimeError):
    """Emulated hosts could not be made, changed or removed; one line."""


class MissingCapability(NetnsError):
    """This machine or user cannot emulate hosts: the message names what is
    missing and how to get it."""


class CommandFailed(NetnsError):
    """A command exited non-zero or timed out; the message names the command
    and the first line of its error output."""


def require_root() -> None:
    """Raise :class:`MissingCapability` unless this process is root (network
    namespaces, bridges and firewall rules need ``CAP_SYS_ADMIN`` and
    ``CAP_NET_ADMIN``)."""
    if os.geteuid() != 0:
        raise MissingCapability(
            f"emulated hosts need root (network namespaces and firewall rules); "
            f"this process runs as uid {os.geteuid()}"
        )


def require_tool(name: str) -> str:
    """The path of the command ``name``; :class:`MissingCapability` naming its
    Debian package if it is not on ``PATH``."""
    path = shutil.which(name)
    if path is None:
        raise MissingCapability(
            f"`{name}` not found on PATH: install Debian's {DEBIAN_PACKAGES[name]} "
            f"(apt-get install {DEBIAN_PACKAGES[name]})"
        )
    return path


def require_ip_netns() -> None:
    """Raise :class:`MissingCapability` unless root can run ``ip netns``."""
    require_root()
    ip = require_tool("ip")
    try:
        run([ip, "netns", "list"])
    except CommandFailed as exc:
        raise MissingCapability(
            f"`ip netns` is unavailable ({exc}): install Debian's iproute2"
        ) from exc


def require_iptables() -> None:
    """Raise :class:`MissingCapability` unless ``iptables`` and
    ``iptables-restore`` are on ``PATH``."""
    require_tool("iptables")
    require_tool("iptables-restore")


def libfaketime() -> str:
    """The path of libfaketime (``LD_PRELOAD``-ed for clock skew), from PyPI's
    libfaketime package; :class:`MissingCapability` if it is not installed."""
    spec = importlib.util.find_spec("libfaketime")  # found, not imported
    locations = spec.submodule_search_locations if spec is not None else None
    library = Path(locations[0], LIBFAKETIME_IN_PACKAGE) if locations else None
    if library is None or not library.is_file():
        raise MissingCapability(
            "libfaketime not found: pip install libfaketime (or shardsink[netns]), "
            "whose library sleeps right with the monotonic clock left alone"
        )
    return str(library)


def require_netfilterqueue() -> None:
    """Raise :class:`MissingCapability` unless PyPI's NetfilterQueue imports in
    this interpreter (the delay handler runs on it)."""
    if importlib.util.find_spec("netfilterqueue") is None:
        raise MissingCapability(
            "the Python module netfilterqueue is missing: pip install NetfilterQueue "
            "(or shardsink[netns]); it compiles against Debian's libnetfilter-queue-dev"
        )


def run(
    argv: Sequence[str],
    *,
    input: str | None = None,
    timeout: float = 10.0,
    env: Mapping[str, str] | None = None,
) -> str:
    """Run ``argv`` to completion within ``timeout`` seconds, with ``env`` (this
    process's environment if ``None``); its standard output.
    :class:`CommandFailed` if it exits non-zero or runs out of time."""
    try:
        done = subprocess.run(
            list(argv),
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=None if env is None else dict(env),
        )
    except subprocess.TimeoutExpired as exc:  # run() has killed and reaped it
        raise CommandFailed(f"`{' '.join(argv)}` did not finish within {timeout} s") from exc
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or ["no error output"]
        raise CommandFailed(f"`{' '.join(argv)}` exited {done.returncode}: {lines[0]}")
    return done.stdout


def each(items: Iterable[T], action: Callable[[T], object]) -> None:
    """``action`` on every item, whichever fail (a teardown leaves nothing
    undone for one failure); the first error is raised after."""
    errors = []
    for item in list(items):
        try:
            action(item)
        except Exception as exc:
            errors.append(exc)
    if errors:
        raise errors[0]
