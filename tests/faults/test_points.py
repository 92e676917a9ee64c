"""Fault points: parsing, seeded replay, shared budgets, and the actions."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from shardsink import faults
from shardsink.cli import main as cli_main
from shardsink.storage.errors import DeterminateError, IndeterminateError


@pytest.fixture(autouse=True)
def _disarm():
    yield
    faults.disarm()


def test_specs_parse_with_clear_errors() -> None:
    assert faults.parse("append.before_cas:kill") == faults.FaultSpec("append.before_cas", "kill")
    assert faults.parse("gc.before_delete:pause:0.5:0").times == 0
    with pytest.raises(ValueError, match=r"unknown point 'nope'; known: worker\.after_encode"):
        faults.parse("nope:kill")
    with pytest.raises(ValueError, match="unknown action 'explode'"):
        faults.parse("append.before_cas:explode")
    with pytest.raises(ValueError, match="PROB must be in"):
        faults.parse("append.before_cas:kill:2")
    with pytest.raises(ValueError, match="expected NAME:ACTION"):
        faults.parse("append.before_cas")


def _firings(seed: int, hits: int, fault_dir=None) -> list[int]:
    faults.arm(
        ["append.before_cas:determinate:0.3:0"], seed=seed, role="coordinator", fault_dir=fault_dir
    )
    out = []
    for i in range(hits):
        try:
            faults.point("append.before_cas")
        except DeterminateError:
            out.append(i)
    return out


def test_the_seed_replays_the_same_faults() -> None:
    first = _firings(7, 200)
    assert first == _firings(7, 200)
    assert first != _firings(8, 200)
    assert 30 < len(first) < 90  # about 30% of 200


def test_a_restarted_role_draws_afresh_and_a_fresh_fault_dir_replays(tmp_path) -> None:
    first, again = _firings(7, 200, tmp_path / "a"), _firings(7, 200, tmp_path / "a")
    assert first == _firings(7, 200)  # incarnation 0 draws as without a fault dir
    assert again != first  # the restarted coordinator does not repeat its predecessor
    assert [first, again] == [_firings(7, 200, tmp_path / "b") for _ in range(2)]


def test_disarmed_and_other_points_do_nothing() -> None:
    faults.point("append.before_cas")
    faults.arm(["append.before_cas:indeterminate"])
    faults.point("append.after_cas")
    with pytest.raises(IndeterminateError, match=r"injected fault at append\.before_cas"):
        faults.point("append.before_cas")
    faults.point("append.before_cas")  # the budget (1) is spent


def _child(fault_dir, spec: str) -> subprocess.CompletedProcess:
    code = (
        "from shardsink import faults; faults.arm_from_env('worker g0/w0');"
        "faults.point('worker.before_report'); print('survived')"
    )
    env = {**os.environ, **faults.environ([spec], seed=1, fault_dir=fault_dir)}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )


def test_kill_fires_once_per_run_across_processes(tmp_path) -> None:
    first = _child(tmp_path, "worker.before_report:kill")
    assert first.returncode == -signal.SIGKILL
    second = _child(tmp_path, "worker.before_report:kill")  # a restarted process
    assert second.returncode == 0 and "survived" in second.stdout
    (record,) = faults.fired(tmp_path)
    assert record["point"] == "worker.before_report" and record["action"] == "kill"
    assert record["role"] == "worker g0/w0"


def test_environment_is_validated_before_anything_starts() -> None:
    with pytest.raises(ValueError, match="unknown point"):
        faults.environ(["worker.typo:kill"])


def test_a_point_takes_several_actions_but_not_one_twice(tmp_path) -> None:
    faults.arm(
        ["gc.before_delete:pause:1:1", "gc.before_delete:determinate:1:1"],
        fault_dir=tmp_path,
        pause_s=0.01,
    )
    with pytest.raises(DeterminateError):
        faults.point("gc.before_delete")
    assert [f["action"] for f in faults.fired(tmp_path)] == ["pause", "determinate"]
    with pytest.raises(ValueError, match="armed twice"):
        faults.arm(["gc.before_delete:kill", "gc.before_delete:kill:0.5"])


def test_store_points_take_only_storage_errors() -> None:
    with pytest.raises(ValueError, match=r"blob\.call takes determinate or indeterminate"):
        faults.parse("blob.call:kill")
    with pytest.raises(ValueError, match="not a store point"):
        faults.wrap_store("gc.before_delete", object())


def test_held_firings_keep_a_point_dormant_until_released_in_order(tmp_path) -> None:
    spec = faults.parse("append.before_cas:determinate:1:3")
    for n in range(3):
        faults.hold(tmp_path, spec, n)
    faults.arm([spec], fault_dir=tmp_path)
    faults.point("append.before_cas")  # held: nothing fires
    faults.release(tmp_path, spec, 0)
    with pytest.raises(DeterminateError):
        faults.point("append.before_cas")
    faults.point("append.before_cas")  # firing 1 is still held
    faults.release(tmp_path, spec, 1)
    faults.release(tmp_path, spec, 2)
    faults.arm([spec], fault_dir=tmp_path)  # a restarted process takes what is left
    for _ in range(2):
        with pytest.raises(DeterminateError):
            faults.point("append.before_cas")
    faults.point("append.before_cas")  # the budget (3) is spent
    assert len(faults.fired(tmp_path)) == 3


def test_a_point_armed_twice_for_one_process_is_refused_up_front() -> None:
    with pytest.raises(ValueError, match="armed twice with kill for one process"):
        faults.environ(["worker.after_push:kill", "worker.after_push:kill:1:2@worker g0/w3"])
    env = faults.environ(["worker.after_push:kill@worker g0/w1", "worker.after_push:kill@up"])
    assert env[faults.ENV_FAULTS].count("worker.after_push") == 2  # different processes
    faults.point("append.before_cas")  # the one firing is spent


def test_stores_opened_by_uri_fail_as_armed(tmp_path) -> None:
    """``blob.call`` and ``consensus.call`` wrap stores opened while armed
    (through ``faults.open_blob`` / ``faults.open_consensus``; storage's own
    openers never wrap):
    a determinate fault does not perform the call, an indeterminate one does
    and loses the answer; each firing is recorded; disarmed, nothing is wrapped."""
    from shardsink import storage
    from shardsink.faults import open_blob, open_consensus
    from shardsink.storage.contracts import VersionedData

    uri = f"file://{tmp_path}/blob"
    plain = open_blob(uri)
    assert type(plain).__name__ == "FileBlob"
    faults.arm(
        ["blob.call:determinate:1:1", "consensus.call:indeterminate:1:1"],
        fault_dir=tmp_path / "f",
        role="builder g0",
    )
    blob = open_blob(uri)
    unwrapped = storage.open_blob(uri)  # storage knows nothing of faults
    assert type(unwrapped).__name__ == "FileBlob"
    unwrapped.close()
    with pytest.raises(DeterminateError, match="set on file://"):
        blob.set("a", b"1")
    assert plain.get("a") is None  # not performed
    blob.set("a", b"1")  # the budget is spent
    assert plain.get("a") == b"1"
    consensus = open_consensus(f"sqlite://{tmp_path}/c.db")
    with pytest.raises(IndeterminateError, match="timeout after compare_and_set"):
        consensus.compare_and_set("s", None, VersionedData(0, b"x"))
    assert consensus.head("s") == VersionedData(0, b"x")  # performed
    fired = faults.fired(tmp_path / "f")
    assert [(f["point"], f["action"], f["role"]) for f in fired] == [
        ("blob.call", "determinate", "builder g0"),
        ("consensus.call", "indeterminate", "builder g0"),
    ]
    for store in (plain, blob, consensus):
        store.close()


def test_the_command_line_arms_a_point_in_every_process_it_starts(tmp_path) -> None:
    argv = [sys.executable, "-m", "shardsink.cli", "--fault", "worker.before_report:kill"]
    argv += ["--fault-dir", str(tmp_path / "f"), "up", "--data-dir", str(tmp_path / "d")]
    argv += ["--groups", "1", "--workers", "2", "--intervals", "3", "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    stats = json.loads(done.stdout)
    assert stats["verified"] is True and stats["restarts"] == 1 and stats["appends"] == 3
    (record,) = faults.fired(tmp_path / "f")
    assert record["point"] == "worker.before_report" and record["role"].startswith("worker g0/")
    bad = subprocess.run(
        [sys.executable, "-m", "shardsink.cli", "--fault", "worker.before_report:boom", "up"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "unknown action 'boom'" in bad.stderr


def _without_fault_dir() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != faults.ENV_DIR}


def test_up_without_a_fault_dir_fires_a_fault_once_per_run(tmp_path) -> None:
    """Armed through the environment with no fault dir, a kill of budget 1
    kills one worker of the whole run, not each worker and each restarted one
    again: the run's processes share the budget through its run directory,
    which is still removed at the end."""
    env = {**_without_fault_dir(), faults.ENV_FAULTS: "worker.after_push:kill:1:1"}
    argv = [sys.executable, "-m", "shardsink.cli", "up", "--data-dir", str(tmp_path / "d")]
    argv += ["--groups", "1", "--workers", "2", "--intervals", "4", "--pace", "max", "--json"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    stats = json.loads(done.stdout)
    assert stats["verified"] is True and stats["appends"] == 4
    assert stats["restarts"] == 1  # one worker killed, its group restarted once
    cluster_id = done.stderr.split()[1].rstrip(":")  # "cluster <id>: ..."
    assert not list(Path(tempfile.gettempdir()).glob(f"shardsink-run-{cluster_id}-*"))


def test_the_python_api_fires_a_fault_once_per_run(tmp_path, monkeypatch) -> None:
    """``Cluster`` gives the faults its environment arms a per-run budget too,
    and leaves the environment as it found it."""
    from shardsink.cluster import Cluster, ClusterConfig

    monkeypatch.delenv(faults.ENV_DIR, raising=False)
    monkeypatch.setenv(faults.ENV_FAULTS, "worker.after_push:kill:1:1")
    config = ClusterConfig(data_dir=str(tmp_path), groups=1, workers=2, pace="max")
    with Cluster(config) as cluster:
        stats = cluster.run(4)
        assert cluster.fault_dir is not None and cluster.fault_dir.is_relative_to(cluster.run_dir)
        assert os.environ[faults.ENV_DIR] == str(cluster.fault_dir)
        (record,) = faults.fired(cluster.fault_dir)
    assert record["point"] == "worker.after_push" and record["role"].startswith("worker g0/")
    assert stats.verified is True and stats.appends == 4 and stats.restarts == 1
    assert faults.ENV_DIR not in os.environ


def test_a_run_shares_this_process_budget_and_gives_it_back(tmp_path, monkeypatch) -> None:
    """While a run lasts, a process armed without a fault dir takes its
    firings from the run's budget, shared with the processes it starts;
    before and after, from its own. A fault dir given is the run's."""
    monkeypatch.delenv(faults.ENV_DIR, raising=False)
    monkeypatch.setenv(faults.ENV_FAULTS, "gc.before_delete:determinate:1:2")
    faults.arm_from_env("up")
    with pytest.raises(DeterminateError):
        faults.point("gc.before_delete")  # its own firing 0 of 2
    with faults.run_budgets(tmp_path / "run") as fault_dir:
        assert fault_dir == tmp_path / "run" and os.environ[faults.ENV_DIR] == str(fault_dir)
        with pytest.raises(DeterminateError):
            faults.point("gc.before_delete")  # the run's firing 0 of 2
        code = (
            "from shardsink import faults; faults.arm_from_env('worker g0/w0')\n"
            "for _ in range(3):\n"
            "    try: faults.point('gc.before_delete')\n"
            "    except Exception: print('fired')"
        )
        child = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
        )
        assert child.stdout.split() == ["fired"], child.stderr  # the run's firing 1, its last
        faults.point("gc.before_delete")  # the run's budget is spent
        assert [f["role"] for f in faults.fired(fault_dir)] == ["up", "worker g0/w0"]
    assert faults.ENV_DIR not in os.environ
    with pytest.raises(DeterminateError):
        faults.point("gc.before_delete")  # its own firing 1 of 2
    faults.point("gc.before_delete")  # its own budget is spent
    monkeypatch.setenv(faults.ENV_DIR, str(tmp_path / "given"))
    with faults.run_budgets(tmp_path / "run2") as fault_dir:
        assert fault_dir == tmp_path / "given"
    assert os.environ[faults.ENV_DIR] == str(tmp_path / "given")
    monkeypatch.delenv(faults.ENV_DIR)
    monkeypatch.delenv(faults.ENV_FAULTS)
    faults.disarm()
    with faults.run_budgets(tmp_path / "run3") as fault_dir:  # nothing armed: no fault dir
        assert fault_dir is None and faults.ENV_DIR not in os.environ


def test_fault_seed_or_dir_without_a_fault_is_refused(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli_main(["--fault-seed", "3", "shard", "inspect"])
    assert exit_.value.code == 2
    assert "--fault-seed and --fault-dir go with --fault" in capsys.readouterr().err


def test_a_role_arms_one_process_only(tmp_path) -> None:
    spec = faults.parse("worker.before_finish:determinate:1:2@worker g0/w3")
    assert spec.role == "worker g0/w3" and faults.parse(str(spec)) == spec
    faults.arm([spec], fault_dir=tmp_path, role="worker g0/w2")
    faults.point("worker.before_finish")  # another worker: not armed
    faults.arm([spec], fault_dir=tmp_path, role="worker g0/w3")
    with pytest.raises(DeterminateError):
        faults.point("worker.before_finish")
    assert faults.slot_name(spec, 1) == "worker.before_finish.determinate.worker_g0_w3.1"
    with pytest.raises(ValueError, match=r"NAME:ACTION\[:PROB\[:TIMES\]\]\[@ROLE\]"):
        faults.parse("worker.before_finish@worker g0/w3")
