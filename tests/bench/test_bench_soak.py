"""``bench soak``, short: blocks of counts, compaction keeping batches
bounded, tiny appends inline, the shard verified, the files written."""

from __future__ import annotations

import json

import pytest

from shardsink.bench import soak
from shardsink.config import ClusterConfig


def test_a_short_soak_measures_every_block_and_stays_bounded(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(soak, "SAMPLE_EVERY", 5)
    config = ClusterConfig(groups=1, workers=3, mode="off", rows_per_interval=24, intervals=90)
    result = soak.run(config, tmp_path, block=30)
    assert result["verified"] is True, result["verify_detail"]
    blocks = result["blocks"]
    assert [b["first_interval"] for b in blocks] == [0, 30, 60]
    assert all(b["appends"] == 30 for b in blocks)
    # off: three own batches per append, each of a few hundred bytes, inline,
    # stored as one batch
    assert all(b["append_puts_per_append"] == 0 for b in blocks)
    # 90 batches appended; the spine merged them by the slack (how many
    # merges land during the blocks, rather than while settling, depends on
    # the machine's speed: the full soak's check, not this one's); once it
    # caught up, the rule's bound holds, and each compaction replaced its
    # batches with one
    settled = result["settled"]
    assert not settled["pass_due"], settled
    assert settled["batches"] <= settled["bound"] < 30, settled
    assert settled["compactions"] >= 1, settled
    assert 90 - settled["compacted_batches"] + settled["compactions"] == settled["batches"], settled
    assert sum(b["compacted_batches"] for b in blocks) <= settled["compacted_batches"]
    assert {"coordinator", "consensus", "worker"} <= set(blocks[-1]["peak_rss"])
    checks = result["checks"]
    assert set(checks) >= {"max_batches", "puts_per_append_last_quarter"}
    # the last block against the median of those after the warm-up (here block 1 alone)
    p50 = checks["append_p50_last_over_median"]
    assert (p50["last"], p50["median"]) == (blocks[2]["append_ms_p50"], blocks[1]["append_ms_p50"])
    for kind in ("coordinator", "consensus", "worker"):
        assert checks[f"rss_{kind}_last_over_median"]["median"] == blocks[1]["peak_rss"][kind]
        # high-water marks: a later block's peak is never below an earlier one's
        assert blocks[0]["peak_rss"][kind] <= blocks[1]["peak_rss"][kind]
    assert json.loads((tmp_path / "soak.json").read_text())["blocks"] == blocks
    assert (tmp_path / "soak.png").stat().st_size > 10_000
    assert not (tmp_path / "data").exists()


def test_the_baseline_is_the_median_of_the_blocks_after_the_warm_up() -> None:
    blocks = [{"append_ms_p50": v, "peak_rss": {"worker": v}} for v in (90, 10, 30, 20, 12, 24)]
    assert soak.warmup(blocks) == 1
    checks = soak.checks([{**b, "max_batches": 1, "appends": 1, "append_puts_per_append": 0,
                           "compaction_puts_per_append": 0} for b in blocks])  # fmt: skip
    assert checks["append_p50_last_over_median"]["median"] == 16  # of 10, 30, 20, 12
    assert checks["rss_worker_last_over_median"]["value"] == 24 / 16


def test_a_block_longer_than_the_run_is_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="--block"):
        soak.run(ClusterConfig(intervals=10), tmp_path, block=20)
