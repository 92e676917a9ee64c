"""``report.md`` of a ``bench cluster`` run, and the rows of its tables.

The report holds the exact command, the machine, then the answer (what
the matrix was run to find out: the rate matrix's knees, the peers'
ratios, the saturation run's backlog and latency), the checks (pass, fail,
inconclusive or not measured), one table per section (with the compaction, peer, hosts,
rate and saturation side tables), where ``auto`` took the threshold, the scale-out analysis
(:func:`shardsink.bench.scale.report_lines`) and links to the PNG plots
already in the output directory.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..._figures import report_head
from ...config import AUTO
from .. import scale
from ..peers import PEERS
from . import hosts, peer_matrix, rates, saturation
from .checks import checks, verdict_word
from .matrices import SECTIONS, bytes_label, describe, shape_of, workload_lines

#: The columns of every section's table (and of the console table):
#: ``(header, row key or None if computed, format)``.
COLUMNS = [
    ("mode", "mode", "{}"),
    ("shape", None, "{}"),
    ("data parts/append", "data_parts_per_append", "{:.2f}"),
    ("inline parts/append", "inline_parts_per_append", "{:.2f}"),
    ("blob PUTs", "blob_puts", "{:,}"),
    ("PUTs/append", None, "{:.2f}"),
    ("diff bytes/append", "diff_bytes_per_append", "{:,.0f}"),
    ("CaS/append", "cas_per_append", "{:.2f}"),
    ("wall s", "wall_s", "{:.2f}"),
    ("rows/s", "rows_per_s", "{:,.0f}"),
    ("of pyarrow", "of_baseline", "{:.2f}"),
    ("p50 ms", "append_latency_ms_p50", "{:.1f}"),
    ("p99 ms", "append_latency_ms_p99", "{:.1f}"),
    ("CPU busy", "machine_busy", "{:.0%}"),
    ("busiest (core)", None, "{} {:.2f}"),
    ("verified", "verified", "{}"),
]


def _cell(row: dict, name: str, key: str | None, fmt: str) -> str:
    if name == "shape":
        return describe(row)
    if name == "mode":
        return scale.variant(row)
    if name == "busiest (core)":
        return fmt.format(row["busiest"], row["busiest_core"]) if row.get("busiest") else "-"
    if name == "PUTs/append":
        return fmt.format(row.get("blob_puts", 0) / max(row.get("appends") or 1, 1))
    value = row.get(key)
    if value is None:
        return "-"
    if key == "verified" and not value:
        return f"**no**: {row.get('error', '')[:80]}"
    return fmt.format(value)


def table_rows(rows: list[dict]) -> list[list[str]]:
    """The cells of :data:`COLUMNS` for each row, ``-`` where a row lacks one."""
    return [[_cell(r, name, key, fmt) for name, key, fmt in COLUMNS] for r in rows]


def write_report(rows: list[dict], out: Path, command: str, elapsed_s: float) -> Path:
    """Write ``report.md`` next to ``results.json``; return its path."""
    lines = [*report_head("shardsink bench cluster", command, elapsed_s)]
    answer = _answer(rows)
    if answer:
        lines += ["## Answer", "", *answer, ""]
    lines += [
        "## Checks",
        "",
        "| claim | result | figures |",
        "|---|---|---|",
    ]
    for claim, passed, figures in checks(rows):
        verdict = verdict_word(passed)
        lines.append(f"| {claim} | {'**FAIL**' if verdict == 'FAIL' else verdict} | {figures} |")
    sections = sorted({r["section"] for r in rows}, key=SECTIONS.index)
    for section in sections:
        lines += _section_lines(section, rows)
    lines += _threshold_lines(rows)
    lines += scale.report_lines(rows, os.cpu_count() or 1)
    plots = sorted(p.name for p in out.glob("*.png"))
    if plots:
        lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _answer(rows: list[dict]) -> list[str]:
    """What the matrix was run to find out, before any table: the knees of
    the rate runs, shardsink against the strongest and the coalesced peers,
    the saturation run."""
    rated = [r for r in rows if r.get("section") == "rate"]
    slo = rated[0].get("slo_p99_ms", rates.SLO_P99_MS) if rated else rates.SLO_P99_MS
    lines = rates.headline(rated, slo)
    peers = peer_matrix.headline(rows)
    if peers:
        lines += [*([""] if lines else []), "Shardsink against its peers (rows/s, side by side):"]
        lines += peers
    past = saturation.headline(rows)
    if past:
        lines += [*([""] if lines else []), "Past saturation:", *past]
    return lines


def _section_lines(section: str, rows: list[dict]) -> list[str]:
    """The table of ``section``'s rows, then its side table if it has one."""
    headers = [name for name, _, _ in COLUMNS]
    picked = [r for r in rows if r["section"] == section]
    lines = [
        "",
        f"## {section}",
        "",
        "| " + " | ".join(headers) + " |",
        "|" + "---|" * len(headers),
    ]
    lines += ["| " + " | ".join(cells) + " |" for cells in table_rows(picked)]
    if section in ("workload", "digest"):
        lines += workload_lines(section, picked)
    if section == "compaction":
        lines += _compaction_lines(picked)
    if section == "peer":
        lines += _peer_lines(picked, rows)
    if section == "hosts":
        lines += hosts.report_lines(picked)
    if section == "rate":
        lines += rates.report_lines(picked)
    if section == "peers":
        lines += peer_matrix.report_lines(picked)
    if section == "saturation":
        lines += saturation.report_lines(picked)
    return lines


def _compaction_lines(picked: list[dict]) -> list[str]:
    """What compaction left in the state: batches, parts, compactions applied."""
    lines = [
        "",
        "| compaction | batches in state | parts in state | compactions |",
        "|---|---|---|---|",
    ]
    for r in picked:
        lines.append(
            f"| {'on' if r['compaction'] else 'off'} | "
            f"{r.get('batches_in_state', '-')} | {r.get('parts_in_state', '-')} | "
            f"{r.get('compactions', 0)} |"
        )
    return lines


def _peer_lines(picked: list[dict], rows: list[dict]) -> list[str]:
    """The Delta peer's runs (``picked``) beside the verified shardsink trickle
    runs of the same shape."""
    lines = [
        "",
        "Files (blob PUTs), parts and commit bytes per interval: the Delta peers "
        "against shardsink on the same shape (commit bytes: the Delta log; for "
        "shardsink, consensus diff bytes):",
        "",
        "| mode | files/interval | parts/interval | commit bytes/interval | commits |",
        "|---|---|---|---|---|",
    ]
    same = [
        r
        for r in rows
        if r["section"] == "trickle" and r.get("verified") and shape_of(r) == shape_of(picked[0])
    ]
    for r in picked + same:
        appends = max(r.get("appends") or 1, 1)
        parts = r.get("data_parts_per_append", 0) + r.get("inline_parts_per_append", 0)
        name = r["mode"] if r["mode"] in PEERS else f"shardsink {scale.variant(r)}"
        lines.append(
            f"| {name} | {r.get('blob_puts', 0) / appends:.2f} | {parts:.2f} | "
            f"{r.get('diff_bytes_per_append', 0):,.0f} | "
            f"{r.get('cas_per_append', 0) * appends:.0f} |"
        )
    return lines


def _threshold_lines(rows: list[dict]) -> list[str]:
    """Where ``auto`` took the threshold in each run that used it."""
    auto = [r for r in rows if r.get("shared_max_bytes") == AUTO and r.get("thresholds")]
    if not auto:
        return []
    lines = [
        "",
        "## The auto threshold",
        "",
        "The threshold each interval was minted with (runs of `--shared-max-bytes auto`):",
        "",
        "| run | first | last | interval it last changed | distinct values |",
        "|---|---|---|---|---|",
    ]
    for r in auto:
        seen = r["thresholds"]
        changed = max((i for i in range(1, len(seen)) if seen[i] != seen[i - 1]), default=0)
        lines.append(
            f"| {r['section']} {describe(r)} | {bytes_label(seen[0])} | {bytes_label(seen[-1])} | "
            f"{changed} | {', '.join(bytes_label(v) for v in dict.fromkeys(seen))} |"
        )
    return lines
