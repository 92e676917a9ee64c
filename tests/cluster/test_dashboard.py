"""The live dashboard (``up --dashboard``): what it tells from two statuses,
its HTTP server, bad addresses, and the page itself in a real browser
(Debian's chromium driven by Playwright) while ``up`` runs."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import urllib.error
import urllib.request

import msgspec
import psutil
import pytest

from shardsink._http import HttpServer, parse_listen
from shardsink.cli import main
from shardsink.cluster import ClusterConfig
from shardsink.cluster.control import ProcessStatus, Status
from shardsink.cluster.dashboard import Watch, observe, sample_of
from shardsink.shm import list_segments
from tests.helpers.cli import ROOT, shardsink, start_up

#: Debian's chromium; Playwright's own browser builds are not fetched.
CHROMIUM = "/usr/bin/chromium"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _process(kind: str, name: str, pid: int, alive: bool = True) -> ProcessStatus:
    return ProcessStatus(
        kind=kind, name=name, pid=pid, alive=alive, rss_bytes=1 << 20, cpu_percent=1.0
    )


def _status(**changes) -> Status:
    status = Status(
        **dict.fromkeys(("cluster_id", "data_dir", "shard", "workload", "pace"), "x"),
        mode="barrier",
        coordinator_pid=10,
        groups=1,
        workers=1,
        upper=1000,
        appends=10,
        window_s=60.0,
        appends_in_window=10,
        **dict.fromkeys(("intervals_per_s", "append_latency_ms_p50"), 1.0),
        **dict.fromkeys(("append_latency_ms_p99", "data_parts_per_append"), 2.0),
        **dict.fromkeys(("blob_puts_per_append", "diff_bytes_per_append"), 2.0),
        data_parts=20,
        blob_puts=20,
        **dict.fromkeys(("restarts", "consensus_restarts", "abandoned_attempts"), 0),
        consensus="ipc:///c",
        metrics=None,
        dashboard=None,
        processes=[
            _process("coordinator", "coordinator", 10),
            _process("builder", "g0/b", 11),
            _process("worker", "g0/w0", 12),
        ],
    )
    return msgspec.structs.replace(status, **changes)


def _texts(events) -> list[str]:
    return [f"{e.kind}: {e.text}" for e in events]


def test_observe_tells_coordinators_restarts_and_exits() -> None:
    first = _status()
    watch, events = observe(Watch(), first, 1.0)
    assert _texts(events) == ["coordinator: coordinator pid 10 answering: 1x1 barrier, upper 1000"]
    assert observe(watch, first, 2.0) == (Watch(first, True), [])

    restarted = _status(
        restarts=1,
        abandoned_attempts=2,
        processes=[*first.processes[:2], _process("worker", "g0/w0", 13)],
    )
    watch, events = observe(watch, restarted, 3.0)
    assert _texts(events) == [
        "restart: group restarts: +1 (total 1)",
        "restart: attempts abandoned: +2 (total 2)",
        "restart: worker g0/w0: pid 12 -> 13",
    ]
    exited = _status(
        restarts=1,
        abandoned_attempts=2,
        processes=[*first.processes[:2], _process("worker", "g0/w0", 13, alive=False)],
    )
    watch, events = observe(watch, exited, 4.0)
    assert _texts(events) == ["exit: worker g0/w0 (pid 13) exited"]

    watch, events = observe(watch, None, 5.0)
    assert _texts(events) == ["coordinator: coordinator pid 10 stopped answering"]
    assert observe(watch, None, 6.0) == (watch, [])  # said once
    _, events = observe(watch, exited, 7.0)
    assert _texts(events) == ["coordinator: coordinator pid 10 answering again"]
    _, events = observe(watch, _status(coordinator_pid=20, upper=5000), 7.0)
    assert _texts(events) == ["coordinator: coordinator pid 20 answering: 1x1 barrier, upper 5000"]


def test_a_sample_counts_parts_and_puts_over_the_appends_since_the_previous() -> None:
    before = _status()
    after = _status(appends=12, data_parts=23, blob_puts=24, upper=1200)
    sample = sample_of(before, after, 5.0)
    assert (sample.parts_per_append, sample.puts_per_append) == (1.5, 2.0)
    assert (sample.t, sample.upper, sample.appends) == (5.0, 1200, 12)
    assert (sample.latency_ms_p50, sample.latency_ms_p99) == (1.0, 2.0)
    assert sample_of(None, _status(appends_in_window=0), 5.0).latency_ms_p99 is None
    assert sample_of(after, after, 6.0).parts_per_append is None  # nothing appended
    assert sample_of(None, after, 6.0).puts_per_append is None
    other = _status(coordinator_pid=20, appends=30, data_parts=90, blob_puts=90)
    assert sample_of(after, other, 7.0).parts_per_append is None  # counts of another run


def test_the_http_server_serves_its_pages_only_and_survives_a_failing_one() -> None:
    def broken() -> tuple[str, bytes]:
        raise RuntimeError("no")

    server = HttpServer(
        {"/ok": lambda: ("text/plain", b"fine"), "/broken": broken}, "127.0.0.1", 0, "t"
    )
    try:
        with urllib.request.urlopen(f"{server.base}/ok?x=1", timeout=10) as response:
            assert response.read() == b"fine"
        for path, code in (("/nothing", 404), ("/broken", 500)):
            with pytest.raises(urllib.error.HTTPError) as caught:
                urllib.request.urlopen(server.base + path, timeout=10)
            assert caught.value.code == code
            caught.value.close()
        with urllib.request.urlopen(f"{server.base}/ok", timeout=10) as response:
            assert response.status == 200
    finally:
        server.close()
        server.close()  # idempotent


@pytest.mark.parametrize(
    ("listen", "message"),
    [
        ("10.1.2.3:8787", "only loopback addresses may be bound"),
        ("127.0.0.1:http", "invalid listen address '127.0.0.1:http'"),
        ("127.0.0.1:70000", "invalid listen address"),
    ],
)
def test_a_bad_dashboard_address_is_refused(tmp_path, capsys, listen, message) -> None:
    with pytest.raises(ValueError, match=message):
        parse_listen(listen)
    with pytest.raises(ValueError, match=message):
        ClusterConfig(dashboard=listen)
    assert main(["up", "--data-dir", str(tmp_path / "d"), "--dashboard", listen]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


def test_parse_listen_defaults_to_loopback() -> None:
    assert parse_listen("8787") == ("127.0.0.1", 8787)
    assert parse_listen(":0") == ("127.0.0.1", 0)
    assert parse_listen("localhost:9000") == ("localhost", 9000)


@pytest.fixture
def chromium():
    """Debian's chromium under Playwright: a browser, closed at teardown."""
    if not os.access(CHROMIUM, os.X_OK):
        if IN_CI:  # .ci/run installs it
            pytest.fail(f"{CHROMIUM} is missing (CI=true, so this fails)")
        pytest.skip(f"{CHROMIUM} is missing: apt-get install chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM)
        try:
            yield browser
        finally:
            browser.close()


def _observe(page) -> dict:
    """What the page shows now: the process table's rows and text, the
    latency chart's lines, the appends figure."""
    rows = page.locator("#processes tbody tr")
    return {
        "pids": sorted(int(p) for p in rows.evaluate_all("rs => rs.map(r => r.dataset.pid)")),
        "table": page.inner_text("#processes tbody"),
        "latency": page.locator("#chart-latency path.series").evaluate_all(
            "ps => ps.map(p => p.getAttribute('d'))"
        ),
        "figures": page.inner_text("#figures"),
    }


def _check_what_the_page_shows(page) -> None:
    """Progress toward --intervals, rows/s, parts and PUTs apart, clock-time
    axes, memory per kind, values on hover, no hosts table on one machine."""
    progress = page.inner_text("#progress-text")
    assert re.fullmatch(
        r"[\d,]+ of 3,000 intervals \([\d.]+%\), about .+ left at [\d.]+/s", progress
    )
    assert int(page.get_attribute("#progress-bar", "max")) == 3000
    assert "rows / s" in page.inner_text("#figures")
    for chart in ("chart-parts", "chart-puts", "chart-rows", "chart-rate", "chart-backlog"):
        assert len(page.locator(f"#{chart} path.series").evaluate_all("ps => ps")) == 1, chart
    ticks = page.locator("#chart-rate text.time").all_text_contents()
    assert ticks and all(re.fullmatch(r"\d\d:\d\d:\d\d", t) for t in ticks), ticks
    kinds = page.locator("#chart-memory path.series").evaluate_all(
        "ps => ps.map(p => p.dataset.key)"
    )
    assert kinds == ["coordinator", "consensus", "builder", "worker"]
    page.locator("#chart-latency").scroll_into_view_if_needed()  # the pointer must reach it
    box = page.locator("#chart-latency").bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.9, box["y"] + box["height"] / 2)
    tip = page.text_content("#chart-latency text.tip")
    assert re.fullmatch(r"\d\d:\d\d:\d\d  p50 [\d.,]+  p99 [\d.,]+", tip), tip
    assert page.locator("#hosts-section").is_hidden()


def test_the_dashboard_updates_live_in_chromium(tmp_path, popen, chromium) -> None:
    data = tmp_path / "d"
    proc, cluster_id, second = start_up(
        popen,
        data,
        *("--groups", "2", "--workers", "2", "--pace", "realtime", "--interval-ms", "200"),
        *("--intervals", "3000", "--dashboard"),
    )
    url = second.split("dashboard at ")[1].split(";")[0]
    assert url.startswith("http://127.0.0.1:") and url.endswith("/"), second
    children = psutil.Process(proc.pid).children(recursive=True)
    done = shardsink("status", "--data-dir", str(data), "--json")
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    assert status["dashboard"] == url

    page = chromium.new_page(viewport={"width": 1280, "height": 900})
    page.goto(url)
    assert len(status["processes"]) == 8  # coordinator, consensus, 2 builders, 4 workers
    page.wait_for_function(
        "document.querySelectorAll('#processes tbody tr').length === 8"
        " && document.querySelector('#chart-latency path.series').getAttribute('d').length > 0",
        timeout=30_000,
    )
    before = _observe(page)
    assert before["pids"] == sorted(p["pid"] for p in status["processes"])
    assert page.inner_text("#title") == f"shardsink up: cluster {cluster_id}"
    deadline = time.monotonic() + 60
    while True:  # values change while the cluster runs
        page.wait_for_timeout(1000)
        after = _observe(page)
        changed = {k for k in ("table", "latency", "figures") if after[k] != before[k]}
        if changed == {"table", "latency", "figures"}:
            break
        assert time.monotonic() < deadline, f"only {changed} changed in 60 s"
    assert after["pids"] == before["pids"]  # the same processes, nothing restarted
    assert "coordinator pid" in page.inner_text("#events")
    _check_what_the_page_shows(page)
    shot = tmp_path / "dashboard.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.read_bytes().startswith(b"\x89PNG")
    if os.environ.get("SHARDSINK_UPDATE_DOCS"):  # the README's picture, only when asked
        shutil.copyfile(shot, ROOT / "docs" / "dashboard.png")

    stop = shardsink("stop", "--data-dir", str(data), timeout=120)
    assert stop.returncode == 0, stop.stderr
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert json.loads(out)["verified"] is True
    page.wait_for_function(
        "document.getElementById('live').className === 'down'", timeout=15_000
    )  # the page says the run has ended
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    assert list_segments(cluster_id) == []


class _Fixed:
    """A source answering one status, with no faults."""

    def __init__(self, status: Status) -> None:
        self._status = status

    def status(self) -> Status:
        return self._status

    def faults(self) -> list[str]:
        return []


def test_the_hosts_of_a_ray_cluster_are_a_table_and_a_run_without_end_has_no_bar(
    chromium,
) -> None:
    from shardsink.cluster.dashboard import Dashboard, Plan
    from shardsink.coordinator.groups import HostInfo

    hosts = [
        HostInfo(index=0, hostname="node-a", node_id="f" * 40, address="10.0.0.1",
                 groups=(0, 2), restarts=1),
        HostInfo(index=1, hostname="node-b", node_id="e" * 40, address="10.0.0.2",
                 alive=False),
    ]  # fmt: skip
    board = Dashboard(_Fixed(_status(hosts=hosts)), "127.0.0.1:0", "hosts", plan=Plan())
    try:
        page = chromium.new_page()
        page.goto(board.url)
        page.wait_for_function("document.querySelectorAll('#hosts tbody tr').length === 2")
        rows = page.locator("#hosts tbody tr").all_inner_texts()
        assert [r.split("\t") for r in rows] == [
            ["node-a", "f" * 12, "10.0.0.1", "0, 2", "alive", "1"],
            ["node-b", "e" * 12, "10.0.0.2", "-", "lost", "0"],
        ]
        assert page.inner_text("#progress-text") == "10 intervals appended (no end set)"
        assert page.locator("#progress-bar").is_hidden()
        assert page.locator("#rows-section").is_hidden()  # no rows per interval given
    finally:
        board.close()
