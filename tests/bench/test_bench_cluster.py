"""``bench cluster``: runs are verified or marked failed, and the report says which."""

from __future__ import annotations

import json

import pytest

from shardsink.bench.cluster import RunSpec, checks, matrix, run_one, write_report


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
    assert {s.shared_max_bytes for s in hydrate if s.mode == "best-effort"} == {
        0, 1 << 20, 1 << 50
    }  # fmt: skip
    assert len(matrix("quick")) < len(default)


def test_checks_flag_a_broken_promise() -> None:
    rows = [
        {"section": "trickle", "mode": "barrier", "workload": "trickle", "groups": 4,
         "rows_per_interval": 128, "data_parts_per_append": 5.0,
         "inline_parts_per_append": 0.0, "diff_bytes_per_append": 10.0, "verified": True},
    ]  # fmt: skip
    (barrier, verified) = checks(rows)
    assert barrier[1] is False and verified[1] is True


def _bench_config(tmp_path, text: str, *flags: str):
    from shardsink.bench._cli import bench_cluster_config
    from shardsink.cli import build_parser

    path = tmp_path / "bench.toml"
    path.write_text(text)
    args = build_parser().parse_args(["bench", "cluster", "--config", str(path), *flags])
    return bench_cluster_config(args)


def test_a_toml_file_sets_the_bench_and_flags_override_it(tmp_path) -> None:
    text = 'out = "from-file"\nmatrix = "quick"\n[cluster]\nstart = "spawn"\n'
    text += 'blob_target_bytes = "64MiB"\n'
    config = _bench_config(tmp_path, text)
    assert (config.out, config.matrix, config.cluster.start) == ("from-file", "quick", "spawn")
    assert config.cluster.blob_target_bytes == 64 << 20
    config = _bench_config(tmp_path, text, "--out", "flag", "--matrix", "default")
    assert (config.out, config.matrix, config.cluster.start) == ("flag", "default", "spawn")
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
        ('out = "x"\nmatrix = "huge"\n', "unknown matrix 'huge'; choose one of default, quick"),
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
