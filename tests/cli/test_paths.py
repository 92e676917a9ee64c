"""Every path a user gives is made absolute where it enters, once (issue 41:
``bench cluster --quick --out bq`` built ``file://bq/scratch/run-010/blob``,
a URI naming host ``bq``, and its plain-pyarrow baseline runs failed)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from shardsink.cli import PATHS, _absolute, build_parser, main
from shardsink.cli.bench import bench_cluster_config


def _actions(parser: argparse.ArgumentParser, name: str = ""):
    """Every option of ``parser`` and its subcommands, with the command's name."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, child in action.choices.items():
                yield from _actions(child, f"{name} {sub}".strip())
        elif action.option_strings:
            yield name, action


def test_every_flag_that_names_a_path_is_made_absolute():
    named = [
        (command, action.dest)
        for command, action in _actions(build_parser())
        if action.type is Path or action.metavar in ("D", "DIR", "FILE", "FILE.toml", "F")
        if not isinstance(action.type, argparse.FileType)  # opened as it is parsed
    ]
    assert len(named) > 20  # data dirs, outputs, configs, keys, ... of every command
    missing = [(c, d) for c, d in named if d not in PATHS]
    assert not missing, f"path flags not made absolute: {missing}"


def test_relative_paths_become_absolute_from_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(
        ["bench", "cluster", "--quick", "--out", "bq", "--config", "sub/../b.toml"]
    )
    _absolute(args)
    assert args.out == str(tmp_path / "bq")
    assert args.config == tmp_path / "sub" / ".." / "b.toml"  # links and .. left to the system
    args = build_parser().parse_args(["read", "--data-dir", "d", "--output", "/dev/stdout"])
    _absolute(args)
    assert (args.data_dir, args.output) == (tmp_path / "d", Path("/dev/stdout"))


@pytest.mark.parametrize("where", ["flag", "file"])
def test_bench_clusters_out_is_absolute_from_a_flag_or_its_file(tmp_path, monkeypatch, where):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "b.toml").write_text('out = "bq"\n')
    argv = ["bench", "cluster", "--quick"]
    argv += ["--out", "bq"] if where == "flag" else ["--config", "b.toml"]
    args = build_parser().parse_args(argv)
    _absolute(args)
    assert bench_cluster_config(args).out == str(tmp_path / "bq")


def test_the_logs_message_names_one_absolute_data_dir(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["logs", "--data-dir", "rel"]) == 1
    err = capsys.readouterr().err
    assert err == (
        f"shardsink logs: no logs kept in {tmp_path}/rel/logs: no cluster ran on data dir "
        f"{tmp_path}/rel\n"
    )
