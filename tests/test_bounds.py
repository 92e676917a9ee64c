"""A cluster's shape against what the machine has (``check_machine``): each
limit refuses with one line naming the flags and the limit, and a shape that
fits passes, on a machine described here rather than read."""

from __future__ import annotations

import pyarrow as pa
import pytest

from shardsink._bounds import Machine, min_row_bytes, this_machine
from shardsink._units import MIB
from shardsink.config import ClusterConfig, check_machine, least_row_bytes
from shardsink.workloads import SCHEMA

GIB = 1 << 30
#: A small machine of its own: 2 CPUs, 8 GiB, room for 4,000 tasks, ulimit -n 1024.
SMALL = Machine(
    cpus=2,
    memory_bytes=8 * GIB,
    tasks_free=4000,
    tasks_limit="ulimit -u 4096",
    fds=1024,
    shm_bytes=64 * MIB,  # a container's default /dev/shm
)


def test_the_least_row_of_the_default_schema_and_of_any():
    assert least_row_bytes(ClusterConfig()) == min_row_bytes(SCHEMA) == 8 + 4 + 8 + 8
    assert least_row_bytes(ClusterConfig(workload="mine.py:Mine")) == 8 + 8  # ts, diff
    nested = pa.schema([("key", pa.large_string()), ("val", pa.struct([("a", pa.int32())]))])
    assert min_row_bytes(nested) == 8 + 4


def test_a_cluster_that_fits_passes():
    check_machine(ClusterConfig(groups=16, workers=8), SMALL)
    check_machine(ClusterConfig(groups=8, workers=8, start="spawn"), SMALL)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"groups": 100, "workers": 8},
            "--groups 100 --workers 8: 902 processes of 7 threads each need 6,314 tasks, but "
            "ulimit -u 4096 leaves room for 4,000 more",
        ),
        (
            {"groups": 60, "workers": 8},
            "--groups 60 --workers 8: the coordinator holds 2 descriptors a process, 1,113 in "
            "all, past ulimit -n 1,024",
        ),
        (
            {"groups": 20, "workers": 4, "start": "spawn"},
            "--groups 20 --workers 4: 101 processes take about 9.1 GiB (92.0 MiB each), but "
            "8.0 GiB of memory is available",
        ),
        (
            {"rows_per_interval": 400_000_000},
            "--rows-per-interval 400000000: an interval takes at least 10.4 GiB (28 bytes a "
            "row), but 8.0 GiB of memory is available",
        ),
        (
            {"workload": "hydrate", "snapshot_rows": 10**12},
            "--snapshot-rows 1000000000000: an interval takes at least",
        ),
        (
            {"groups": 1, "workers": 8, "rows_per_interval": 40_000_000, "shared_max_bytes": GIB},
            "--groups 1 --workers 8 --shared-max-bytes 1073741824 --rows-per-interval 40000000: "
            "the workers stage up to 512.0 MiB in /dev/shm at once, but it has 64.0 MiB free",
        ),
    ],
)
def test_each_limit_refuses_naming_the_flags(fields, message):
    with pytest.raises(ValueError) as refused:
        check_machine(ClusterConfig(**fields), SMALL)
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


def test_the_cpu_an_interval_needs_against_its_timeout():
    big = SMALL._replace(memory_bytes=1 << 50, tasks_free=10**9, fds=10**9)
    config = ClusterConfig(groups=10_000, workers=30, interval_timeout_s=60)
    with pytest.raises(
        ValueError, match=r"300,000 workers take at least 75 s an interval on 2 CPUs"
    ):
        check_machine(config, big)
    check_machine(ClusterConfig(groups=10_000, workers=30, interval_timeout_s=80), big)


def test_nothing_shared_stages_nothing():
    # every worker's slice is past the threshold, or nothing is shared: no /dev/shm asked for
    check_machine(ClusterConfig(rows_per_interval=40_000_000, mode="off"), SMALL)
    check_machine(ClusterConfig(rows_per_interval=40_000_000), SMALL)  # 1 MiB threshold


def test_groups_on_ray_nodes_are_not_checked_against_this_machine():
    check_machine(ClusterConfig(groups=100_000, hosts="ray:auto"), SMALL)


def test_this_machine_reads_plausible_figures():
    here = this_machine()
    assert here.cpus >= 1 and here.memory_bytes > 0 and here.fds > 0
    assert here.tasks_free > 0 and here.tasks_limit
