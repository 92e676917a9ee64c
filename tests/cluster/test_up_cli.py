"""``shardsink up``: the bare default, Ctrl-C, resuming, and bad input
refused with a clear error before anything starts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import msgspec
import psutil
import pyarrow as pa
import pytest
import setproctitle

from shardsink import open_shard
from shardsink._curve import server_keys
from shardsink.cli import main
from shardsink.cluster import Cluster, ClusterConfig
from shardsink.shm import list_segments
from shardsink.storage import DeterminateError
from tests.helpers.wait import wait_until

ROOT = Path(__file__).resolve().parents[2]


def _up(popen, cwd: Path, *args: str) -> subprocess.Popen:
    return popen(
        [sys.executable, "-m", "shardsink.cli", "up", *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_bare_up_runs_the_default_and_verifies(tmp_path, popen):
    proc = _up(popen, tmp_path)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    assert "verified" in out and "yes: equals the expected collection" in out
    assert "2x4 best-effort" in out and "20 (upper 20000)" in out
    assert (tmp_path / "shardsink-data" / "consensus.db").exists()


def test_ctrl_c_stops_cleanly_and_a_rerun_continues(tmp_path, popen):
    data = str(tmp_path / "d")
    args = ("--data-dir", data, "--groups", "1", "--workers", "2", "--interval-ms", "200", "--json")
    events = tmp_path / "events.jsonl"
    proc = _up(
        popen, tmp_path, *args, "--pace", "realtime", "--intervals", "500", "--events", str(events)
    )
    first = proc.stderr.readline()  # "cluster <id>: ..." once every process is up
    assert first.startswith("cluster "), first + proc.stderr.read()
    cluster_id = first.split()[1].rstrip(":")
    children = psutil.Process(proc.pid).children(recursive=True)
    assert {c.name() for c in children} >= {"shardsink consensus"}
    wait_until(
        lambda: events.exists() and len(events.read_text().splitlines()) >= 3, 60, "3 appends"
    )
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    stats = json.loads(out)
    assert stats["verified"] is True and stats["appends"] >= 3
    assert "interrupted" in err
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    assert list_segments(cluster_id) == []
    rerun = _up(popen, tmp_path, *args, "--intervals", "2")
    out, err = rerun.communicate(timeout=120)
    assert rerun.returncode == 0, err
    again = json.loads(out)
    assert again["upper"] == stats["upper"] + 400 and again["verified"] is True


def _children() -> set[int]:
    """This process's children (session fixtures' servers included)."""
    return {p.pid for p in psutil.Process().children()}


@pytest.fixture
def own_title():
    """``main(["up", ...])`` names this process; give it its name back."""
    title = setproctitle.getproctitle()
    yield
    setproctitle.setproctitle(title)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--groups", "0"], "groups must be >= 1, got 0"),
        (["--rows-per-interval", "-5"], "rows_per_interval must be >= 0, got -5"),
        (["--workload", "storm"], "unknown workload 'storm'"),
        (["--mode", "always"], "unknown mode 'always'; choose one of off, best-effort, barrier"),
        (["--blob", "memory://x"], "invalid blob URI 'memory://x'"),
        (["--shard", "../x"], "invalid shard name"),
    ],
)
def test_bad_input_is_refused_before_anything_starts(tmp_path, capsys, own_title, args, message):
    assert main(["up", "--data-dir", str(tmp_path / "d"), *args]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


def test_data_dir_of_another_schema_is_refused(tmp_path, capsys, own_title):
    config = ClusterConfig(data_dir=str(tmp_path))
    other = pa.schema([("key", pa.string()), ("val", pa.string())])
    with open_shard("default", blob=config.blob_uri, consensus=config.consensus_uri, schema=other):
        pass
    before = _children()
    assert main(["up", "--data-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "shardsink up: error: shard 'default' has schema" in err
    assert _children() == before


def test_consensus_address_nobody_answers(tmp_path):
    config = ClusterConfig(
        data_dir=str(tmp_path), consensus="tcp://127.0.0.1:9", consensus_timeout_s=0.5
    )
    before = _children()
    with pytest.raises(ValueError, match="accepts only CURVE clients"):  # no keys in keys/
        Cluster(config).start()
    server_keys(tmp_path / "keys")  # the data dir's keys, as a server there makes them
    with pytest.raises(DeterminateError, match=r"no consensus server answers at tcp://127.0.0.1:9"):
        Cluster(config).start()
    assert _children() == before


def test_a_killed_coordinator_takes_its_children_along_and_the_next_start_cleans_up(
    tmp_path, popen
):
    """SIGKILL the coordinator: every child dies with it (PDEATHSIG); the
    segments its workers left are removed by the next cluster's start, and so
    is its run directory. Any cluster's start sweeps what dead processes left
    (another test run's on this machine too), so what remains to sweep is
    whatever no other start took first; after ours, nothing of it does."""
    proc = _up(
        popen,
        tmp_path,
        *("--data-dir", str(tmp_path / "d"), "--groups", "1", "--workers", "2"),
        *("--rows-per-interval", "4000", "--pace", "realtime", "--interval-ms", "100"),
        *("--intervals", "500"),
    )
    first = proc.stderr.readline()
    assert first.startswith("cluster "), first + proc.stderr.read()
    cluster_id = first.split()[1].rstrip(":")
    children = psutil.Process(proc.pid).children(recursive=True)
    # parts of 2,000 rows go through arenas
    wait_until(lambda: list_segments(cluster_id), 30, "a worker's arena")
    run_dirs = list(Path(tempfile.gettempdir()).glob(f"shardsink-run-{cluster_id}-*"))
    assert len(run_dirs) == 1
    proc.kill()
    proc.wait(10)
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    config = ClusterConfig(data_dir=str(tmp_path / "e"), groups=1, workers=1, intervals=1)
    with Cluster(config) as cluster:
        assert list_segments(cluster_id) == []
        assert not run_dirs[0].exists()
        assert cluster.run().verified is True


def test_a_data_dir_in_use_is_refused(tmp_path):
    config = ClusterConfig(data_dir=str(tmp_path), groups=1, workers=1, intervals=1)
    in_use = rf"data dir {tmp_path} is in use by coordinator pid {os.getpid()}"
    with Cluster(config), pytest.raises(ValueError, match=in_use):
        Cluster(config).start()
    with Cluster(config) as again:  # released at close
        assert again.run().verified is True


def test_a_toml_file_runs_the_same_cluster_as_the_flags(tmp_path, popen):
    flags = ("--groups", "1", "--workers", "2", "--mode", "barrier", "--workload", "churn")
    flags += ("--rows-per-interval", "300", "--intervals", "3", "--shared-max-bytes", "1MiB")
    config = tmp_path / "c.toml"
    config.write_text(
        'groups = 1\nworkers = 2\nmode = "barrier"\nworkload = "churn"\n'
        'rows_per_interval = 300\nintervals = 3\nshared_max_bytes = "1MiB"\n'
    )
    runs = []
    for args in (flags, ("--config", str(config))):
        data = tmp_path / f"d{len(runs)}"
        proc = _up(popen, tmp_path, "--data-dir", str(data), "--json", *args)
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err
        runs.append(json.loads(out))
    expected = {"groups": 1, "workers": 2, "mode": "barrier", "workload": "churn"}
    expected |= {"rows_per_interval": 300, "appends": 3, "verified": True}
    shown = [*expected, "upper", "rows"]
    by_flags, by_file = ({k: run[k] for k in shown} for run in runs)
    assert by_flags == by_file and by_flags.items() >= expected.items()


def test_the_summary_names_a_workloads_own_arguments() -> None:
    """R= and S= are the built-ins' (with their [workload] table applied);
    any other workload is shown with the arguments it was made with."""
    from shardsink.cli._tables import workload_words
    from shardsink.cluster.stats import ClusterStats

    fields = {f: 0 for f in ClusterStats.__struct_fields__} | {
        "mode": "off", "coalesce": "group", "start": "fork", "restart_s": [],
        "peak_rss": {}, "verified": None,
    }  # fmt: skip
    trickle = ClusterStats(**fields | {"workload": "trickle", "rows_per_interval": 1000,
                                       "workload_args": {"rows_per_interval": 50}})  # fmt: skip
    assert workload_words(trickle) == "trickle (R=50, S=0)"
    synth = msgspec.structs.replace(
        trickle, workload="synth", workload_args={"rows_per_interval": 400, "key": "string"}
    )
    assert workload_words(synth) == "synth (rows_per_interval=400, key='string')"
