"""Removing runs of emulated hosts: a closing run's own, and dead runs' leftovers.

A namespace is removed by killing every process in it (found by its
namespace inode, killed through a pidfd) and deleting its name: with no
process and no name holding it, the kernel frees it, and with it its veths,
bridge, firewall rules and queues. A run's state directory (clock files)
and its scratch directory are removed with it.

:func:`sweep` removes what runs whose creator is dead left (a SIGKILLed
chaos run, a closed terminal), found by name (:mod:`.names`); a live run's
namespaces are never touched, whoever runs the sweep.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence

import msgspec

from . import tools
from .clock import remove_shared
from .names import (
    NETNS_DIR,
    STATE_DIR,
    locked,
    netns_names,
    parse_netns,
    parse_scratch,
    parse_state_dir,
    state_dirs,
)
from .processes import kill_in, processes_in


class Swept(msgspec.Struct, frozen=True):
    """What a sweep removed (or, dry, would remove)."""

    namespaces: tuple[str, ...] = ()
    processes: tuple[int, ...] = ()
    directories: tuple[str, ...] = ()


def remove_namespaces(names: Sequence[str], *, dry_run: bool = False) -> list[int]:
    """Kill every process in the namespaces ``names`` and delete them (those
    that exist); the pids killed (with ``dry_run``: found, and nothing done).
    ``CommandFailed`` if ``ip`` cannot delete one; ``TimeoutError`` if a
    process outlives SIGKILL."""
    existing, killed = [], []
    for name in names:
        try:
            inode = os.stat(NETNS_DIR / name).st_ino
        except FileNotFoundError:
            continue
        existing.append(name)
        pids = processes_in(inode)
        killed += pids if dry_run else kill_in(inode, pids)
    if existing and not dry_run:
        batch = "".join(f"netns del {name}\n" for name in existing)
        tools.run(["ip", "-force", "-batch", "-"], input=batch)
    return killed


def sweep(*, dry_run: bool = False) -> Swept:
    """Remove the namespaces, their processes and the state and scratch
    directories of every run of emulated hosts whose creator is dead.
    ``MissingCapability`` if not root or without ``ip netns``."""
    tools.require_ip_netns()
    dead = [n for n in netns_names() if (parsed := parse_netns(n)) and not parsed[0].alive()]
    killed = remove_namespaces(dead, dry_run=dry_run)
    with locked():  # no run takes a subnet, and makes its scratch, meanwhile
        directories = [d for d in state_dirs() if (run := parse_state_dir(d)) and not run.alive()]
        directories += _dead_scratch()
        if not dry_run:
            for directory in directories:
                shutil.rmtree(STATE_DIR / directory, ignore_errors=True)
                remove_shared(directory)  # a run's libfaketime state (none for a scratch)
    return Swept(tuple(dead), tuple(killed), tuple(directories))


def _dead_scratch() -> list[str]:
    """The scratch directories whose subnet no live run holds."""
    runs = [parsed[0] for parsed in map(parse_netns, netns_names()) if parsed]
    runs += [run for run in map(parse_state_dir, state_dirs()) if run]
    live = {run.k for run in runs if run.alive()}
    return [d for d in state_dirs() if (k := parse_scratch(d)) is not None and k not in live]
