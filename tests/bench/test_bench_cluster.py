"""``bench cluster``: runs are verified or marked failed, and the report says which."""

from __future__ import annotations

import json

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
