"""The checks ``report.md`` applies to a matrix's rows: the design's promises
(parts per append, diff bytes, latency added, hydration wall time), each
``(claim, verdict, figures)``: passed, failed, :data:`INCONCLUSIVE` or
``None`` (not measured).

Every check reads verified rows only and is skipped (left out) when the runs it
compares are not in the rows, so a matrix that does not measure a claim does
not fail it; "every run verified" is always there.

Counts (parts, diff bytes) are exact. Timings (latency added, hydration wall
time) vary from run to run, so the checks that compare them compare the
medians of interleaved repeats, within the noise those repeats show: past
the bound by more than the sum of the two variants' median absolute
deviations it fails, past it by less it is inconclusive, never a failure (a
bench on a busy machine failed its own "auto wall time <= 1.00x off" at
1.06x). With one run of a variant its noise is unknown: past the bound is
inconclusive.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import Literal

from ...config import AUTO
from .. import scale
from .matrices import LATENCY_BOUNDS_MS, MIB, VARIANTS, bytes_label

#: A check's verdict when its figures pass the bound by less than their noise.
INCONCLUSIVE = "inconclusive"
#: Passed, failed, :data:`INCONCLUSIVE`, or ``None`` when not measured.
Verdict = bool | Literal["inconclusive"] | None
#: ``(claim, verdict, figures)``.
Check = tuple[str, Verdict, str]
#: Verified rows whose fields equal the keyword arguments.
Find = Callable[..., list[dict]]
#: Where the promised trickle shape of the default matrix is.
TRICKLE_4X8 = {"section": "trickle", "groups": 4, "workers": 8, "rows_per_interval": 128}


def checks(rows: list[dict]) -> list[Check]:
    """The design's promises, each ``(claim, passed or None if not measured, figures)``."""
    ok = [r for r in rows if r.get("verified")]

    def find(**kv) -> list[dict]:
        # rows of runs before coalesce existed coalesced per group
        return [
            r
            for r in ok
            if all(r.get(k, "group" if k == "coalesce" else None) == v for k, v in kv.items())
        ]

    out = _barrier_checks(find)
    out += _small_write_checks(find)
    out += _diff_bytes_checks(find)
    out += _host_checks(find)
    out += _latency_checks(find)
    out += _hydrate_checks(find)
    out.append(
        (
            "every run verified",
            all(r.get("verified") for r in rows),
            f"{sum(bool(r.get('verified')) for r in rows)}/{len(rows)}",
        )
    )
    return out


def _parts(row: dict) -> float:
    return row["data_parts_per_append"] + row["inline_parts_per_append"]


def _barrier_checks(find: Find) -> list[Check]:
    """Group barrier trickle runs: one data-or-inline part per group per append."""
    barrier = [r for r in find(mode="barrier", coalesce="group") if r["workload"] == "trickle"]
    if not barrier:
        return []
    counts = [(r["groups"], _parts(r)) for r in barrier]
    return [
        (
            "barrier: data-or-inline parts per append == groups",
            all(abs(p - g) < 1e-9 for g, p in counts),
            ", ".join(f"{g} groups: {p:.2f}" for g, p in counts),
        )
    ]


def _small_write_checks(find: Find) -> list[Check]:
    """Best-effort at 1x8 with 1000-row writes, at 1 MiB and ``auto``."""
    out: list[Check] = []
    for threshold, most, claim in (
        (MIB, 1.1, "best-effort 1x8, 1000-row writes: <= 1.1 parts per append (reference 1.05)"),
        (AUTO, 1.05, "best-effort auto 1x8, 1000-row writes: <= 1.05 parts per append"),
    ):
        small = find(section="small-writes", mode="best-effort", shared_max_bytes=threshold)
        if small:
            p = _parts(small[0])
            out.append((claim, p <= most, f"{p:.3f}"))
    return out


def _diff_bytes_checks(find: Find) -> list[Check]:
    """4x8 R=128: how many times fewer diff bytes per append the barriers
    write than ``off``."""
    out: list[Check] = []
    off = find(mode="off", **TRICKLE_4X8)
    for mode, coalesce, fewer in (("barrier", "group", 2.0), ("barrier", "host", 4.0)):
        bar = find(mode=mode, coalesce=coalesce, **TRICKLE_4X8)
        if off and bar:
            name = scale.variant(bar[0])
            ratio = off[0]["diff_bytes_per_append"] / max(bar[0]["diff_bytes_per_append"], 1e-9)
            out.append(
                (
                    f"4x8 R=128: {name} diff bytes per append >= {fewer:g}x fewer than off's",
                    ratio >= fewer,
                    f"off/{name} = {ratio:.2f}x",
                )
            )
    return out


def _host_checks(find: Find) -> list[Check]:
    """4x8 R=128 with host coalescing: parts per append of each mode."""
    out: list[Check] = []
    for mode, most, claim in (
        ("barrier", 1.0, "4x8 R=128: host barrier 1.00 part per append"),
        ("best-effort", 1.1, "4x8 R=128: host best-effort <= 1.1 parts per append"),
    ):
        host = find(mode=mode, coalesce="host", **TRICKLE_4X8)
        if host:
            p = _parts(host[0])
            out.append((claim, p <= most + 1e-9, f"{p:.3f}"))
    return out


def _latency_checks(find: Find) -> list[Check]:
    """Per shape of :data:`LATENCY_BOUNDS_MS`: the median p50 each sharing
    variant adds to off's median p50 (section ``latency``), within the bound
    and the repeats' noise (see the module doc)."""
    out: list[Check] = []
    for (g, w), most in LATENCY_BOUNDS_MS.items():
        shape = {"section": "latency", "groups": g, "workers": w}
        off = [r["append_latency_ms_p50"] for r in find(mode="off", **shape)]
        for mode, coalesce in VARIANTS[1:]:
            rows = find(mode=mode, coalesce=coalesce, **shape)
            if not off or not rows:
                continue
            p50s = [r["append_latency_ms_p50"] for r in rows]
            added = statistics.median(p50s) - statistics.median(off)
            noise = _noise(p50s, off)
            out.append(
                (
                    f"{g}x{w} R=128: {scale.variant(rows[0])} adds <= {most:g} ms to off's p50 "
                    "append latency",
                    _within(added, most, noise),
                    f"{added:+.1f} ms (medians of {len(rows)} and {len(off)} runs"
                    f"{_noise_words(noise, ' ms')})",
                )
            )
    return out


def _hydrate_checks(find: Find) -> list[Check]:
    """Hydration: best-effort's median wall time at 1 MiB and ``auto`` against
    ``off``'s (the runs are interleaved, so medians compare like with like),
    within the bound and the repeats' noise (see the module doc)."""
    out: list[Check] = []
    hyd_off = [r["wall_s"] for r in find(section="hydrate", mode="off")]
    for threshold, most in ((MIB, 1.10), (AUTO, 1.0)):
        walls = [
            r["wall_s"]
            for r in find(section="hydrate", mode="best-effort", shared_max_bytes=threshold)
        ]
        if hyd_off and walls:
            ratio = statistics.median(walls) / statistics.median(hyd_off)
            noise = ratio * _noise(walls, hyd_off, relative=True)
            claim = (
                f"hydrate: {bytes_label(threshold)} threshold wall time <= {most:.2f}x off "
                "(medians, interleaved)"
            )
            figures = (
                f"{ratio:.3f}x ({len(walls)} vs {len(hyd_off)} runs{_noise_words(noise, 'x')})"
            )
            out.append((claim, _within(ratio, most, noise), figures))
    return out


def _within(value: float, most: float, noise: float) -> Verdict:
    """Whether a median ``value`` keeps to ``most``: passed at or below it,
    failed past ``most + noise``, :data:`INCONCLUSIVE` in between."""
    if value <= most:
        return True
    return False if value - noise > most else INCONCLUSIVE


def _noise(*samples: Sequence[float], relative: bool = False) -> float:
    """The noise of a comparison of the medians of ``samples``: the sum of
    their median absolute deviations (``relative``: each over its median);
    unknown (infinite) if one has a single run."""
    if any(len(s) < 2 for s in samples):
        return math.inf
    total = 0.0
    for sample in samples:
        middle = statistics.median(sample)
        deviation = statistics.median(abs(v - middle) for v in sample)
        total += deviation / middle if relative else deviation
    return total


def _noise_words(noise: float, unit: str) -> str:
    return ", noise unknown: one run" if math.isinf(noise) else f", noise {noise:.3g}{unit}"


def verdict_word(verdict: Verdict) -> str:
    """How a verdict is said: pass, FAIL, inconclusive, not measured."""
    if verdict is None:
        return "not measured"
    if verdict == INCONCLUSIVE:
        return INCONCLUSIVE
    return "pass" if verdict else "FAIL"
