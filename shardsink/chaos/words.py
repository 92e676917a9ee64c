"""A chaos report in words: what the run did to the cluster and what it found,
as sentences (``report.md`` of ``chaos --out DIR``), not counters."""

from __future__ import annotations

import signal

from .config import ChaosReport

#: What a fault of each kind does, as a noun phrase.
DOES = {
    "kill-worker": "a worker killed",
    "kill-builder": "a builder killed",
    "kill-group": "a whole group killed at once",
    "kill-last-finisher": "the interval's last worker killed as it finished",
    "kill-consensus": "the consensus process killed",
    "kill-coordinator": "the coordinator killed",
    "pause": "a process paused: stopped, then continued",
    "kill-host": "every process of a host killed at once",
    "pause-host": "every process of a host paused",
    "blob-errors": "a blob store call failed",
    "consensus-errors": "a consensus store call failed",
    "partition-host": "one host cut off from every other",
    "partition-halves": "the hosts split into a minority and a majority",
    "partition-store": "one host cut off from a server's host only",
    "partition-one-way": "what one host sends another lost, not the reverse",
    "loss": "packets a host receives lost at random",
    "delay": "packets a host receives held back",
    "clock-skew": "a host's wall clock set off",
}


def times(n: int, what: str = "time") -> str:
    """``once``, ``twice``, ``3 times`` (or ``3 runs`` with ``what``)."""
    if what == "time":
        return {0: "never", 1: "once", 2: "twice"}.get(n, f"{n} times")
    return f"{n} {what}{'' if n == 1 else 's'}"


def how_it_ended(reason: str) -> str:
    """An exit as the runner counts it (``signal 9``, ``exit 2``), in words."""
    kind, _, code = reason.partition(" ")
    if kind == "signal" and code.isdigit():
        try:
            name = signal.Signals(int(code)).name
        except ValueError:
            name = f"signal {code}"
        return f"killed by {name}"
    if kind == "exit" and code.isdigit():
        return "exited cleanly" if code == "0" else f"exited with status {code}"
    return reason


def describe(
    report: ChaosReport, settle_s: float | None = None, appended_after: list[float] = ()
) -> list[str]:
    """The report as paragraphs, the faults one with a line for each kind
    (see the module doc); ``settle_s`` is how long
    the run waited after its faults for the last ones to fire, at most;
    ``appended_after`` the times (seconds since the start) of the appends
    after the faults and the wait, while the run was stopping."""
    out = [_run_line(report, settle_s)]
    if appended_after:
        out[0] += (
            f" While the run stopped its readers and maintenance, then the coordinator, the "
            f"cluster appended {len(appended_after)} intervals more, the last "
            f"{max(appended_after) - report.ran_s:.1f} s after that."
        )
    out.append("\n".join(_fault_lines(report)))
    out.append(_cluster_line(report))
    out.append(_reader_line(report))
    out.append(_maintenance_line(report))
    if report.heals:
        out.append(_heal_line(report))
    out.append(_history_line(report))
    if report.violations:
        found = [f"{times(len(report.violations), 'violation')}:"]
        out.append("\n".join(found + [f"- {v}" for v in report.violations]))
    else:
        out.append(
            "No violation: the shard holds what its batches' digests say, every referenced "
            f"blob exists, {times(report.leaked_blobs_swept, 'leaked blob')} swept, "
            f"{times(report.segments_swept, 'shared-memory segment')} left, "
            "and no process outlived the run."
        )
    return out


def _run_line(report: ChaosReport, settle_s: float | None) -> str:
    text = (
        f"A {report.shape} {report.mode} cluster (coalesce {report.coalesce}) ran under "
        f"faults for {report.duration_s:g} s, seed {report.seed}"
    )
    if report.interrupted:
        return text + f"; interrupted after {report.ran_s:g} s (Ctrl-C), then checked."
    extra = report.ran_s - report.duration_s
    wait = "" if settle_s is None else f" (its bound: {settle_s:g} s, looked at every 0.2 s)"
    return text + (
        f", then {extra:.1f} s more for its last faults to fire and the cluster to "
        f"append again{wait}; {report.ran_s:g} s in all."
    )


def _fault_lines(report: ChaosReport) -> list[str]:
    """One line per fault kind: what it does, how many were scheduled and
    injected, and what became of the others."""
    lines = ["Faults:"]
    for kind in report.faults:
        scheduled = report.scheduled.get(kind, 0)
        injected = report.injected.get(kind, 0)
        if not scheduled and not injected:
            lines.append(f"- {kind}: the schedule drew none.")
            continue
        text = f"- {kind} ({DOES.get(kind, kind)}): {injected} injected"
        bursts = kind.endswith("-errors") and injected > scheduled
        text += f" in {times(scheduled, 'burst')}" if bursts else f" of {scheduled} scheduled"
        rest = []
        if report.missed.get(kind):
            rest.append(
                f"{report.missed[kind]} found no process to hit while the cluster restarted"
            )
        if report.lost.get(kind):
            rest.append(f"{report.lost[kind]} taken by a process killed before it acted on them")
        if report.unfired.get(kind):
            rest.append(
                f"{report.unfired[kind]} never fired: no process reached its fault point "
                "before the run ended"
            )
        lines.append(text + (f"; {'; '.join(rest)}." if rest else "."))
    return lines


def _cluster_line(report: ChaosReport) -> str:
    s = report.supervision
    text = (
        f"The cluster appended {report.intervals} intervals ({report.intervals_redone} of "
        f"them redone by a later attempt); its coordinators restarted groups "
        f"{times(s.get('restarts', 0))}, the consensus process "
        f"{times(s.get('consensus_restarts', 0))}, and abandoned "
        f"{times(s.get('abandoned_attempts', 0), 'attempt')}"
    )
    timed = report.restart_ms
    if timed.get("count"):
        text += (
            f"; a group restart took {timed['p50_ms']:g} ms at the median, "
            f"{timed['max_ms']:g} ms at most"
        )
    starts = report.coordinator_starts
    text += f". The coordinator was started {times(starts)}"
    if report.coordinator_exits:
        ended = ", ".join(
            f"{times(n)} {how_it_ended(reason)}"
            for reason, n in sorted(report.coordinator_exits.items())
        )
        text += f"; the earlier ones ended: {ended}"
    return text + "."


def _reader_line(report: ChaosReport) -> str:
    text = (
        f"Readers checked {report.snapshots_checked} snapshots against the expected "
        "collection at their as-of"
    )
    skipped = report.snapshots_skipped
    if skipped:
        text += "; skipped: " + ", ".join(
            f"{n} ({why.removeprefix('skipped: ')})" for why, n in sorted(skipped.items())
        )
    return text + "."


def _maintenance_line(report: ChaosReport) -> str:
    m = dict(report.maintenance)
    gc = {k.removeprefix("gc: "): n for k, n in m.items() if k.startswith("gc: ")}
    runs = sum(gc.values())
    parts = [f"shard gc ran {times(runs)}"]
    outcomes = []
    for outcome, n in sorted(gc.items()):
        if outcome == "ok":
            outcomes.append(f"{n} finished")
        elif outcome in ("timed out", "stopped with the run"):
            outcomes.append(f"{n} {outcome}")
        else:
            outcomes.append(f"{n} {how_it_ended(outcome)} (a fault injected into it)")
    if outcomes:
        parts[0] += f" ({', '.join(outcomes)})"
    applied = m.get("compactions applied", 0)
    abandoned = m.get("compactions abandoned", 0)
    parts.append(
        f"the consensus process compacted {times(applied)} and abandoned "
        f"{times(abandoned, 'compaction')}"
    )
    return "Maintenance: " + "; ".join(parts) + "."


def _heal_line(report: ChaosReport) -> str:
    """How soon the cluster appended after each network fault healed."""
    took = sorted(h["recovered_s"] for h in report.heals if h["recovered_s"] is not None)
    text = f"Network faults healed {times(len(report.heals))}"
    if took:
        text += (
            f"; the cluster's next append came {took[len(took) // 2]:.1f} s after a heal at "
            f"the median, {took[-1]:.1f} s at most"
        )
    never = len(report.heals) - len(took)
    if never:
        text += f"; after {times(never, 'heal')} none came before the run ended"
    return text + "."


def _history_line(report: ChaosReport) -> str:
    """The history's size and its check."""
    h = report.history
    return (
        f"The history holds {h.ops:,} client operations of the consensus protocol "
        f"({h.appends:,} appends committed, {h.info:,} of unknown outcome); the "
        f"linearizability check took {h.check_s:.2f} s: {h.verdict}, {h.reason}."
    )
