"""Emulated hosts for tests, proven gone after each test.

``netns_network`` is a pytest fixture (a conftest imports it): a factory,
``netns_network(3, clocks=True)``, of :class:`~shardsink.netns.Network`\\ s
that at teardown heals every fault, proves no rule, queue or process of a
fault is left in any host (:func:`assert_healed`), closes the network and
proves that none of its namespaces, processes, state files or root-namespace
interfaces is left (:func:`assert_removed`). On a machine that cannot
emulate hosts (not root, a tool missing) a test is skipped with the reason,
and fails with ``CI=true``.

Veths, the bridge, rules and queues live inside the run's namespaces, which
the kernel frees (with all they hold) once no name and no process holds
them: so the proof of their removal is that no name and no process is left.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence

import msgspec
import pytest

from ..netns import NETNS_DIR, MissingCapability, Network, each, processes_in, shared_names


class Footprint(msgspec.Struct, frozen=True):
    """What a network made that must be gone once it is closed."""

    prefix: str
    inodes: dict[str, int]
    state_dir: str
    root_interfaces: frozenset[str]
    scratch_dir: str


def in_ci() -> bool:
    """Whether this run is CI's (``CI=true``): a missing capability fails there."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def footprint(net: Network, root_interfaces: frozenset[str]) -> Footprint:
    """``net``'s footprint; ``root_interfaces`` those of the root namespace
    before it was made."""
    return Footprint(
        str(net.name),
        net.inodes(),
        str(net.name.state_dir),
        root_interfaces,
        str(net.name.scratch_dir),
    )


def root_interfaces() -> frozenset[str]:
    """The interfaces of this process's namespace (the root one)."""
    return frozenset(name for _, name in socket.if_nameindex())


def assert_healed(net: Network) -> None:
    """Heal every fault of ``net``, then assert that no host has a rule, a
    bound queue or a process other than those :meth:`Network.popen` started
    and that are still running."""
    net.nemesis.heal_all()
    ours = {proc.pid for proc in net.started}
    inodes = net.inodes()
    for host in net.hosts:
        ruleset = net.exec(host, ["iptables-save"])
        rules = [line for line in ruleset.splitlines() if line.startswith("-A ")]
        assert not rules, f"{host.name} kept firewall rules after healing: {rules}"
        queues = net.exec(host, ["cat", "/proc/net/netfilter/nfnetlink_queue"]).strip()
        assert not queues, f"{host.name} kept a bound queue after healing: {queues!r}"
        strays = set(processes_in(inodes[host.netns])) - ours
        assert not strays, f"{host.name} kept processes after healing: {sorted(strays)}"


def assert_removed(footprint: Footprint) -> None:
    """Assert that a closed network left no namespace name, no process in its
    namespaces, no state or scratch directory and no new root-namespace
    interface."""
    names = [n for n in os.listdir(NETNS_DIR) if n.startswith(footprint.prefix + "-")]
    assert not names, f"namespaces left: {names}"
    inside = {inode: processes_in(inode) for inode in footprint.inodes.values()}
    assert not any(inside.values()), f"processes left in the run's namespaces: {inside}"
    assert not os.path.exists(footprint.state_dir), f"state left: {footprint.state_dir}"
    scratch = footprint.scratch_dir
    assert not os.path.exists(scratch), f"scratch directory left: {scratch}"
    shared = [n.lstrip("/") for n in shared_names(footprint.prefix)]
    left = [n for n in os.listdir("/dev/shm") if n in shared or n.removeprefix("sem.") in shared]
    assert not left, f"libfaketime state left in /dev/shm: {left}"
    new = root_interfaces() - footprint.root_interfaces
    assert not new, f"interfaces appeared in the root namespace: {sorted(new)}"


def require(checks: Sequence[Callable[[], object]]) -> None:
    """Run each capability check; skip the test with the reason if one fails
    (fail it with ``CI=true``)."""
    for check in checks:
        try:
            check()
        except MissingCapability as exc:
            if in_ci():
                pytest.fail(f"cannot emulate hosts (CI=true, so this fails): {exc}")
            pytest.skip(f"cannot emulate hosts: {exc}")


@pytest.fixture
def netns_network():
    """A factory of :class:`Network`: ``netns_network(hosts, needs=(checks...),
    **Network kwargs)``; ``needs`` are capability checks of
    :mod:`shardsink.netns.tools` the test needs beyond the network's own.
    Every network made is proven healed and removed at teardown."""
    made: list[tuple[Network, Footprint]] = []

    def make(hosts: int = 3, *, needs: Sequence[Callable[[], object]] = (), **kwargs) -> Network:
        before = root_interfaces()
        require([lambda: Network.check(**kwargs), *needs])
        net = Network(hosts, run="test", **kwargs)
        made.append((net, footprint(net, before)))
        return net

    yield make
    steps = []
    for net, made_footprint in reversed(made):
        steps += [(assert_healed, net), (Network.close, net), (assert_removed, made_footprint)]
    each(steps, lambda step: step[0](step[1]))  # every step of every network, whichever fails
