"""Emulated clusters for tests, proven gone after each test.

``emulated_cluster`` is a pytest fixture (a conftest imports it, as
``tests/emulated/conftest.py`` does): a factory, ``emulated_cluster(3, postgres=True, ...)``, of
:class:`~shardsink.testing.emulated.EmulatedCluster`\\ s (keyword arguments
as it takes them; the data dir defaults to one under the test's
``tmp_path``). At teardown each is closed, and it is proven that nothing it
made is left: no namespace (and so no veth, bridge, rule or queue: they live
and die with the namespaces), no process in them, no state or scratch
directory, no new root-namespace interface (:func:`.netns.assert_removed`),
none of the processes its hosts ran (Ray's, the servers', what
``popen_on`` started) alive anywhere, and no shared-memory segment they
made. On a machine that cannot run one (not root, a tool, Ray, PostgreSQL
or SeaweedFS missing) a test is skipped with the reason, and fails with
``CI=true``.

Each cluster runs its own Ray nodes (three took about 1.2 GiB and 10 s to
start here), apart from the session's Ray cluster of ``tests/conftest.py``.
"""

from __future__ import annotations

import pytest

from .._pids import process_start
from ..netns import each
from .emulated import EmulatedCluster, hosts_processes, segments_of
from .netns import Footprint, assert_removed, footprint, require, root_interfaces


def close_and_prove(cluster: EmulatedCluster, made: Footprint) -> None:
    """Close ``cluster`` (its network's footprint ``made``) and assert that
    nothing it made is left (module doc)."""
    assert cluster.network is not None
    inside = hosts_processes(cluster.network)
    cluster.close()
    assert_removed(made)
    alive = sorted(pid for pid, start in inside if start and process_start(pid) == start)
    assert not alive, f"processes of the emulated hosts still run: {alive}"
    segments = [str(s) for s in segments_of(inside)]
    assert not segments, f"shared-memory segments of the emulated hosts left: {segments}"


@pytest.fixture
def emulated_cluster(tmp_path):
    """A factory of :class:`EmulatedCluster`: ``emulated_cluster(hosts=3,
    **kwargs)``; every one made is closed and proven gone at teardown."""
    made: list[tuple[EmulatedCluster, Footprint]] = []

    def make(hosts: int = 3, **kwargs) -> EmulatedCluster:
        needs = {name: kwargs.get(name, False) for name in ("postgres", "s3", "clocks")}
        require([lambda: EmulatedCluster.check(**needs)])
        kwargs.setdefault("data_dir", tmp_path / f"emulated{len(made)}")
        before = root_interfaces()
        cluster = EmulatedCluster(hosts, run="test", **kwargs)
        assert cluster.network is not None
        made.append((cluster, footprint(cluster.network, before)))
        return cluster

    yield make
    each(reversed(made), lambda pair: close_and_prove(*pair))  # every one, whichever fails
