"""Config files, sizes and the environment: ``up --config FILE.toml`` decodes
into the same ClusterConfig as the equivalent flags, flags given override it,
and an unknown key or a bad value is refused with its name; every field has
its flag, its name dashed, and an unknown flag or key is answered with the
nearest valid ones."""

from __future__ import annotations

import argparse
import typing

import msgspec
import pytest

from shardsink import __version__
from shardsink._units import MIB, format_size, parse_size
from shardsink.chaos.config import ChaosConfig
from shardsink.cli import build_parser, main
from shardsink.cli.cluster import config_of
from shardsink.config import ClusterConfig
from shardsink.options import flag_of
from shardsink.server.config import ServeConfig

FLAGS = [
    *("--groups", "1", "--workers", "3", "--mode", "barrier", "--shared-max-bytes", "2MiB"),
    *("--best-effort-linger-ms", "0", "--message-part-max-bytes", "0", "--workload", "churn"),
    *("--rows-per-interval", "50", "--intervals", "3", "--interval-ms", "200"),
    *("--pace", "realtime", "--shard", "s1", "--interval-timeout-s", "9.5"),
    *("--max-restarts", "4", "--start", "spawn", "--seed", "7", "--no-verify"),
    *("--start-timeout-s", "30", "--consensus-timeout-s", "2.5", "--append-retry-s", "60"),
]
TOML = """
groups = 1
workers = 3
mode = "barrier"
shared_max_bytes = "2MiB"
best_effort_linger_ms = 0
message_part_max_bytes = 0
workload = "churn"
rows_per_interval = 50
intervals = 3
interval_ms = 200
pace = "realtime"
shard = "s1"
interval_timeout_s = 9.5
max_restarts = 4
start = "spawn"
seed = 7
verify = false
start_timeout_s = 30.0
consensus_timeout_s = 2.5
append_retry_s = 60.0
"""


@pytest.fixture(autouse=True)
def no_environment(monkeypatch):
    for name in ("SHARDSINK_DATA_DIR", "SHARDSINK_STORE", "SHARDSINK_BLOB"):
        monkeypatch.delenv(name, raising=False)


def _config(*argv: str) -> ClusterConfig:
    return config_of(build_parser().parse_args(["up", *argv]))


@pytest.mark.parametrize(
    ("text", "n"),
    [
        *[("0", 0), ("4096", 4096), ("1MiB", MIB), ("64 KiB", 65536), ("1.5GiB", 3 << 29)],
        *[("10MB", 10_000_000), ("2kB", 2000), ("3k", 3072), ("12B", 12), ("1mib", MIB)],
    ],
)
def test_sizes_parse(text, n):
    assert parse_size(text) == n


@pytest.mark.parametrize(
    ("text", "message"),
    [
        *[("", "invalid size ''"), ("-1", "invalid size '-1'"), ("1XB", "invalid size '1XB'")],
        *[("MiB", "invalid size 'MiB'"), ("0.3B", "not a whole number of bytes")],
    ],
)
def test_bad_sizes_are_refused(text, message):
    with pytest.raises(ValueError, match=message):
        parse_size(text)


@pytest.mark.parametrize("n", [0, 100, 1024, 32768, MIB, 3 * MIB + 1, 128 * MIB, 1 << 30])
def test_format_size_reads_back(n):
    assert parse_size(format_size(n)) == n


def test_a_toml_file_is_the_same_config_as_the_flags(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(TOML)
    data = str(tmp_path / "d")
    from_flags = _config("--data-dir", data, *FLAGS)
    assert from_flags == _config("--data-dir", data, "--config", str(path))
    assert from_flags.shared_max_bytes == 2 * MIB and from_flags != ClusterConfig(data_dir=data)


def test_flags_given_override_the_file_and_the_file_overrides_defaults(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('groups = 3\nworkers = 2\nmode = "off"\n')
    config = _config("--config", str(path), "--workers", "5", "--no-verify")
    assert (config.groups, config.workers, config.mode, config.verify) == (3, 5, "off", False)
    assert config.intervals == ClusterConfig().intervals


def test_coalesce_is_a_flag_and_matters_in_sharing_modes_only():
    config = _config("--coalesce", "host", "--mode", "barrier")
    assert config.coalesce == "host" and config.host_builder
    assert not _config("--coalesce", "host", "--mode", "off").host_builder
    assert ClusterConfig().coalesce == "group" and not ClusterConfig().host_builder


def test_environment_between_flags_and_the_file(tmp_path, monkeypatch):
    path = tmp_path / "c.toml"
    path.write_text(f'data_dir = "{tmp_path / "file"}"\n')
    monkeypatch.setenv("SHARDSINK_DATA_DIR", str(tmp_path / "env"))
    assert _config().data_dir == str(tmp_path / "env")
    assert _config("--config", str(path)).data_dir == str(tmp_path / "env")
    assert _config("--data-dir", "x").data_dir == "x"
    monkeypatch.delenv("SHARDSINK_DATA_DIR")
    assert _config("--config", str(path)).data_dir == str(tmp_path / "file")


def test_hydrate_gets_its_snapshot_unless_told(tmp_path):
    assert _config("--workload", "hydrate").snapshot_rows == 100_000
    assert _config("--workload", "hydrate", "--snapshot-rows", "5").snapshot_rows == 5
    path = tmp_path / "c.toml"
    path.write_text('workload = "hydrate"\nsnapshot_rows = 0\n')
    assert _config("--config", str(path)).snapshot_rows == 0


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("grups = 2\n", "unknown key 'grups'"),
        ('groups = "two"\n', "Expected `int`, got `str` (key 'groups')"),
        ("groups = 0\n", "groups must be >= 1, got 0"),
        ('mode = "always"\n', "unknown mode 'always'; choose one of off, best-effort, barrier"),
        ('coalesce = "rack"\n', "unknown coalesce 'rack'; choose one of group, host"),
        ('shared_max_bytes = "lots"\n', "shared_max_bytes in "),
        ("groups = \n", "cannot read config file"),
    ],
)
def test_a_bad_file_is_refused_naming_the_key(tmp_path, capsys, toml, message):
    path = tmp_path / "c.toml"
    path.write_text(toml)
    assert main(["up", "--config", str(path), "--data-dir", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("shardsink up: error: ") and message in err, err
    assert str(path) in err
    assert "Traceback" not in err and not (tmp_path / "d").exists()


def test_a_missing_file_is_named(tmp_path, capsys):
    assert main(["up", "--config", str(tmp_path / "none.toml")]) == 2
    assert f"cannot read config file '{tmp_path / 'none.toml'}'" in capsys.readouterr().err


def test_the_threshold_may_tune_itself(tmp_path):
    assert _config("--shared-max-bytes", "auto").shared_max_bytes == "auto"
    path = tmp_path / "c.toml"
    path.write_text('shared_max_bytes = "auto"\n')
    assert _config("--config", str(path)).shared_max_bytes == "auto"
    with pytest.raises(ValueError, match="shared_max_bytes must be >= 0 or 'auto', got -1"):
        ClusterConfig(shared_max_bytes=-1)


def test_a_bad_size_flag_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["up", "--shared-max-bytes", "1XB"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--shared-max-bytes: invalid size '1XB'" in err and err.rstrip().endswith("or auto")


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"shardsink {__version__}"


def test_every_up_flag_shows_its_default():
    up = build_parser()._subparsers._group_actions[0].choices["up"]
    for action in up._actions:
        shown = action.help and action.help != argparse.SUPPRESS
        if shown and action.dest not in ("help", "config", "json", "verbose"):
            assert "default" in action.help, action.option_strings


def test_chaos_takes_a_toml_file_as_its_flags(tmp_path):
    from shardsink.cli.chaos import config_of as chaos_config

    path = tmp_path / "c.toml"
    path.write_text(
        'duration_s = 12.5\nseed = 3\ngroups = 1\nmode = "off"\nfaults = ["kill-worker", "pause"]\n'
        "mean_gap_s = 1.0\nreaders = 0\n"
    )
    flags = ["--duration-s", "12.5", "--seed", "3", "--groups", "1", "--mode", "off"]
    flags += ["--faults", "kill-worker,pause", "--mean-gap-s", "1", "--readers", "0"]
    from_flags = chaos_config(build_parser().parse_args(["chaos", *flags]))
    from_file = chaos_config(build_parser().parse_args(["chaos", "--config", str(path)]))
    assert from_flags == from_file and from_file.faults == ("kill-worker", "pause")
    again = chaos_config(build_parser().parse_args(["chaos", "--config", str(path), "--seed", "9"]))
    assert again.seed == 9 and again.duration_s == 12.5


def test_chaos_refuses_a_bad_key_by_name(tmp_path, capsys):
    path = tmp_path / "c.toml"
    path.write_text("duration = 5\n")
    assert main(["chaos", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"shardsink chaos: error: config file '{path}': unknown key 'duration'" in err


def _command(*path: str) -> argparse.ArgumentParser:
    parser = build_parser()
    for name in path:
        parser = parser._subparsers._group_actions[0].choices[name]
    return parser


@pytest.mark.parametrize(
    ("path", "kind"),
    [(("up",), ClusterConfig), (("chaos",), ChaosConfig), (("consensus", "serve"), ServeConfig)],
    ids=["up", "chaos", "consensus serve"],
)
def test_every_field_has_exactly_its_dashed_flag(path, kind):
    """The flag shown for a field is its name with dashes (``--x/--no-x`` for a
    switch), and no other shown option sets it; a table field (a dict, such as
    ``workload_args``) has none: only ``--config`` sets it."""
    shown = {}
    for action in _command(*path)._actions:
        if action.option_strings and action.help != argparse.SUPPRESS:
            shown.setdefault(action.dest, []).append(action.option_strings)
    for field in msgspec.structs.fields(kind):
        if typing.get_origin(field.type) is dict:
            assert field.name not in shown, field.name
            continue
        flag = flag_of(field.name)
        expected = [flag, "--no-" + flag[2:]] if field.type is bool else [flag]
        assert shown.get(field.name) == [expected], field.name


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("--linger-ms", "--best-effort-linger-ms"),
        ("--interval-timeout", "--interval-timeout-s"),
        ("--append-retry", "--append-retry-s"),
        ("--inline-max-bytes", "--message-part-max-bytes"),
    ],
)
def test_an_old_spelling_is_refused_naming_the_one_name(capsys, tmp_path, old, new):
    """One name per setting: a former flag, or its TOML key, is refused with the
    name the setting has now, in flags, TOML and keywords alike."""
    with pytest.raises(SystemExit) as exc:
        main(["up", old, "1"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert exc.value.code == 2 and f"error: {old} is now {new}:" in err, err
    assert old not in _command("up").format_help().replace(new, "")
    key, field = old[2:].replace("-", "_"), new[2:].replace("-", "_")
    path = tmp_path / "c.toml"
    path.write_text(f"{key} = 1\n")
    assert main(["up", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"unknown key '{key}'; it is '{field}' now" in err, err


@pytest.mark.parametrize(
    ("argv", "near"),
    [
        (["up", "--group", "2"], "did you mean --groups?"),
        (["up", "--linger", "2"], "--best-effort-linger-ms"),
        (["chaos", "--duraton-s", "2"], "did you mean --duration-s?"),
        (["consensus", "serve", "--bnd", "ipc:///x"], "did you mean --bind?"),
    ],
)
def test_an_unknown_flag_names_the_nearest(capsys, argv, near):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"shardsink {' '.join(argv[:-2])}: error: unrecognized arguments: ")
    assert near in err, err


def test_an_unknown_key_names_the_nearest(tmp_path, capsys):
    path = tmp_path / "c.toml"
    path.write_text("grups = 2\n")
    assert main(["up", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown key 'grups'; did you mean 'groups'?" in err, err
