"""``up --hosts netns:N``'s settings, refused in one line before anything is
made, and the flags the coordinator on the emulated hosts runs with: the
same config, the emulated hosts' addresses in place of the hosts'."""

from __future__ import annotations

import os
import sys

import msgspec
import pytest

from shardsink.cli import build_parser, main
from shardsink.cli.cluster import EMULATED_SET, _inner_flags, config_of
from shardsink.config import ClusterConfig, Placement


def _error(capsys, *argv: str) -> str:
    """``shardsink up ARGV``'s one line of error (exit 2)."""
    assert main(["up", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err, err
    return err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--hosts", "netns:0"], "invalid hosts 'netns:0': netns:N emulates N hosts, 1 to 253"),
        (["--hosts", "netns:"], "invalid hosts 'netns:'"),
        (["--consensus", "postgresql"], "it needs hosts netns:N"),
        (["--blob", "s3"], "it needs hosts netns:N"),
        (
            ["--hosts", "netns:3", "--place", "consensus=3"],
            "place consensus=3: hosts netns:3 are numbered 0 to 2",
        ),
        (
            ["--hosts", "netns:2", "--consensus", "tcp://127.0.0.1:7000"],
            "emulated hosts reach only each other and the file system",
        ),
        (
            ["--hosts", "netns:2", "--blob", "s3://b?endpoint=http://x:1&secret_key=hush"],
            "blob 's3://b?endpoint=http://x:1&secret_key=***' with hosts netns:2",
        ),
        (["--hosts", "netns:2", "--coordinator-bind", "tcp://127.0.0.1:0"], "the emulated hosts"),
    ],
)
def test_what_emulated_hosts_cannot_run_is_refused_in_one_line(capsys, tmp_path, argv, message):
    err = _error(capsys, "--data-dir", str(tmp_path / "d"), *argv)
    assert err.startswith("shardsink up: error: ") and message in err
    assert not (tmp_path / "d").exists()  # refused before anything was made


def test_a_bad_place_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as done:
        main(["up", "--hosts", "netns:3", "--place", "consensus=1,ray=2"])
    assert done.value.code == 2
    assert "invalid place 'ray=2': ROLE=HOST, ROLE one of coordinator, consensus" in (
        capsys.readouterr().err
    )


def test_place_from_a_file_and_flags(tmp_path):
    path = tmp_path / "up.toml"
    path.write_text('hosts = "netns:4"\nconsensus = "postgresql"\n[place]\nconsensus = 3\n')
    parsed = build_parser().parse_args(["up", "--config", str(path)])
    assert config_of(parsed).place == Placement(consensus=3)
    assert config_of(parsed).place.resolve(4) == Placement(
        coordinator=0, consensus=3, postgres=2, s3=2
    )
    flags = build_parser().parse_args(["up", "--config", str(path), "--place", "postgres=1"])
    assert config_of(flags).place == Placement(postgres=1)  # the flag replaces the table
    assert Placement().resolve(2) == Placement(coordinator=0, consensus=1, postgres=0, s3=0)


def test_not_root_says_so_in_one_line(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    err = _error(capsys, "--hosts", "netns:3", "--data-dir", str(tmp_path / "d"))
    assert err.startswith("shardsink up: error: cannot emulate hosts: emulated hosts need root")


def test_no_ray_says_so_in_one_line(capsys, monkeypatch, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the checks before Ray's need root")
    monkeypatch.setitem(sys.modules, "ray", None)  # find_spec: not installed
    err = _error(capsys, "--hosts", "netns:3", "--data-dir", str(tmp_path / "d"))
    assert err.endswith("cannot emulate hosts: Ray is not installed: pip install 'shardsink[ray]'")


def _inner(argv: list[str]) -> ClusterConfig:
    """The config the coordinator on the emulated hosts runs with, for
    ``up ARGV``: its flags, and the emulated hosts' (placeholders)."""
    args = build_parser().parse_args(["up", *argv])
    flags = _inner_flags(args, config_of(args))
    emulated = ["--hosts", "ray:10.77.0.1:6379", "--consensus", "tcp://10.77.0.2:7000"]
    return config_of(build_parser().parse_args(["up", *flags, *emulated]))


def _outside(config: ClusterConfig) -> dict:
    fields = msgspec.structs.asdict(config)
    return {k: v for k, v in fields.items() if k not in (*EMULATED_SET, "place")}


def test_the_coordinator_runs_the_config_given(tmp_path):
    argv = ["--hosts", "netns:3", "--groups", "3", "--mode", "barrier", "--no-verify"]
    argv += ["--shared-max-bytes", "auto", "--pace", "realtime", "--workload", "hydrate"]
    argv += ["--data-dir", str(tmp_path), "--place", "consensus=2", "--blob", "s3"]
    given = config_of(build_parser().parse_args(["up", *argv]))
    inner = _inner(argv)
    assert _outside(inner) == _outside(given) and inner.snapshot_rows == 100_000
    assert inner.hosts == "ray:10.77.0.1:6379" and inner.blob is None  # the blob: its environment


def test_a_file_and_flags_back_to_the_default_reach_the_coordinator(tmp_path):
    path = tmp_path / "up.toml"
    path.write_text('pace = "realtime"\ngroups = 5\n[workload]\nuse = "synth"\nkeys = 7\n')
    argv = ["--hosts", "netns:2", "--config", str(path), "--pace", "max"]
    inner = _inner(argv)
    assert (inner.pace, inner.groups) == ("max", 5)  # the flag over the file, as given
    assert (inner.workload, inner.workload_args) == ("synth", {"keys": 7})
