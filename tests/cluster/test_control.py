"""Operating a running cluster: ``shardsink status`` and ``shardsink stop`` from
another process, through the control socket its data dir's lock names, and
SIGTERM stopping ``up`` as Ctrl-C does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import msgspec
import psutil
import pytest
import zmq

from shardsink import datadir
from shardsink.cluster import Cluster, ClusterConfig
from shardsink.cluster.control import (
    ControlServer,
    Refused,
    Status,
    StatusRequest,
    Stopping,
    StopRequest,
    StopRequested,
)
from shardsink.shm import list_segments
from tests.helpers.cli import ENV, scrape, shardsink, start_up
from tests.helpers.wait import wait_until


def _up(popen, data: Path) -> tuple[subprocess.Popen, str]:
    """A 1x2 realtime cluster that would run for minutes; its id once it is up."""
    proc, cluster_id, _ = start_up(
        popen,
        data,
        *("--groups", "1", "--workers", "2", "--pace", "realtime", "--interval-ms", "100"),
        *("--intervals", "3000"),
    )
    return proc, cluster_id


def _status(data: Path) -> dict:
    done = shardsink("status", "--data-dir", str(data), "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _wait_appends(data: Path, n: int) -> dict:
    def appended() -> dict | None:
        status = _status(data)
        return status if status["appends"] >= n else None

    return wait_until(appended, 60, f"{n} appends", every_s=0.2)  # each look runs status


def _ends_cleanly(proc: subprocess.Popen, children, cluster_id: str, message: str) -> dict:
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert f"{message}: stopping cleanly" in err
    stats = json.loads(out)
    assert stats["verified"] is True
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    assert list_segments(cluster_id) == []
    return stats


def test_status_lists_every_process_and_stop_ends_the_run(tmp_path, popen):
    data = tmp_path / "d"
    proc, cluster_id = _up(popen, data)
    status = _wait_appends(data, 3)
    children = psutil.Process(proc.pid).children(recursive=True)
    by_pid = {c.pid: c for c in children}
    listed = status["processes"]
    assert [p["kind"] for p in listed].count("worker") == 2
    assert {p["kind"] for p in listed} == {"coordinator", "consensus", "builder", "worker"}
    assert all(p["alive"] and p["rss_bytes"] > 0 for p in listed), listed
    coordinator, *rest = listed
    assert coordinator["pid"] == proc.pid and status["coordinator_pid"] == proc.pid
    for p in rest:  # every child named is a live child of up, and every such child is named
        assert p["pid"] in by_pid, p
    zygote = {c.pid for c in children if c.name() == "shardsink zygote"}
    assert {p["pid"] for p in rest} == set(by_pid) - zygote
    assert (status["cluster_id"], status["groups"], status["workers"]) == (cluster_id, 1, 2)
    assert status["upper"] == status["appends"] * 100 and status["intervals_per_s"] > 1
    assert status["append_latency_ms_p99"] >= status["append_latency_ms_p50"] > 0
    assert status["consensus"].startswith("ipc://")
    assert status["metrics"] is None and status["dashboard"] is None
    assert status["data_parts"] == round(status["data_parts_per_append"] * status["appends"])

    text = shardsink("status", "--data-dir", str(data))
    assert text.returncode == 0 and "1x2 best-effort" in text.stdout and "g0/w1" in text.stdout

    stop = shardsink("stop", "--data-dir", str(data))
    assert stop.returncode == 0, stop.stderr
    assert f"stopped the cluster of coordinator pid {proc.pid}" in stop.stdout
    assert proc.poll() is not None  # stop returned once up had exited
    stats = _ends_cleanly(proc, children, cluster_id, "stop requested over the control socket")
    assert stats["appends"] >= status["appends"]
    gone = shardsink("status", "--data-dir", str(data))
    assert gone.returncode == 1 and f"no cluster runs on data dir {data}" in gone.stderr


def test_sigterm_stops_up_as_ctrl_c_does_and_a_watch_ends_with_it(tmp_path, popen):
    data = tmp_path / "d"
    proc, cluster_id = _up(popen, data)
    _wait_appends(data, 2)
    children = psutil.Process(proc.pid).children(recursive=True)
    watch = popen(
        [
            *(sys.executable, "-m", "shardsink.cli", "status", "--data-dir", str(data)),
            *("--json", "--watch", "0.2"),
        ],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen = [json.loads(watch.stdout.readline())["appends"] for _ in range(3)]
    assert seen == sorted(seen) and seen[-1] > seen[0] >= 2
    proc.send_signal(signal.SIGTERM)
    assert _ends_cleanly(proc, children, cluster_id, "SIGTERM")["appends"] >= seen[-1]
    _, err = watch.communicate(timeout=30)
    assert watch.returncode == 0, err
    assert f"the cluster of coordinator pid {proc.pid} has ended" in err


def test_no_cluster_and_a_stale_lock_are_reported_not_obeyed(tmp_path):
    for command in ("status", "stop"):
        done = shardsink(command, "--data-dir", str(tmp_path / "none"))
        assert done.returncode == 1
        assert done.stderr == f"shardsink {command}: no cluster runs on data dir " + str(
            tmp_path / "none\n"
        )
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    holder = datadir.Holder(
        pid=int(dead.stdout), start=1, kind=datadir.COORDINATOR, control="ipc:///nowhere"
    )
    (tmp_path / datadir.LOCK_NAME).write_bytes(msgspec.json.encode(holder))
    done = shardsink("stop", "--data-dir", str(tmp_path))
    assert done.returncode == 1
    assert f"its lock names coordinator pid {dead.stdout.strip()}" in done.stderr
    assert "no longer running (a stale lock" in done.stderr


def test_control_server_answers_strictly(tmp_path):
    status = Status(
        **dict.fromkeys(("cluster_id", "data_dir", "shard", "mode", "workload", "pace"), "x"),
        **dict.fromkeys(("coordinator_pid", "groups", "workers", "upper", "appends"), 1),
        **dict.fromkeys(("restarts", "consensus_restarts", "abandoned_attempts"), 0),
        **dict.fromkeys(("data_parts", "blob_puts"), 0),
        **dict.fromkeys(("window_s", "intervals_per_s", "append_latency_ms_p50"), 0.0),
        **dict.fromkeys(("append_latency_ms_p99", "data_parts_per_append"), 0.0),
        **dict.fromkeys(("blob_puts_per_append", "diff_bytes_per_append"), 0.0),
        appends_in_window=0,
        consensus="ipc:///c",
        metrics=None,
        dashboard=None,
        processes=[],
    )
    server = ControlServer(tmp_path, lambda: status)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(server.address)

    def ask(raw: bytes):
        sock.send(raw)
        while not sock.poll(10):
            server.poll()
        return msgspec.json.decode(sock.recv(), type=Status | Stopping | Refused)

    try:
        assert ask(msgspec.json.encode(StatusRequest())) == status
        refused = ask(b'{"type": "status", "extra": 1}')
        assert isinstance(refused, Refused) and "extra" in refused.error
        assert isinstance(ask(b'{"type": "reboot"}'), Refused)
        sock.send(msgspec.json.encode(StopRequest()))

        def stop_requested() -> bool:  # polled until the request arrives: then it raises
            try:
                server.poll()
            except StopRequested:
                return True
            return False

        wait_until(stop_requested, 10, "StopRequested from the server's poll")
        assert msgspec.json.decode(sock.recv(), type=Stopping) == Stopping(os.getpid())
    finally:
        sock.close()
        ctx.term()
        server.close()


def test_metrics_rise_while_it_runs_and_end_equal_to_the_summary(tmp_path):
    config = ClusterConfig(
        data_dir=str(tmp_path), groups=1, workers=2, intervals=5, metrics_port=0, verify=False
    )
    seen: list[dict[str, float]] = []
    with Cluster(config) as cluster:
        url = cluster.metrics.url
        assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
        stats = cluster.run(on_append=lambda record: seen.append(scrape(url)))
        final = scrape(url)
        assert cluster.status().metrics == url
        pids = {p.pid: p.kind for p in cluster.processes()}
    assert [s["shardsink_appends_total"] for s in seen] == [1, 2, 3, 4, 5]
    assert [s["shardsink_append_latency_seconds_count"] for s in seen] == [1, 2, 3, 4, 5]
    assert final["shardsink_appends_total"] == stats.appends == 5
    assert final["shardsink_rows_total"] == stats.rows
    assert final["shardsink_blob_puts_total"] == stats.blob_puts > 0
    assert final["shardsink_blob_put_bytes_total"] == stats.blob_put_bytes
    assert final["shardsink_diff_bytes_total"] == pytest.approx(stats.diff_bytes_per_append * 5)
    assert final["shardsink_data_parts_total"] == pytest.approx(stats.data_parts_per_append * 5)
    assert final["shardsink_append_latency_seconds_sum"] == pytest.approx(
        sum(r.latency_ms for r in cluster.records) / 1000
    )
    assert final["shardsink_restarts_total{kind=group}"] == stats.restarts == 0
    rss = {k: v for k, v in final.items() if k.startswith("shardsink_process_resident")}
    assert len(rss) == len(pids) == 5 and all(v > 0 for v in rss.values())
    kinds = sorted(k.split("kind=")[1].split(",")[0] for k in rss)
    assert kinds == sorted(pids.values())
    with pytest.raises(urllib.error.URLError):  # the server stopped with the cluster
        scrape(url)
