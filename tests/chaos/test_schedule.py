"""The nemesis's schedule: pure, seeded, and arming exactly what it releases."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from shardsink.chaos import FAULT_KINDS, ChaosConfig, schedule
from shardsink.chaos.schedule import (
    HOST_KINDS,
    NETWORK_AMOUNTS,
    NETWORK_KINDS,
    NETWORK_QUIET_S,
    PAUSES,
    POINTS,
    SHARED_POINTS,
    SIGNAL_TARGETS,
    check_kinds,
    firings,
    kind_of,
    point_specs,
)


def _events(
    seed: int, kinds=FAULT_KINDS, duration: float = 600.0, mode="barrier", hosts=False, **kw
):
    return schedule(
        seed, duration, kinds, mode=mode, mean_gap_s=3.0, pause_max_s=2.0, hosts=hosts, **kw
    )


def test_the_seed_replays_the_schedule() -> None:
    assert _events(7) == _events(7)
    assert _events(7) != _events(8)


def test_events_cover_every_kind_within_the_run() -> None:
    events = _events(1, hosts=True)
    assert 150 < len(events) < 260  # 596 s at one event per 3 s on average
    assert {e.kind for e in events} == set(FAULT_KINDS) - set(NETWORK_KINDS)
    assert all(2.0 <= e.at_s <= 598.0 for e in events)
    assert [e.at_s for e in events] == sorted(e.at_s for e in events)
    for e in events:
        if e.how == "signal":
            assert e.kind in SIGNAL_TARGETS and e.point == ""
        else:
            name, action = e.point.split(":")
            assert (name, action) in POINTS[e.kind]
        assert (0.1 <= e.pause_s <= 2.0) if e.kind in PAUSES else e.pause_s == 0.0
        assert 1 <= e.count <= (3 if e.kind.endswith("-errors") else 1)


def test_firings_count_a_burst_whole() -> None:
    events = _events(2)
    counted = firings(events)
    assert set(counted) == {e.kind for e in events}
    for kind in FAULT_KINDS:
        of_kind = [e for e in events if e.kind == kind]
        assert counted[kind] == sum(e.count if e.how == "point" else 1 for e in of_kind)
    assert counted["blob-errors"] > sum(e.kind == "blob-errors" for e in events)


def test_mode_off_schedules_only_what_it_can_fire() -> None:
    """No batch is shared in mode off: nothing passes a shared point, so none
    is released (it would wait for ever), and there is no last finisher."""
    events = _events(4, mode="off")
    left_out = {"kill-last-finisher", *HOST_KINDS, *NETWORK_KINDS}
    assert {e.kind for e in events} == set(FAULT_KINDS) - left_out
    assert not [e for e in events if e.point.split(":")[0] in SHARED_POINTS]
    assert [e for e in _events(4) if e.point.split(":")[0] in SHARED_POINTS]
    with pytest.raises(ValueError, match="none of the fault kinds kill-last-finisher fires"):
        _events(4, ("kill-last-finisher",), mode="off")
    with pytest.raises(ValueError, match="fires in mode 'off'"):
        ChaosConfig(mode="off", faults=("kill-last-finisher",))


def test_host_kinds_fire_only_on_the_hosts_of_a_ray_cluster() -> None:
    assert not {e.kind for e in _events(6)} & set(HOST_KINDS)
    events = _events(6, HOST_KINDS, hosts=True)
    assert {e.kind for e in events} == set(HOST_KINDS)
    assert all(e.how == "signal" for e in events)
    with pytest.raises(ValueError, match=r"on one machine .*--hosts ray:"):
        _events(6, HOST_KINDS)
    with pytest.raises(ValueError, match="--hosts ray:"):
        ChaosConfig(faults=("kill-host",))


def test_only_the_chosen_kinds_are_scheduled() -> None:
    events = _events(3, ("kill-worker", "pause"))
    assert {e.kind for e in events} == {"kill-worker", "pause"}


def test_point_specs_budget_exactly_what_is_released() -> None:
    events = _events(5)
    specs = point_specs(events)
    released: dict[str, int] = {}
    for e in events:
        if e.how == "point":
            released[e.point] = released.get(e.point, 0) + e.count
    assert {f"{s.point}:{s.action}": s.times for s in specs} == released
    for spec in specs:
        both = {s.action for s in specs if s.point == spec.point} >= {
            "determinate",
            "indeterminate",
        }
        assert spec.prob == (0.5 if spec.point.endswith(".call") and both else 1.0)
        assert kind_of(spec.point, spec.action) in FAULT_KINDS


def test_unknown_kinds_are_named() -> None:
    with pytest.raises(
        ValueError, match="unknown fault kind 'kill-everything'; known: kill-worker"
    ):
        check_kinds(["kill-worker", "kill-everything"])
    with pytest.raises(ValueError, match="no fault kind given"):
        check_kinds([])
    assert check_kinds(["pause", "pause"]) == ("pause",)


def test_network_kinds_fire_only_between_emulated_hosts_and_heal() -> None:
    """Each network fault lasts 1 to ``network_max_s`` seconds with an
    amount in its range (a skew either way); a schedule of other kinds is
    the same between emulated hosts as without (its draws are made only for
    network events)."""
    assert not {e.kind for e in _events(9)} & set(NETWORK_KINDS)
    with pytest.raises(ValueError, match="--hosts netns:N"):
        _events(9, NETWORK_KINDS)
    events = _events(9, NETWORK_KINDS, network=True, network_max_s=12.0)
    assert {e.kind for e in events} == set(NETWORK_KINDS)
    for e in events:
        assert e.how == "network" and 1.0 <= e.lasts_s <= 12.0
        low, high = NETWORK_AMOUNTS.get(e.kind, (0.0, 0.0))
        assert low <= abs(e.amount) <= high
    skews = [e.amount for e in events if e.kind == "clock-skew"]
    assert min(skews) < 0 < max(skews)
    plain = tuple(k for k in FAULT_KINDS if k not in NETWORK_KINDS)
    assert _events(9, plain) == _events(9, plain, network=True)
    assert kind_of("loss", "network") == "loss"


def test_network_faults_come_one_at_a_time_with_a_quiet_spell_between() -> None:
    """A network fault begins once the one before has healed and
    ``NETWORK_QUIET_S`` more have passed; other kinds fall in between."""
    kinds = (*NETWORK_KINDS, "kill-worker")
    events = _events(3, kinds, network=True, network_max_s=8.0)
    network = [e for e in events if e.how == "network"]
    assert len(network) >= 5 and any(e.how != "network" for e in events)
    for before, after in itertools.pairwise(network):
        assert after.at_s >= before.at_s + before.lasts_s + NETWORK_QUIET_S - 1e-3


def test_with_network_kinds_every_kind_comes_once_a_round() -> None:
    """Drawn in shuffled rounds, no kind falls more than one behind another
    (drawn at random, seed 4711 never drew partition-host of these eight in
    300 s)."""
    kinds = (*NETWORK_KINDS, "kill-host")
    for seed in (4711, 1, 2):
        events = _events(seed, kinds, 300.0, network=True, hosts=True, network_max_s=10.0)
        counts = Counter(e.kind for e in events)
        assert set(counts) == set(kinds) and max(counts.values()) - min(counts.values()) <= 1
