"""The coordinator restarts its consensus process as often as it dies, also
when the one it just restarted dies again while the coordinator waits for
it (issue 41: it exited with status 2, "no reply ... within 5.0s")."""

from __future__ import annotations

import json

from shardsink import faults
from tests.helpers.cli import ENV, shardsink

KILLS = 3


def test_a_consensus_process_killed_again_after_each_restart_is_restarted_again(tmp_path):
    # killed at each of its first stores: the first start's, then each restart's
    # first store, so every restart dies while the coordinator waits for its reply
    fault = f"consensus.after_store:kill:1:{KILLS}@consensus"
    env = {**ENV, **faults.environ([fault], seed=0, fault_dir=tmp_path / "faults")}
    done = shardsink(
        "up", "--data-dir", str(tmp_path / "d"), "--groups", "1", "--workers", "2",
        "--intervals", "3", "--consensus-timeout-s", "1", "--json", env=env, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    fired = [f["point"] for f in faults.fired(tmp_path / "faults")]
    assert fired == ["consensus.after_store"] * KILLS
    stats = json.loads(done.stdout)
    assert stats["consensus_restarts"] == KILLS
    assert (stats["appends"], stats["verified"]) == (3, True)
