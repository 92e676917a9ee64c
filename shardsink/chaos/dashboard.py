"""``shardsink chaos --dashboard``: the cluster's live dashboard
(:mod:`shardsink.cluster.dashboard`), with the faults the nemesis injects
shown as events as they happen."""

from __future__ import annotations

import sys
from collections import Counter

from .. import faults
from ..cluster import ControlSource, Dashboard, Plan
from .context import RunContext
from .nemesis import Nemesis
from .schedule import kind_of


class ChaosSource(ControlSource):
    """The cluster of a chaos run, found through its data dir's lock at each
    sample (a killed coordinator is followed by a new one), and the faults
    injected since the previous sample: the nemesis's signals by kind, and
    every fault point firing recorded in the run's fault dir."""

    def __init__(self, run: RunContext, nemesis: Nemesis) -> None:
        super().__init__(data_dir=str(run.data))
        self._nemesis = nemesis
        self._fault_dir = run.fault_dir
        self._signalled: Counter[str] = Counter()
        self._fired = 0

    def faults(self) -> list[str]:
        signalled = Counter(self._nemesis.signalled)  # a copy: the nemesis thread counts on
        out = [
            f"{kind}: signal sent" + (f" ({n} of them)" if n > 1 else "")
            for kind, n in sorted((signalled - self._signalled).items())
        ]
        self._signalled = signalled
        fired = faults.fired(self._fault_dir)
        out += [
            f"{kind_of(f['point'], f['action'])}: {f['point']}:{f['action']} fired in "
            f"{f['role'] or 'a process'} (pid {f['pid']})"
            for f in fired[self._fired :]
        ]
        self._fired = len(fired)
        return out


def open_dashboard(run: RunContext, nemesis: Nemesis) -> Dashboard | None:
    """The run's dashboard if its config asks for one (``None`` otherwise);
    its URL is printed on stderr."""
    if run.config.dashboard is None:
        return None
    board = Dashboard(
        ChaosSource(run, nemesis),
        run.config.dashboard,
        title=f"shardsink chaos (seed {run.config.seed})",
        # no end: the run lasts its duration, its coordinator runs until stopped
        plan=Plan(rows_per_interval=run.config.rows_per_interval),
    )
    print(f"dashboard at {board.url}", file=sys.stderr, flush=True)
    return board
