"""``shardsink bench parts`` and ``bench allocators`` in miniature: every
figure is there, both layouts and every environment merged the same rows,
and which pool held a merge's memory under each environment."""

from __future__ import annotations

import json

from shardsink.bench import allocators, parts


def test_bench_parts_measures_the_builder_and_both_layouts_side_by_side(tmp_path):
    result = parts.run(tmp_path, parts=4, rows=20_000, builder_rows=40_000, workers=4, repeats=2)
    builder = result["builder"]
    assert [sorted(o) for o in builder["order"]] == [["sorted", "unsorted"]] * 2
    assert builder["rows"] == 40_000
    assert builder["sorted_rows_per_s"] > 0 and builder["unsorted_rows_per_s"] > 0
    rows = {(r["mode"], r["layout"]): r for r in result["memory"]}
    assert set(rows) == {(m, o) for m in ("read", "merge") for o in ("sorted", "legacy")}
    assert {r["rows"] for r in rows.values()} == {80_000}
    assert all(r["peak_above"] >= 0 and r["pool_peak"] > 0 for r in rows.values())
    assert rows[("merge", "sorted")]["written_bytes"] > 0
    assert json.loads((tmp_path / "parts.json").read_text()) == result


def test_bench_allocators_merges_in_every_environment_and_times_the_start(tmp_path):
    result = allocators.run(tmp_path, parts=4, rows=20_000, repeats=1, start_count=1)
    merged = {r["environment"]: r for r in result["merge"]}
    assert set(merged) == set(allocators.ENVIRONMENTS)
    assert {r["rows"] for r in merged.values()} == {80_000}
    assert [name for name, r in merged.items() if r["server"]] == ["system+2 arenas"]
    assert (
        merged["default"]["pool"] == "mimalloc" and merged["default"]["pool_peaks"]["system"] == 0
    )
    assert merged["system"]["pool_peaks"]["mimalloc"] == 0
    assert merged["in-process"]["pool_peaks"]["mimalloc"] > 0  # group_by's stayed there
    start = result["start"]
    assert start["fork_s"] > 0 and start["fresh_s"] > 0 and start["fresh_rss"] > 0
    assert json.loads((tmp_path / "allocators.json").read_text()) == result
