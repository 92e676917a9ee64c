"""``bench cluster``: runs are verified or marked failed, and the report says which."""

from __future__ import annotations

import json

import pytest

from shardsink.bench.cluster import (
    LATENCY_BOUNDS_MS,
    LATENCY_REPEATS,
    MATRICES,
    SECTIONS,
    VARIANTS,
    RunSpec,
    checks,
    matrix,
    run,
    run_one,
    scale_matrix,
    write_report,
)
from shardsink.bench.cluster.checks import INCONCLUSIVE
from shardsink.bench.cluster.matrices import FIGURES, repeat_order, workload_lines
from shardsink.bench.scale import report_lines, stop, sweeps


def test_a_run_verifies_and_a_broken_one_is_marked_not_dropped(tmp_path) -> None:
    good = run_one(
        RunSpec(section="trickle", mode="barrier", groups=1, workers=2, workload="trickle",
                rows_per_interval=64, intervals=3),
        tmp_path / "good",
    )  # fmt: skip
    assert good["verified"] is True, good.get("error")
    assert (
        good["appends"] == 3
        and good["data_parts_per_append"] + good["inline_parts_per_append"] == 1.0
    )
    broken = run_one(
        RunSpec(section="trickle", mode="sideways", groups=1, workers=2, workload="trickle",
                rows_per_interval=64, intervals=3),
        tmp_path / "broken",
    )  # fmt: skip
    assert broken["verified"] is False and "sideways" in broken["error"]
    report = write_report([good, broken], tmp_path, "shardsink bench cluster --out x", 1.0)
    text = report.read_text()
    assert "| every run verified | **FAIL** | 1/2 |" in text
    assert "**no**:" in text and "barrier" in text
    json.dumps([good, broken])  # results.json material


def test_matrices_cover_what_the_design_promises() -> None:
    default = matrix("default")
    sections = {s.section for s in default}
    assert sections == {"small-writes", "trickle", "compaction", "peer", "hydrate"}
    hydrate = [s for s in default if s.section == "hydrate"]
    assert {s.snapshot_rows for s in hydrate} == {2_000_000}
    assert [s.workers for s in hydrate if s.mode == "pyarrow"] == [8, 8, 8]  # the baseline
    assert {(s.snapshot_rows, s.workers) for s in matrix("hydrate")} == {(4_000_000, 2)}
    assert {s.shared_max_bytes for s in hydrate if s.mode == "best-effort"} == {
        0, 1 << 20, 1 << 50, "auto"
    }  # fmt: skip
    small = [s for s in default if s.section == "small-writes"]
    assert {(s.mode, s.shared_max_bytes) for s in small} == {
        ("off", 1 << 20), ("best-effort", 1 << 20), ("barrier", 1 << 20), ("best-effort", "auto")
    }  # fmt: skip
    auto = matrix("auto")
    assert {s.section for s in auto} == {"small-writes", "hydrate"}
    assert sorted(s.repeat for s in auto if s.shared_max_bytes == "auto") == [0, 0, 1, 2]
    assert len(matrix("quick")) < len(default)


def test_checks_flag_a_broken_promise() -> None:
    rows = [
        {"section": "trickle", "mode": "barrier", "workload": "trickle", "groups": 4,
         "rows_per_interval": 128, "data_parts_per_append": 5.0,
         "inline_parts_per_append": 0.0, "diff_bytes_per_append": 10.0, "verified": True},
    ]  # fmt: skip
    (barrier, verified) = checks(rows)
    assert barrier[1] is False and verified[1] is True


def _trickle_row(mode: str, coalesce: str, parts: float, diff_bytes: float) -> dict:
    return {
        "section": "trickle", "mode": mode, "coalesce": coalesce, "workload": "trickle",
        "groups": 4, "workers": 8, "rows_per_interval": 128, "data_parts_per_append": 0.0,
        "inline_parts_per_append": parts, "diff_bytes_per_append": diff_bytes, "verified": True,
    }  # fmt: skip


def test_host_coalescing_is_in_the_bench_and_checked(tmp_path) -> None:
    row = run_one(
        RunSpec(section="trickle", mode="barrier", coalesce="host", groups=2, workers=2,
                workload="trickle", rows_per_interval=64, intervals=3),
        tmp_path / "host",
    )  # fmt: skip
    assert row["verified"] is True, row.get("error")
    assert row["coalesce"] == "host" and row["appends"] == 3
    assert row["data_parts_per_append"] + row["inline_parts_per_append"] == 1.0  # not 2 groups
    shape = [s for s in matrix("trickle") if (s.groups, s.rows_per_interval) == (4, 128)]
    assert sorted((s.mode, s.coalesce) for s in shape) == sorted(VARIANTS)
    rows = [
        _trickle_row("off", "group", 32.0, 10_000.0),
        _trickle_row("barrier", "group", 4.0, 3_000.0),
        _trickle_row("barrier", "host", 1.0, 2_000.0),
        _trickle_row("best-effort", "host", 1.2, 2_100.0),
    ]
    passed = {claim: ok for claim, ok, _ in checks(rows)}
    assert passed["barrier: data-or-inline parts per append == groups"] is True  # host apart
    assert passed["4x8 R=128: host barrier 1.00 part per append"] is True
    assert passed["4x8 R=128: host barrier diff bytes per append >= 4x fewer than off's"] is True
    assert passed["4x8 R=128: host best-effort <= 1.1 parts per append"] is False
    text = write_report([row, *rows], tmp_path, "shardsink bench cluster", 1.0).read_text()
    assert "| host barrier | 2x2 R=64 |" in text and "| host best-effort | 4x8 R=128 |" in text


def _bench_config(tmp_path, text: str, *flags: str):
    from shardsink.cli import build_parser
    from shardsink.cli.bench import bench_cluster_config

    path = tmp_path / "bench.toml"
    path.write_text(text)
    args = build_parser().parse_args(["bench", "cluster", "--config", str(path), *flags])
    return bench_cluster_config(args)


def test_a_toml_file_sets_the_bench_and_flags_override_it(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # out is made absolute from here
    text = 'out = "from-file"\nmatrix = "quick"\n[cluster]\nstart = "spawn"\n'
    text += 'blob_target_bytes = "64MiB"\n'
    config = _bench_config(tmp_path, text)
    assert (config.out, config.matrix, config.cluster.start) == (
        str(tmp_path / "from-file"),
        "quick",
        "spawn",
    )
    assert config.cluster.blob_target_bytes == 64 << 20
    config = _bench_config(tmp_path, text, "--out", "flag", "--matrix", "default")
    assert (config.out, config.matrix, config.cluster.start) == (
        str(tmp_path / "flag"),
        "default",
        "spawn",
    )
    assert _bench_config(tmp_path, 'matrix = "default"\n', "--quick", "--out", "x").matrix == (
        "quick"
    )
    spawned = run_one(
        RunSpec(section="trickle", mode="barrier", groups=1, workers=1, workload="trickle",
                rows_per_interval=16, intervals=2),
        tmp_path / "run",
        config.cluster,
    )  # fmt: skip
    assert spawned["verified"] is True and spawned["start"] == "spawn", spawned.get("error")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('out = "x"\nmatrx = "quick"\n', "unknown key 'matrx'"),
        (
            'out = "x"\nmatrix = "huge"\n',
            "unknown matrix 'huge'; choose one of "
            "default, quick, trickle, hydrate, scale, auto, latency, hosts",
        ),
        ('out = "x"\n[cluster]\ngroups = 3\n', "cluster.groups is set by each run of the matrix"),
        ('out = "x"\n[cluster]\nstrat = "spawn"\n', "unknown key 'strat'"),
        ('out = "x"\n[cluster]\nstart = "teleport"\n', "'teleport'"),
        ('[cluster]\nblob_target_bytes = "big"\n', "cluster.blob_target_bytes in"),
        ('matrix = "quick"\n', "give the output directory: --out DIR"),
    ],
)
def test_a_bad_bench_config_is_refused_naming_the_key(tmp_path, capsys, text, message) -> None:
    from shardsink.cli import main

    path = tmp_path / "bench.toml"
    path.write_text(text)
    assert main(["bench", "cluster", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("shardsink bench: error: ") and message in err, err
    assert not (tmp_path / "x").exists()


def test_the_scale_matrix_grows_workers_then_groups_for_every_mode() -> None:
    specs = matrix("scale")
    modes = {("off", "group"), ("best-effort", "group"), ("barrier", "group")}
    modes |= {("best-effort", "host"), ("barrier", "host")}
    workers = [s for s in specs if s.section == "scale-workers"]
    groups = [s for s in specs if s.section == "scale-groups"]
    assert {(s.groups, s.workers) for s in workers} == {(1, w) for w in (1, 2, 4, 8, 16, 32)}
    assert {(s.groups, s.workers) for s in groups} == {(g, 4) for g in (1, 2, 4, 8)}
    assert {(s.mode, s.coalesce) for s in specs} == modes and len(specs) == 3 * 5 * (6 + 4)
    # the same rows per worker at every shape, so ideal scaling is linear
    assert len({s.rows_per_interval // (s.groups * s.workers) for s in specs}) == 1


def _scale_row(section: str, mode: str, n: int, rows_per_s: float, **extra) -> dict:
    groups, workers = (1, n) if section == "scale-workers" else (n, 4)
    return {
        "section": section, "mode": mode, "groups": groups, "workers": workers,
        "rows_per_s": rows_per_s, "data_parts_per_append": 1.0,
        "inline_parts_per_append": 0.0, "append_latency_ms_p50": 5.0, "verified": True,
        **extra,
    }  # fmt: skip


def test_scaling_stops_at_the_first_step_that_gains_little_and_says_why() -> None:
    busy = {"machine_busy": 0.97, "busiest": "builder g0/b", "busiest_core": 0.95,
            "cpu_cores": {"builder": 0.95, "worker": 0.9}}  # fmt: skip
    rows = [
        _scale_row("scale-workers", "barrier", 1, 100.0),
        _scale_row("scale-workers", "barrier", 2, 190.0),
        _scale_row("scale-workers", "barrier", 4, 270.0, **busy),  # x1.42: under x1.5
        _scale_row("scale-workers", "barrier", 8, 600.0),
        # repeats: the point is the run with the median rows/s
        *(_scale_row("scale-groups", "off", 1, v) for v in (50.0, 10.0, 60.0)),
        _scale_row("scale-groups", "off", 2, 200.0),
        _scale_row("scale-groups", "off", 4, 100.0, verified=False),
    ]
    barrier, off = sweeps(rows)
    end = stop(barrier, cores=2)
    assert (end.last.n, end.next.n) == (2, 4)
    assert "4 worker processes share the machine's 2 cores" in end.why
    assert "the CPUs were 97% busy" in end.why
    assert "builder g0/b used 0.95 of a core: it is the bottleneck" in end.why
    assert [(p.n, p.runs, p.rows_per_s) for p in off.points] == [(1, 3, 50.0), (2, 1, 200.0)]
    assert stop(off, cores=2).next is None
    lines = "\n".join(report_lines(rows, cores=2))
    assert (
        "| scale-workers | barrier | workers=2 | x1.90 | 95% | workers=4: rows/s x1.42 |" in lines
    )
    assert "| scale-groups | off | groups=2 | x4.00 | 200% | still scaling" in lines
    assert "the cluster used 1.85 of 2 cores (builder 0.95, worker 0.90)" in lines
    crowded = {"machine_busy": 0.99, "busiest": "worker g0/w0", "busiest_core": 0.2,
               "cpu_cores": {"worker": 0.4}}  # fmt: skip
    others = [
        _scale_row("scale-workers", "off", 1, 100.0),
        _scale_row("scale-workers", "off", 2, 110.0, **crowded),
    ]
    (crowded_sweep,) = sweeps(others)
    assert stop(crowded_sweep, cores=2).why.endswith("other processes on the machine held the rest")
    assert "| barrier | 100, 1.00, 5 | 190, 1.00, 5 | 270, 1.00, 5 | 600, 1.00, 5 |" in lines


def test_a_tiny_scale_run_is_verified_and_reported_with_its_plots(tmp_path) -> None:
    specs = scale_matrix(
        (1, 2), (1, 2), group_workers=2, rows_per_worker=50, intervals=3, repeats=1
    )
    rows = run(specs, tmp_path, "shardsink bench cluster --matrix tiny")
    assert len(rows) == len(specs) == 4 * 5  # 4 shapes, every variant
    assert all(r["verified"] for r in rows), [r["error"] for r in rows]
    assert json.loads((tmp_path / "results.json").read_text())["runs"] == json.loads(
        json.dumps(rows, default=str)
    )
    for r in rows:
        assert {"worker", "builder", "coordinator"} <= set(r["cpu_cores"])
        assert 0 <= r["machine_busy"] <= 1
        assert bool(r["busiest"]) == (sum(r["cpu_cores"].values()) > 0)
    # a tiny run lasts 8-130 ms, within one or a few 10 ms clock ticks of each
    # process's CPU time, so one run can show none at all: only the sweep must
    assert sum(sum(r["cpu_cores"].values()) for r in rows) > 0
    for name in ("scale-workers.png", "scale-groups.png"):
        assert (tmp_path / name).read_bytes().startswith(b"\x89PNG")
    report = (tmp_path / "report.md").read_text()
    assert "## Where scaling stops" in report and "| every run verified | pass | 20/20 |" in report
    for section in ("scale-workers", "scale-groups"):
        for mode in ("off", "best-effort", "barrier", "host best-effort", "host barrier"):
            assert f"| {section} | {mode} | " in report
        assert f"![{section}.png]({section}.png)" in report


def test_checks_hold_auto_to_its_promises() -> None:
    def row(section: str, smb, **kw) -> dict:
        fixed = {"mode": "best-effort", "workload": "trickle", "groups": 1, "verified": True}
        return {
            **fixed,
            "section": section,
            "rows_per_interval": 1000,
            "shared_max_bytes": smb,
            **kw,
        }

    rows = [
        row("small-writes", "auto", data_parts_per_append=1.2, inline_parts_per_append=0.0),
        row("hydrate", "auto", wall_s=9.0),
        {**row("hydrate", 1 << 20, wall_s=10.0), "mode": "off"},
    ]
    claims = {claim: passed for claim, passed, _ in checks(rows)}
    assert claims["best-effort auto 1x8, 1000-row writes: <= 1.05 parts per append"] is False
    assert claims["hydrate: auto threshold wall time <= 1.00x off (medians, interleaved)"] is True


def test_a_wall_time_past_its_bound_within_its_repeats_noise_is_inconclusive(tmp_path) -> None:
    """The busy machine's case: auto at 1.06x of off, its repeats 5% apart."""

    def row(mode: str, smb, wall_s: float) -> dict:
        return {"section": "hydrate", "mode": mode, "workload": "hydrate", "groups": 1,
                "workers": 4, "rows_per_interval": 1000, "shared_max_bytes": smb,
                "wall_s": wall_s, "verified": True}  # fmt: skip

    off = [row("off", 1 << 20, w) for w in (1.00, 1.05, 0.95)]
    claim = "hydrate: auto threshold wall time <= 1.00x off (medians, interleaved)"
    noisy = [row("best-effort", "auto", w) for w in (1.06, 1.12, 1.01)]
    verdicts = {c: (v, f) for c, v, f in checks(off + noisy)}
    assert verdicts[claim] == (INCONCLUSIVE, "1.060x (3 vs 3 runs, noise 0.103x)")
    slow = [row("best-effort", "auto", w) for w in (1.30, 1.31, 1.29)]
    assert {c: v for c, v, _ in checks(off + slow)}[claim] is False  # past it beyond the noise
    text = write_report(off + noisy, tmp_path, "shardsink bench cluster", 1.0).read_text()
    assert f"| {claim} | inconclusive | 1.060x" in text


def test_the_latency_matrix_interleaves_every_variant_and_checks_what_sharing_adds() -> None:
    specs = matrix("latency")
    shapes = {(s.groups, s.workers) for s in specs}
    assert shapes == set(LATENCY_BOUNDS_MS) and {s.rows_per_interval for s in specs} == {128}
    assert len(specs) == len(shapes) * len(VARIANTS) * LATENCY_REPEATS
    assert [s.repeat for s in specs] == sorted(s.repeat for s in specs)  # interleaved
    # the report orders its sections by SECTIONS: every matrix's must be there
    assert {s.section for name in MATRICES for s in matrix(name)} <= set(SECTIONS)

    def row(mode: str, p50: float, repeat: int, groups: int = 4) -> dict:
        return {
            "section": "latency",
            "mode": mode,
            "coalesce": "group",
            "workload": "trickle",
            "groups": groups,
            "workers": 8,
            "repeat": repeat,
            "append_latency_ms_p50": p50,
            "data_parts_per_append": 0.0,
            "inline_parts_per_append": float(groups),
            "verified": True,
        }

    rows = [row("off", p50, i) for i, p50 in enumerate((20.0, 30.0, 21.0))]
    rows += [row("best-effort", p50, i) for i, p50 in enumerate((24.0, 40.0, 25.0))]
    rows += [row("barrier", p50, i) for i, p50 in enumerate((26.0, 27.0, 28.0))]
    rows += [{**row("barrier", p50, i), "coalesce": "host"} for i, p50 in enumerate((29, 29, 30))]
    rows += [row("off", 10.0, 0, groups=1), row("best-effort", 13.0, 0, groups=1)]
    claims = {claim: (ok, figures) for claim, ok, figures in checks(rows)}
    # medians: 25 against 21 at 4x8 (+4, within 5); each median 1 ms from its repeats' middle
    assert claims["4x8 R=128: best-effort adds <= 5 ms to off's p50 append latency"] == (
        True,
        "+4.0 ms (medians of 3 and 3 runs, noise 2 ms)",
    )
    # +6 is past 5 by less than the noise (1 + 1 ms): inconclusive, not a failure
    assert claims["4x8 R=128: barrier adds <= 5 ms to off's p50 append latency"][0] == INCONCLUSIVE
    # +8 is past it by more than the noise (0 + 1 ms)
    assert claims["4x8 R=128: host barrier adds <= 5 ms to off's p50 append latency"][0] is False
    # one run each: its noise is unknown
    assert claims["1x8 R=128: best-effort adds <= 2 ms to off's p50 append latency"] == (
        INCONCLUSIVE,
        "+3.0 ms (medians of 1 and 1 runs, noise unknown: one run)",
    )


def test_every_matrix_runs_each_repeat_in_its_own_seeded_order() -> None:
    for name in MATRICES:
        specs = matrix(name)
        assert [s.order for s in specs] == list(range(len(specs)))
        assert [s.repeat for s in specs] == sorted(s.repeat for s in specs)
        assert matrix(name) == specs  # seeded: a rerun runs the same order
    latency = matrix("latency")
    per_repeat = [
        [(s.mode, s.coalesce, s.groups) for s in latency if s.repeat == r]
        for r in range(LATENCY_REPEATS)
    ]
    assert len({tuple(labels) for labels in per_repeat}) == LATENCY_REPEATS  # each its own
    assert len({labels[0] for labels in per_repeat}) > 1  # no variant always first
    assert all(sorted(labels) == sorted(per_repeat[0]) for labels in per_repeat)
    assert repeat_order("abcdef", 1) == repeat_order("abcdef", 1) != repeat_order("abcdef", 2)
    # digests on and off, two variants: shuffled once (twice would undo it)
    firsts = [next(s.digests for s in matrix("digest") if s.repeat == r) for r in range(6)]
    assert set(firsts) == {True, False}


def test_a_matrix_warms_up_on_its_first_run_and_reports_only_its_own(tmp_path, monkeypatch):
    from shardsink.bench.cluster import running

    calls = []

    def fake_run_one(spec, work_dir, base):
        calls.append((spec.label, work_dir.name))
        return {"label": spec.label, "verified": True}

    monkeypatch.setattr(running, "run_one", fake_run_one)
    specs = matrix("hydrate")[:3]
    rows = running._run_specs(specs, tmp_path, tmp_path / "scratch", None)
    assert calls[0] == (specs[0].label, "warm-up")
    assert calls[1:] == [(s.label, f"run-{i:03d}") for i, s in enumerate(specs)]
    assert [row["label"] for row in rows] == [s.label for s in specs]
    reported = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert len(reported) == len(specs)


def test_bars_show_the_median_the_spread_the_value_and_a_zero_as_zero(tmp_path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from shardsink import _figures as figures
    from shardsink.bench.cluster.plots import plot

    fig, ax = plt.subplots()
    figures.grouped_bars(
        ax, ["2x4", "4x8"], {"off": {"2x4": [3.0, 1.0, 2.0], "4x8": [0.0]}, "barrier": {}}, "{:.1f}"
    )
    texts = [t.get_text() for t in ax.texts]
    assert texts == ["2.0", "0.0", "n/a", "n/a"]  # a measured zero is labelled, a gap is n/a
    assert [bar.get_height() for bar in ax.patches[:2]] == [2.0, 0.0]  # off's medians
    assert ax.get_ylim()[0] == 0
    plt.close(fig)
    assert figures.median_range([3.0, 1.0, 2.0]) == (2.0, 1.0, 1.0)
    rows = [
        {
            **_trickle_row(mode, "group", parts, 1000.0 + k),
            "repeat": k,
            "shared_max_bytes": 1 << 20,
            "blob_puts": 0,
            "appends": 10,
            "append_latency_ms_p50": 5.0 + k,
        }
        for mode, parts in (("off", 8.0), ("barrier", 2.0))
        for k in range(3)
    ]
    written = plot(rows, tmp_path, command="shardsink bench cluster --matrix quick")
    assert {p.name for p in written} >= {"parts_per_append.png", "latency.png"}
    text = figures.caption("shardsink bench cluster --matrix quick")
    assert text.startswith("shardsink bench cluster --matrix quick | ")
    assert "cores" in text and ("commit " in text or "shardsink " in text)


def test_compaction_off_means_off(tmp_path) -> None:
    """The compaction section's run without compaction merges nothing: one
    batch per append stays in state (the cluster's own consensus process
    would merge them by the spine's rule); with compaction they are merged.
    Nor do the digest section's runs merge (their merges' share of the cores
    varied more than digests cost)."""
    shape = dict(mode="best-effort", groups=1, workers=2, workload="trickle",
                 rows_per_interval=64, intervals=24)  # fmt: skip
    rows = {
        (section, on): run_one(
            RunSpec(section=section, compaction=on, **shape), tmp_path / f"{section}-{on}"
        )
        for section, on in (("compaction", False), ("compaction", True), ("digest", False))
    }
    for row in rows.values():
        assert row["verified"] is True, row.get("error")
    assert rows["compaction", False]["batches_in_state"] == 24
    assert rows["digest", False]["batches_in_state"] == 24
    on = rows["compaction", True]
    assert on["batches_in_state"] < 24 and on["compactions"] >= 1


def test_the_digest_section_gives_each_repeats_ratio_and_cpu_per_row() -> None:
    def row(digests: bool, repeat: int, rows_per_s: float) -> dict:
        cores = {"worker": 0.5, "builder": 0.1}
        figures = dict.fromkeys(FIGURES, 1.0) | {"rows_per_s": rows_per_s}
        return figures | {"verified": True, "digests": digests, "repeat": repeat,
                          "rows": 1000, "wall_s": 2.0, "cpu_cores": cores}  # fmt: skip

    rows = [row(True, 0, 90.0), row(False, 0, 100.0), row(True, 1, 99.0), row(False, 1, 100.0)]
    text = "\n".join(workload_lines("digest", rows))
    assert "| True | 94 |" in text and "| 1,200,000, 1,000,000 | 0.945 |" in text
    assert "Digests on / off per repeat: 0.900, 0.990; median 0.945, geometric mean 0.944." in text


def test_a_workload_table_measures_what_digests_cost_on_its_own_rows() -> None:
    from shardsink.bench.cluster.matrices import DIGEST_ROWS, workload_matrix

    runs = workload_matrix({"use": "synth", "rows_per_interval": 64, "update": 0.3}, repeats=2)
    digest_runs = [r for r in runs if r.section == "digest"]
    assert sorted((r.repeat, r.digests) for r in digest_runs) == [
        (0, False), (0, True), (1, False), (1, True)
    ]  # fmt: skip
    for spec in digest_runs:
        assert spec.workload == "synth" and spec.workload_args == {"update": 0.3}
        assert spec.rows_per_interval == DIGEST_ROWS
    assert {r.rows_per_interval for r in runs if r.section == "workload"} == {64}


def _rate_row(mode: str, target: float, repeat: int, latencies_ms, achieved: float) -> dict:
    from shardsink._histograms import Latencies

    hist = Latencies()
    for ms in latencies_ms:
        hist.record(ms)
    d = hist.distribution()
    return {
        "section": "rate", "mode": mode, "groups": 1, "workers": 8, "rows_per_interval": 1000,
        "verified": True, "target_rate": target, "achieved_rate": achieved, "repeat": repeat,
        "fell_behind": achieved < 0.95 * target, "append_latency_hdr": hist.encoded(),
        "append_latency_ms": {"p99": d.p99}, "slo_p99_ms": 100.0, "workload": "trickle",
        "data_parts_per_append": 0.0, "inline_parts_per_append": 1.0,
    }  # fmt: skip


def test_the_rate_matrix_merges_repeats_as_histograms_and_finds_the_knee(tmp_path) -> None:
    """Repeats merge as histograms (the p99 of all values, not a mean of
    p99s); the knee is the highest rate within the SLO with none behind;
    the report leads with it, the log holds one tagged histogram a point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from shardsink.bench.cluster import rates

    rows = [
        _rate_row("barrier", 10, 0, [5.0] * 99 + [50.0], 10.0),
        _rate_row("barrier", 10, 1, [6.0] * 100, 10.0),
        _rate_row("barrier", 40, 0, [20.0] * 90 + [90.0] * 10, 40.0),
        _rate_row("barrier", 40, 1, [20.0] * 100, 39.9),
        _rate_row("barrier", 80, 0, [300.0] * 100, 60.0),  # past saturation
        _rate_row("barrier", 80, 1, [250.0] * 100, 62.0),
    ]
    points = rates.points(rows)
    assert [p.target for p in points] == [10, 40, 80]
    assert points[0].latencies.count == 200 and points[2].behind == 2
    assert rates.knee(points, 100.0) == 40 and rates.knee(points, 5.5) is None
    # rate 40: one repeat's p99 is 90, the other's 20; merged it is 90, not their mean
    assert points[1].latencies.distribution().p99 == pytest.approx(90.0, rel=0.01)
    assert rates.headline(rows, 100.0)[1] == "- 1x8 R=1000 barrier: 40 intervals/s"
    assert any("| 80 | 61.0 (60.0-62.0) | 200 |" in line for line in rates.report_lines(rows))
    report = write_report(rows, tmp_path, "shardsink bench cluster --matrix rate", 1.0)
    text = report.read_text()  # the knees lead, before the checks and the tables
    assert text.index("- 1x8 R=1000 barrier: 40 intervals/s") < text.index("## Checks")
    log = rates.write_histograms(rows, tmp_path)
    tags = [line.split(",")[0] for line in log.read_text().splitlines() if line.startswith("Tag=")]
    assert tags == [f"Tag=rate/1x8/R=1000/barrier/{r}" for r in (10, 40, 80)]
    (png,) = rates.plot(plt, rows, tmp_path, "caption")
    assert png.name == "rate-1x8.png" and png.stat().st_size > 10_000


def test_a_rate_run_keeps_its_target_and_its_histogram(tmp_path) -> None:
    row = run_one(
        RunSpec(section="rate", mode="barrier", groups=1, workers=2, workload="trickle",
                rows_per_interval=64, intervals=6, rate=20.0),
        tmp_path / "rate",
    )  # fmt: skip
    assert row["verified"] is True, row.get("error")
    assert row["target_rate"] == 20.0 and row["achieved_rate"] <= 20.0 * 1.02
    assert row["append_latency_ms"]["count"] == 6 and row["append_latency_hdr"]
    assert "rate" in MATRICES and {r.section for r in matrix("rate")} == {"rate"}
