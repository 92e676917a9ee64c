"""The consensus server's allocator policy (``shardsink._allocator``): where a
merge's Arrow memory comes from and that its pages go back, each case in a
fresh interpreter (allocator settings are the process's own, taken when it
starts); that the server gets that environment however it starts; and that
the library leaves the allocators of a user's process alone."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pyarrow as pa
import pytest

from shardsink import open_shard
from shardsink._allocator import SERVER_ENV
from shardsink.cluster.verify import verify
from shardsink.persist import windows
from shardsink.persist.config import ShardConfig
from shardsink.process.consensus import ConsensusProcess
from shardsink.process.spawn import SpawnStarter
from shardsink.server.config import ServeConfig
from shardsink.workloads import Workload

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20

# A merge's Arrow work on 2M rows: concatenate, consolidate (group_by and
# sort), encode as Parquet and decode it again; then everything is dropped
# and the pages released as the server releases them after a pass. With
# ``in-process`` it first does what ``lean_allocators`` did, after pyarrow
# loaded: pyarrow's Python-level pool set to the system one.
_MERGE = """
import gc, json, sys
import psutil
import pyarrow as pa
if sys.argv[1] == "in-process":
    pa.set_memory_pool(pa.system_memory_pool())
from shardsink._allocator import release_freed_pages
from shardsink.persist import parts as P
from shardsink.workloads import Workload
process = psutil.Process()
workload = Workload("churn", rows_per_interval=200_000)
P.consolidate(workload.updates(0).slice(0, 1000))  # load the group-by's code first
gc.collect()
before = process.memory_info().rss
table = pa.concat_tables([workload.updates(i) for i in range(10)])
merged = P.consolidate(table)
part, data = P.blob_part(merged, "k")
back = P.decode_parquet(data, merged.schema)
assert back.num_rows == merged.num_rows
peak = process.memory_info().rss
table = merged = data = back = None
gc.collect()
release_freed_pages()
pools = {}
for name in ("mimalloc", "system"):
    pools[name] = getattr(pa, name + "_memory_pool")().max_memory()
print(json.dumps({
    "pool": pa.default_memory_pool().backend_name, "max_memory": pools,
    "grew": peak - before, "kept": process.memory_info().rss - before,
}))
"""


def _merge(setup: str, env: dict[str, str]) -> dict:
    # the parent's own allocator settings stay out of the child's
    inherited = {k: v for k, v in os.environ.items() if k not in ("ARROW_DEFAULT_MEMORY_POOL",)}
    out = subprocess.run(
        [sys.executable, "-c", _MERGE, setup],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        env={**inherited, "PYTHONPATH": str(ROOT), **env},
    )
    return json.loads(out.stdout.splitlines()[-1])


def test_in_the_server_environment_a_merge_allocates_from_the_system_pool_and_gives_it_back():
    got = _merge("-", SERVER_ENV)
    assert got["pool"] == "system"
    # every allocation of the merge, group_by's and Parquet's included, went
    # to glibc's malloc, none to mimalloc
    assert got["max_memory"]["mimalloc"] == 0
    assert got["max_memory"]["system"] >= 100 * MIB
    assert got["grew"] >= 100 * MIB
    # and once dropped and released, it is gone from the process
    assert got["kept"] < 0.2 * got["grew"], got


def test_setting_the_pool_once_pyarrow_has_loaded_leaves_the_merge_on_mimalloc():
    """What ``lean_allocators`` did: the merge's memory still came from the
    pool Arrow's C++ code chose when pyarrow loaded."""
    got = _merge("in-process", {})
    assert got["pool"] == "system"  # the Python-level default moved...
    assert got["max_memory"]["mimalloc"] >= 100 * MIB  # ...group_by's and Parquet's did not


def _environ(pid: int) -> dict[str, str]:
    """The environment ``pid`` started with (readable while ``SPT_NOENV``
    keeps setproctitle from writing the process title over it)."""
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(e.decode().split("=", 1) for e in raw if b"=" in e)


def test_the_consensus_process_is_a_fresh_interpreter_with_the_server_environment(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("SPT_NOENV", "1")
    monkeypatch.delenv("ARROW_DEFAULT_MEMORY_POOL", raising=False)
    server = ConsensusProcess(
        f"sqlite://{tmp_path}/c.db",
        f"file://{tmp_path}/blob",
        ServeConfig(bind=f"ipc://{tmp_path}/c"),
        timeout_s=60,
    )
    with server:
        pid = server.child.pid
        assert _environ(pid)["ARROW_DEFAULT_MEMORY_POOL"] == "system"
        assert isinstance(server.child.starter, SpawnStarter)
        assert psutil.Process(pid).ppid() == os.getpid()  # exec'd by us, no zygote's fork


def test_a_clusters_consensus_process_is_not_forked_from_its_zygote(tmp_path, monkeypatch):
    from shardsink import Cluster, ClusterConfig

    monkeypatch.setenv("SPT_NOENV", "1")
    monkeypatch.delenv("ARROW_DEFAULT_MEMORY_POOL", raising=False)
    config = ClusterConfig(groups=1, workers=1, intervals=1, data_dir=str(tmp_path / "d"))
    with Cluster(config) as cluster:
        assert cluster.zygote is not None  # the default start forks the others
        pid = cluster.consensus.child.pid
        assert _environ(pid)["ARROW_DEFAULT_MEMORY_POOL"] == "system"
        assert psutil.Process(pid).ppid() == os.getpid() != cluster.zygote.pid


@pytest.mark.parametrize("given", [None, "mimalloc"])
def test_consensus_serve_re_executes_itself_with_the_server_environment(tmp_path, popen, given):
    """Started by hand without the variable, the command re-executes itself
    (same pid) with it; a value the operator set stays."""
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    env.update(PYTHONPATH=str(ROOT), SPT_NOENV="1")
    if given is not None:
        env["ARROW_DEFAULT_MEMORY_POOL"] = given
    argv = [sys.executable, "-m", "shardsink.cli", "consensus", "serve"]
    argv += ["--data-dir", str(tmp_path / "d"), "--bind", f"ipc://{tmp_path}/sock/c"]
    proc = popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("listening on "), proc.stderr.read()
    assert _environ(proc.pid)["ARROW_DEFAULT_MEMORY_POOL"] == (given or "system")
    proc.terminate()
    assert proc.wait(60) == 0


def test_reading_compacting_and_verifying_leave_the_processs_allocators_alone(
    tmp_path, monkeypatch
):
    """No pool is chosen, switched or released, and no C library is loaded
    (``mallopt``, ``malloc_trim``), while a user's process writes, reads,
    compacts and verifies a shard."""
    calls: list[str] = []

    def recording(name, real):
        def call(*args, **kwargs):
            calls.append(name)
            return real(*args, **kwargs)

        return call

    workload = Workload("churn", rows_per_interval=3000, interval_ms=1)
    config = ShardConfig(inline_max_bytes=0, blob_target_bytes=1 << 20)
    monkeypatch.setattr(windows, "WHOLE_GET_BYTES", 0)  # every part through open_input
    blob, consensus = f"file://{tmp_path}/blob", f"sqlite://{tmp_path}/c.db"
    with open_shard("s", blob=blob, consensus=consensus, config=config, create=True) as shard:
        for name in (
            "default_memory_pool",
            "set_memory_pool",
            "system_memory_pool",
            "mimalloc_memory_pool",
            "jemalloc_memory_pool",
        ):
            monkeypatch.setattr(pa, name, recording(name, getattr(pa, name)))
        monkeypatch.setattr(ctypes, "CDLL", recording("CDLL", ctypes.CDLL))
        writer = shard.writer()
        for i in range(6):
            writer.compare_and_append_table(workload.updates(i), i, i + 1)
        streamed = shard.batches(window_rows=1024).read_all()
        assert shard.compact().applied >= 1
        assert verify(shard, workload, workload.interval_ms).ok
    monkeypatch.undo()
    assert streamed.equals(workload.expected(6))
    assert calls == []
