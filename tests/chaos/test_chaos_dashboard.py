"""``shardsink chaos --dashboard``: the cluster's dashboard, with the faults the
nemesis injects shown as events as they happen."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections import Counter

import pytest

from shardsink.chaos import ChaosConfig, run_chaos


def test_faults_and_restarts_show_on_the_dashboard_as_they_happen(tmp_path, capsys) -> None:
    config = ChaosConfig(
        duration_s=15,
        seed=5,
        data_dir=str(tmp_path / "run"),
        groups=1,
        workers=2,
        faults=("kill-worker", "blob-errors", "kill-coordinator"),
        mean_gap_s=1.5,
        dashboard="127.0.0.1:0",
    )
    seen: dict = {"url": None, "pids": set(), "events": []}

    def tick(status: dict) -> None:
        if seen["url"] is None:
            seen["url"] = re.search(r"dashboard at (\S+)", capsys.readouterr().err).group(1)
        with urllib.request.urlopen(seen["url"] + "api/state", timeout=10) as response:
            state = json.loads(response.read())
        if state["status"] is not None:
            seen["pids"].add(state["status"]["coordinator_pid"])
        seen["events"] = state["events"]
        seen["plan"] = state["plan"]

    report = run_chaos(config, on_tick=tick)
    assert report.violations == []
    assert seen["plan"] == {"intervals": None, "rows_per_interval": 200}  # no end: no ETA
    faults = Counter(e["text"].split(":")[0] for e in seen["events"] if e["kind"] == "fault")
    injected = {kind: n for kind, n in report.injected.items() if n}
    assert faults and set(faults) <= set(injected), (faults, injected)
    texts = [e["text"] for e in seen["events"]]
    if report.injected.get("kill-worker"):  # the dashboard saw the group come back
        assert any(e["kind"] == "restart" for e in seen["events"]), texts
    assert any("answering" in t for t in texts)
    if report.coordinator_starts > 1:  # a killed coordinator's successor is found again
        assert len(seen["pids"]) > 1 or any("stopped answering" in t for t in texts)
    with pytest.raises(urllib.error.URLError):  # closed with the run
        urllib.request.urlopen(seen["url"], timeout=5)
