"""``shardsink consensus serve`` as a user runs it: Prometheus metrics
scraped while it serves appends, ``--config FILE.toml``, and
``$SHARDSINK_DATA_DIR`` (also for ``read`` and ``shard``)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from shardsink import datadir, open_shard
from shardsink.cli import main
from shardsink.workloads import Workload
from tests.helpers.cli import ENV, scrape, shardsink
from tests.helpers.wait import wait_until

#: 2,000 rows an interval: every part is too large to go inline, so each is a blob PUT.
WORKLOAD = Workload("churn", rows_per_interval=2000, interval_ms=1)


def _serve(popen, *args: str, env: dict[str, str] | None = None) -> tuple:
    """``consensus serve ARGS``; its process, its address and the lines before it."""
    proc = popen(
        [sys.executable, "-m", "shardsink.cli", "consensus", "serve", *args],
        env=env or ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines = []
    while not (line := proc.stdout.readline()).startswith("listening on "):
        assert line, proc.stderr.read()
        lines.append(line.strip())
    return proc, line.removeprefix("listening on ").strip(), lines


def _stop(proc) -> None:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err


def test_metrics_count_what_the_server_did(tmp_path, popen) -> None:
    data = tmp_path / "d"
    proc, address, lines = _serve(
        popen,
        *("--data-dir", str(data), "--bind", f"ipc://{tmp_path}/sock/c", "--metrics-port", "0"),
        *("--compact-interval-s", "0.2", "--compact-slack", "1"),
    )
    url = lines[-1].removeprefix("metrics at ")
    assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics"), lines
    seen = []
    with open_shard(
        "default", blob=datadir.blob_uri(data), consensus=address, create=True
    ) as shard:
        writer = shard.writer()
        for i in range(4):
            writer.compare_and_append_table(WORKLOAD.updates(i), i, i + 1)
            seen.append(scrape(url))
        stats = shard.stats()

        def compacted() -> dict | None:
            metrics = scrape(url)
            return metrics if metrics.get("shardsink_compactions_total{shard=default}", 0) else None

        final = wait_until(compacted, 60, "a compaction in the metrics", every_s=0.2)
    on = "{shard=default}"
    assert [s[f"shardsink_appends_total{on}"] for s in seen] == [1, 2, 3, 4]
    assert [s[f"shardsink_append_latency_seconds_count{on}"] for s in seen] == [1, 2, 3, 4]
    assert final[f"shardsink_append_latency_seconds_sum{on}"] > 0
    assert final[f"shardsink_blob_puts_total{on}"] == stats.blob_puts == 4
    assert final[f"shardsink_blob_put_bytes_total{on}"] == stats.blob_put_bytes
    assert final[f"shardsink_diff_bytes_total{on}"] >= stats.diff_bytes > 0
    assert final[f"shardsink_shard_upper{on}"] == 4
    assert final[f"shardsink_compacted_batches_total{on}"] >= 2
    assert final["shardsink_process_resident_memory_bytes{kind=consensus,name=consensus}"] > 0
    assert final["shardsink_process_cpu_seconds_total{kind=consensus,name=consensus}"] > 0
    _stop(proc)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("gc_intervl = 5\n", "unknown key 'gc_intervl'"),
        ("gc_interval_s = -1.0\n", "gc_interval_s must be >= 0, got -1.0"),
        ('rollup_threshold = "many"\n', "Expected `int`, got `str` (key 'rollup_threshold')"),
        ("bind = [", "cannot read config file"),
        (
            "writer_lease_ms = 60000\nleaked_blob_grace_ms = 59999\n",
            "the leaked-blob sweep's grace (59999 ms) is shorter than the writer lease (60000 ms)",
        ),
    ],
)
def test_a_bad_serve_config_is_refused_naming_the_key(tmp_path, capsys, text, message) -> None:
    path = tmp_path / "serve.toml"
    path.write_text(text)
    argv = ["consensus", "serve", "--config", str(path), "--data-dir", str(tmp_path / "d")]
    assert main([*argv, "--bind", f"ipc://{tmp_path}/sock/c"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("shardsink consensus: error: ") and message in err, err
    assert str(path) in err or "cannot read" not in message
    assert not (tmp_path / "d").exists()


def test_a_serve_config_file_serves_and_flags_override_it(tmp_path, popen) -> None:
    data = tmp_path / "d"
    path = tmp_path / "serve.toml"
    path.write_text(
        f'bind = "ipc://{tmp_path}/sock/file"\ndata_dir = "{data}"\nwriter_lease_ms = 60000\n'
    )
    proc, address, _ = _serve(popen, "--config", str(path))
    assert address == f"ipc://{tmp_path}/sock/file"
    assert datadir.recorded_holder(data).address == address
    _stop(proc)
    proc, address, _ = _serve(popen, "--config", str(path), "--bind", f"ipc://{tmp_path}/s2/c")
    assert address == f"ipc://{tmp_path}/s2/c"
    _stop(proc)


def test_no_bind_is_refused(tmp_path, capsys) -> None:
    assert main(["consensus", "serve", "--data-dir", str(tmp_path)]) == 2
    assert "give the address to serve at: --bind ADDR" in capsys.readouterr().err


def test_serve_read_and_shard_take_the_data_dir_from_the_environment(tmp_path, popen) -> None:
    data = tmp_path / "d"
    env = {**ENV, datadir.DATA_DIR_ENV: str(data)}
    proc, address, _ = _serve(popen, "--bind", f"ipc://{tmp_path}/sock/c", env=env)
    holder = datadir.recorded_holder(data)
    assert holder.kind == datadir.CONSENSUS_SERVER and holder.address == address
    with open_shard(
        "default", blob=datadir.blob_uri(data), consensus=address, create=True
    ) as shard:
        shard.writer().compare_and_append_table(WORKLOAD.updates(0), 0, 1)

    def output(*args: str) -> str:
        done = shardsink(*args, env=env, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert json.loads(output("shard", "inspect", "--json"))["upper"] == 1
    assert len(output("read", "--format", "csv").splitlines()) == 1 + 2000
    _stop(proc)
