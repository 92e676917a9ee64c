"""``bench cluster --matrix hosts``: local against 1, 2 and 3 hosts, every
variant; a run on hosts of the session's real Ray cluster, its table and plot."""

from __future__ import annotations

from collections import Counter

import msgspec
import pytest

from shardsink.bench.cluster import VARIANTS, RunSpec, matrix, run_one
from shardsink.bench.cluster.hosts import (
    HOST_COUNTS,
    LOCAL_GROUPS,
    REPEATS,
    ROWS_PER_GROUP,
    config_for,
    plot,
    report_lines,
)
from shardsink.config import ClusterConfig


def test_the_matrix_runs_every_variant_locally_and_on_each_number_of_hosts() -> None:
    runs = matrix("hosts")
    assert len(runs) == REPEATS * len(HOST_COUNTS) * len(VARIANTS)
    cells = Counter((r.hosts, r.mode, r.coalesce) for r in runs)
    assert set(cells.values()) == {REPEATS}
    for r in runs:  # the same work per group whatever the shape
        assert r.groups == (r.hosts or LOCAL_GROUPS)
        assert r.rows_per_interval == ROWS_PER_GROUP * r.groups


def test_a_run_on_hosts_gets_each_hosts_groups_and_a_local_one_stays_local() -> None:
    spec = RunSpec(section="hosts", mode="barrier", groups=2, workers=2, workload="trickle",
                   rows_per_interval=10, intervals=1, hosts=2)  # fmt: skip
    on_ray = config_for(spec, ClusterConfig(hosts="ray:127.0.0.1:1", groups=2))
    assert (on_ray.groups, on_ray.max_hosts) == (1, 2)
    local = msgspec.structs.replace(spec, hosts=0)
    assert config_for(local, ClusterConfig(hosts="ray:127.0.0.1:1")).hosts == "local"
    with pytest.raises(ValueError, match="needs a Ray cluster"):
        config_for(spec, ClusterConfig())


def test_a_run_on_two_hosts_has_one_part_per_host(tmp_path, ray_cluster) -> None:
    spec = RunSpec(section="hosts", mode="barrier", coalesce="host", groups=2, workers=2,
                   workload="trickle", rows_per_interval=400, intervals=3, hosts=2)  # fmt: skip
    base = ClusterConfig(hosts=f"ray:{ray_cluster.address}", blob_shared=True)
    row = run_one(spec, tmp_path / "run", base)
    assert row["verified"] is True, row.get("error")
    assert row["data_parts_per_append"] + row["inline_parts_per_append"] == 2.0
    lines = report_lines([row])
    assert any("| host barrier | 2 hosts | 1 |" in line for line in lines), lines
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    (path,) = plot(plt, [row], tmp_path)
    assert path.name == "hosts.png" and path.stat().st_size > 10_000
