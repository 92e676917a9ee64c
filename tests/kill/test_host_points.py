"""``coalesce`` host under SIGKILL: a group builder and the host builder
killed mid interval, and the last finisher at each level (the group builder
that finished last at the host builder, the worker it relays the host batch
to). Each time the host builder and every group are restarted, the interval
is redone by a new attempt, the shard equals the expected collection (nothing
lost, nothing doubled) and nothing of the cluster is left."""

from __future__ import annotations

import pytest

from shardsink import faults
from tests.helpers.cluster import run_cluster, sweep_leaked

#: 100 rows per worker: the host batch is a Parquet part in blob, not inline.
ROWS = 400
GROUPS = 2


@pytest.mark.parametrize("mode", ["barrier", "best-effort"])
@pytest.mark.parametrize(
    ("spec", "leaks"),
    [
        # a group builder, about to pass its generation on: nothing written yet
        ("builder.before_forward:kill@builder g1", 0),
        # the host builder, its part written and not handed over
        ("builder.after_upload:kill@builder host", 1),
        # the group builder that finished last at the host, holding the host batch
        ("builder.host_last:kill", 1),
        # the worker it relayed the host batch to, before its report
        ("worker.last_finisher:kill", 1),
    ],
    ids=lambda v: str(v).split(":")[0],
)
def test_a_kill_mid_interval_redoes_it(tmp_path, monkeypatch, mode, spec, leaks):
    fault_dir = tmp_path / "f"
    for name, value in faults.environ([spec], seed=1, fault_dir=fault_dir).items():
        monkeypatch.setenv(name, value)
    run = run_cluster(
        tmp_path / "d",
        4,
        groups=GROUPS,
        workers=2,
        mode=mode,
        coalesce="host",
        rows_per_interval=ROWS,
    )
    point = spec.split(":")[0]
    assert [(f["point"], f["action"]) for f in faults.fired(fault_dir)] == [(point, "kill")]
    stats = run.stats
    assert stats.verified is True, stats.verify_detail
    # the host builder and every group restart together, once
    assert stats.restarts == GROUPS and stats.abandoned_attempts == 1
    leaked = sweep_leaked(tmp_path / "d", 4 * ROWS)
    redone = [(r.interval, r.attempt) for r in run.records]
    if mode == "barrier":
        assert redone == [(0, 1), (1, 0), (2, 0), (3, 0)]
        assert all(r.data_parts + r.inline_parts == 1 for r in run.records)
        assert len(leaked) == leaks
    else:
        # a best-effort host batch may hold part of an interval only: small
        # enough to be inline (no upload, nothing to leak), so the point may
        # first fire in a later interval
        assert [i for i, _ in redone] == [0, 1, 2, 3] and sum(a for _, a in redone) == 1
        assert len(leaked) <= leaks
